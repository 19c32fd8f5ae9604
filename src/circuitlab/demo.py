"""The demo: watch induction heads form.

Trains a 2-layer attention-only model on the built-in stories mixed with tiled random segments,
and a 1-layer one for contrast; finds the induction heads and the previous-token head they build
on; writes checkpoints, metrics, results.json, figures and a report to the output directory.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitlab.training import RunConfig, read_metrics, train
from circuitlab.training.configs import resolve_config
from circuitlab.training.tracking import head_scores, induction_batch

INDUCTION_THRESHOLD = 0.3  # mean attention to the induction target; chance is ~1/position
PREV_TOKEN_THRESHOLD = 0.3


@dataclass
class DemoOptions:
    out: Path = Path("runs/demo")
    steps_2l: int | None = None   # default: from configs/demo.yaml
    steps_1l: int = 600
    progress: bool = True


def run_demo(opts: DemoOptions) -> dict[str, Any]:
    out = opts.out
    if out.exists() and any(out.iterdir()):
        kept = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        out.rename(kept)  # never overwrite an earlier demo
        print(f"moved the previous demo to {kept}")
    out.mkdir(parents=True, exist_ok=True)
    base = RunConfig.load(resolve_config("demo"))
    t0 = time.time()
    runs = {}
    for name, layers, steps in (("2l", 2, opts.steps_2l or base.train.steps), ("1l", 1, opts.steps_1l)):
        cfg = RunConfig.from_dict({**base.to_dict(), "name": f"demo-{name}",
                                   "model": {**base.model, "preset": f"attn-only-{layers}l"}})
        cfg.train.steps = steps
        cfg.train.ckpt_every = steps
        print(f"training the {layers}-layer attention-only model for {steps} steps")
        runs[name] = train(cfg, out / name, progress=opts.progress)
    train_seconds = time.time() - t0
    results = analyse(runs, out)
    results["wall_seconds"] = {"training": round(train_seconds, 1), "total": round(time.time() - t0, 1)}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    write_report(results, out)
    return results


def analyse(runs: dict, out: Path) -> dict[str, Any]:
    from circuitlab.viz.training import plot_attention_heads, plot_training_curves

    results: dict[str, Any] = {"models": {}}
    curves = {name: read_metrics(r.out_dir) for name, r in runs.items()}
    for name, r in runs.items():
        model = r.model
        rep = induction_batch(r.tokenizer.vocab_size, 40, batch=32, seed=99)
        induction, prev, repeat_loss = head_scores(model, rep)
        heads = []
        for layer in range(model.cfg.n_layers):
            for head in range(model.cfg.n_heads):
                labels = []
                if prev[layer, head] > PREV_TOKEN_THRESHOLD:
                    labels.append("previous-token")
                if induction[layer, head] > INDUCTION_THRESHOLD:
                    labels.append("induction")
                heads.append({"head": f"{layer}.{head}", "layer": layer, "index": head,
                              "induction_score": round(float(induction[layer, head]), 4),
                              "prev_token_score": round(float(prev[layer, head]), 4), "labels": labels})
        induction_heads = [h["head"] for h in heads if "induction" in h["labels"]]
        # An induction head needs a previous-token head in an earlier layer to compose with (K-composition).
        first_induction_layer = min((h["layer"] for h in heads if "induction" in h["labels"]), default=None)
        prev_heads = [h["head"] for h in heads if "previous-token" in h["labels"]
                      and first_induction_layer is not None and h["layer"] < first_induction_layer]
        results["models"][name] = {
            "n_layers": model.cfg.n_layers, "steps": r.steps, "tokens_seen": r.tokens_seen,
            "final_train_loss": round(r.final_loss, 4), "best_val_loss": round(r.best_val_loss, 4),
            "repeat_loss": round(repeat_loss, 4), "heads": heads, "induction_heads": induction_heads,
            "previous_token_heads": prev_heads, "phase_change": phase_change(curves[name]),
            "train_seconds": round(r.seconds, 1),
        }
    figures = {"training_curves": "training_curves.png"}
    plot_training_curves(curves, out / figures["training_curves"])
    two = runs.get("2l")
    if two is not None:
        found = results["models"]["2l"]
        show = found["previous_token_heads"][:1] + found["induction_heads"][:3]
        if show:
            rep = induction_batch(two.tokenizer.vocab_size, 20, batch=1, seed=7)
            plot_attention_heads(two.model, rep[0], show, out / "induction_patterns.png")
            figures["attention_patterns"] = "induction_patterns.png"
    results["figures"] = figures
    results["thresholds"] = {"induction": INDUCTION_THRESHOLD, "previous_token": PREV_TOKEN_THRESHOLD}
    return results


def phase_change(records: list[dict]) -> dict[str, Any] | None:
    """Where the best head's induction score first passes halfway from its start to its end value."""
    tracked = [r for r in records if "induction" in r]
    if len(tracked) < 3:
        return None
    scores = [max((s for layer in r["induction"] for s in layer), default=0.0) for r in tracked]
    start, end = scores[0], scores[-1]
    if end - start < 0.2:
        return None
    half = start + (end - start) / 2
    at = next(i for i, s in enumerate(scores) if s >= half)
    return {"step": tracked[at]["step"], "tokens": tracked[at]["tokens"],
            "induction_before": round(scores[max(0, at - 2)], 3), "induction_after": round(scores[-1], 3),
            "repeat_loss_before": tracked[max(0, at - 2)].get("repeat_loss"),
            "repeat_loss_after": tracked[-1].get("repeat_loss")}


def write_report(results: dict[str, Any], out: Path) -> Path:
    """A short report in words (Markdown) of what training found."""
    two, one = results["models"].get("2l"), results["models"].get("1l")
    lines = ["# circuitlab demo: induction heads", ""]
    if two:
        lines += [f"A 2-layer attention-only transformer trained for {two['steps']} steps "
                  f"({two['tokens_seen']:,} tokens) on the built-in stories mixed with repeated random "
                  f"segments reached a validation loss of {two['best_val_loss']:.3f}.", ""]
        pc = two["phase_change"]
        if pc:
            lines += [f"**Phase change.** Around step {pc['step']} ({pc['tokens']:,} tokens) the induction score "
                      f"of the best head jumped to {pc['induction_after']:.2f} (from {pc['induction_before']:.2f}), "
                      f"while the loss on the repeated half of random sequences fell from "
                      f"{pc['repeat_loss_before']:.2f} to {pc['repeat_loss_after']:.2f}.", ""]
        else:
            lines += ["**No clear phase change** was seen in the induction score during training.", ""]
        if two["induction_heads"]:
            lines += [f"**Induction heads:** {', '.join(two['induction_heads'])} "
                      f"(induction score > {results['thresholds']['induction']}).",
                      f"**Previous-token heads they can build on:** "
                      f"{', '.join(two['previous_token_heads']) or 'none found'}.", ""]
        else:
            lines += ["**No induction head** passed the threshold in the 2-layer model.", ""]
    if one:
        best = max((h["induction_score"] for h in one["heads"]), default=0.0)
        lines += [f"**Contrast.** The 1-layer model ({one['steps']} steps) has "
                  f"{'no induction head' if not one['induction_heads'] else 'induction heads ' + ', '.join(one['induction_heads'])}"
                  f" (best induction score {best:.2f}); its loss on repeated random tokens stays at "
                  f"{one['repeat_loss']:.2f} against {two['repeat_loss']:.2f} for the 2-layer model. "
                  "One layer cannot compose a previous-token head with a copying head.", ""]
    lines += ["## Heads", "", "| model | head | induction | previous-token | labels |", "|---|---|---|---|---|"]
    for name, m in results["models"].items():
        for h in m["heads"]:
            lines.append(f"| {name} | {h['head']} | {h['induction_score']:.3f} | {h['prev_token_score']:.3f} | "
                         f"{', '.join(h['labels']) or '-'} |")
    lines += ["", "## Figures", ""]
    for title, fname in results["figures"].items():
        lines.append(f"![{title}]({fname})")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
