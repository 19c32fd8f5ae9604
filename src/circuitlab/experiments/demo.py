"""The demo: watch induction heads form.

Trains a 2-layer attention-only model on the built-in stories mixed with tiled random segments,
and a 1-layer one for contrast; finds the induction heads and the previous-token head they build
on; writes checkpoints, metrics, results.json, figures and a report to the output directory.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from circuitlab.training import RunConfig, read_metrics, train
from circuitlab.training.configs import resolve_config
from circuitlab.training.tracking import head_scores, induction_batch


@dataclass
class DemoOptions:
    out: Path = Path("runs/demo")
    steps_2l: int | None = None   # default: from configs/demo.yaml
    steps_1l: int = 500
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
        description = base.description if layers == 2 else "1-layer attention-only model, the demo's contrast"
        cfg = RunConfig.from_dict({**base.to_dict(), "name": f"demo-{name}", "description": description,
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
    from circuitlab.report import write_demo_report

    write_demo_report(out, results, runs)  # out/report.html: interactive, self-contained
    return results


def analyse(runs: dict, out: Path) -> dict[str, Any]:
    """Label every head (behaviour + weight evidence), draw the figures, run the circuit analyses."""
    from circuitlab.analysis.heads import classify_heads
    from circuitlab.experiments.interpret_causal import EXPERIMENTS as CAUSAL
    from circuitlab.experiments.interpret_circuits import EXPERIMENTS
    from circuitlab.viz.training import plot_attention_heads, plot_training_curves

    results: dict[str, Any] = {"models": {}}
    curves = {name: read_metrics(r.out_dir) for name, r in runs.items()}
    for name, r in runs.items():
        model = r.model
        classes = classify_heads(model)
        _, _, repeat_loss = head_scores(model, induction_batch(r.tokenizer.vocab_size, 64, batch=32, seed=99))
        heads = []
        for layer in range(model.cfg.n_layers):
            for head in range(model.cfg.n_heads):
                heads.append({"head": f"L{layer}H{head}", "layer": layer, "index": head,
                              "induction_score": round(float(classes.scores["induction"][layer, head]), 4),
                              "prev_token_score": round(float(classes.scores["previous_token"][layer, head]), 4),
                              "copying_score": round(float(classes.copying.scores[layer, head]), 4),
                              "labels": classes.labels_of(layer, head)})
        induction = [lab for lab in classes.labels if lab.label == "induction"]
        results["models"][name] = {
            "n_layers": model.cfg.n_layers, "steps": r.steps, "tokens_seen": r.tokens_seen,
            "final_train_loss": round(r.final_loss, 4), "best_val_loss": round(r.best_val_loss, 4),
            "repeat_loss": round(repeat_loss, 4), "heads": heads,
            "induction_heads": [lab.name for lab in induction],
            "induction_evidence": [str(lab) for lab in induction],
            "rejected": [str(lab) for lab in classes.rejected],
            "previous_token_heads": [f"L{l}H{h}" for l, h in classes.heads_with("previous-token")],
            "phase_change": phase_change(curves[name]), "train_seconds": round(r.seconds, 1),
        }
    figures = {"training_curves": "training_curves.png"}
    plot_training_curves(curves, out / figures["training_curves"])
    results["analysis"] = {}
    two = runs.get("2l")
    if two is not None:
        found = results["models"]["2l"]
        show = found["previous_token_heads"][:1] + found["induction_heads"][:3]
        if show:
            gen = torch.Generator().manual_seed(7)
            segment = torch.randint(0, two.tokenizer.vocab_size, (12,), generator=gen)
            plot_attention_heads(two.model, segment.repeat(3), show, out / "induction_patterns.png")
            figures["attention_patterns"] = "induction_patterns.png"
        # QK/OV circuits of the induction head, K-composition, copying; a logit lens on a story.
        # Causal tests of the same circuit: patching and path patching on induction prompts (clean:
        # r + r[:k]; corrupt: the earlier copy of the last token replaced), mean-ablation of heads.
        experiments = [(name, EXPERIMENTS[name]) for name in ("circuits", "logit_lens")]
        experiments += [("patching", CAUSAL["patching"]),
                        ("ablation", partial(CAUSAL["ablation"], group=found["induction_heads"] or None))]
        for experiment, run in experiments:
            found_exp = run(two.model, two.tokenizer, out, None)
            results["analysis"][experiment] = found_exp
            for fig in found_exp.get("figures", []):
                figures[f"{experiment}: {fig}"] = fig
        results["causal_evidence"] = causal_evidence(found, results["analysis"])
    results["figures"] = figures
    return results


def causal_evidence(found: dict[str, Any], analysis: dict[str, Any]) -> dict[str, Any]:
    """What the interventions say about the circuit the labels name: each labelled head's patching
    recovery, the paths from the previous-token head into the receiver's q, k and v, the ablation."""
    evidence: dict[str, Any] = {}
    patching = analysis.get("patching", {})
    head_out = patching.get("patching", {}).get("head_out")
    if head_out and head_out["clean_value"] != head_out["corrupt_value"]:
        gap = head_out["clean_value"] - head_out["corrupt_value"]
        values = head_out["values"]
        evidence["patching_recovery"] = {
            name: round((values[layer][head] - head_out["corrupt_value"]) / gap, 4)
            for name in found["induction_heads"] + found["previous_token_heads"]
            for layer, head in [_layer_head(name)]}
    paths = patching.get("path_patching")
    if paths and found["previous_token_heads"]:
        layer, head = _layer_head(found["previous_token_heads"][0])
        by_input = {}
        for inp, p in paths.items():
            gap = p["clean_value"] - p["corrupt_value"]
            if gap:
                by_input[inp] = round((p["clean_value"] - p["values"][layer][head]) / gap, 4)
        receiver = next(iter(paths.values()))["receiver"]
        evidence["path_patching"] = {"sender": found["previous_token_heads"][0], "receiver": receiver,
                                     "fraction_of_gap": by_input,
                                     "other_induction_heads": [h for h in found["induction_heads"] if h != receiver]}
    group = analysis.get("ablation", {}).get("group")
    if group:
        evidence["ablation"] = group
    return evidence


def _layer_head(name: str) -> tuple[int, int]:
    layer, head = name[1:].split("H")
    return int(layer), int(head)


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
            lines += [f"**Induction heads:** {', '.join(two['induction_heads'])}; "
                      f"**previous-token heads:** {', '.join(two['previous_token_heads']) or 'none'}. "
                      "Each induction label needs behaviour and weights to agree:", ""]
            lines += [f"- {e}" for e in two["induction_evidence"]] + [""]
        else:
            lines += ["**No induction head** was found in the 2-layer model.", ""]
        if two["rejected"]:
            lines += ["Heads that attend like induction heads but lack the weight evidence:", ""]
            lines += [f"- {e}" for e in two["rejected"]] + [""]
    if one:
        best = max((h["induction_score"] for h in one["heads"]), default=0.0)
        lines += [f"**Contrast.** The 1-layer model ({one['steps']} steps) has "
                  f"{'no induction head' if not one['induction_heads'] else 'induction heads ' + ', '.join(one['induction_heads'])}"
                  f" (best induction score {best:.2f}); its loss on repeated random tokens stays at "
                  f"{one['repeat_loss']:.2f} against {two['repeat_loss']:.2f} for the 2-layer model. "
                  "One layer cannot compose a previous-token head with a copying head.", ""]
    lines += causal_paragraph(results.get("causal_evidence", {}))
    for experiment, found in results.get("analysis", {}).items():
        lines += [f"## {experiment.replace('_', ' ').capitalize()}", ""]
        lines += [f"- {line}" for line in found.get("summary", [])] + [""]
    lines += ["## Heads", "", "| model | head | induction | previous-token | copying | labels |",
              "|---|---|---|---|---|---|"]
    for name, m in results["models"].items():
        for h in m["heads"]:
            lines.append(f"| {name} | {h['head']} | {h['induction_score']:.3f} | {h['prev_token_score']:.3f} | "
                         f"{h['copying_score']:.2f} | {', '.join(h['labels']) or '-'} |")
    lines += ["", "## Figures", ""]
    for title, fname in results["figures"].items():
        lines.append(f"![{title}]({fname})")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def causal_paragraph(evidence: dict[str, Any]) -> list[str]:
    """The interventions in words; every number comes from `causal_evidence`."""
    if not evidence:
        return []
    lines = ["**Causal evidence.** On random sequences r + r[:k] whose earlier copy of the last token is "
             "replaced in the corrupted run (metric: log-prob of the induction answer):", ""]
    recovery = evidence.get("patching_recovery", {})
    if recovery:
        lines.append("- patching each head's clean output into the corrupted run recovers "
                     + ", ".join(f"{h} {v:.0%}" for h, v in recovery.items()) + " of the gap;")
    paths = evidence.get("path_patching")
    if paths and paths["fraction_of_gap"]:
        fractions = paths["fraction_of_gap"]
        strongest = max(fractions, key=lambda k: fractions[k])
        lines.append(f"- path patching from {paths['sender']} into {paths['receiver']}: the corrupted path through "
                     + ", ".join(f"its {k.upper()} input removes {v:.0%}" for k, v in fractions.items())
                     + f" of the gap, so the two compose mostly through {strongest.upper()}"
                     + (" (K-composition)" if strongest == "k" else "")
                     + (f"; one path carries only part of the gap because {', '.join(paths['other_induction_heads'])}"
                        " still read the clean one;" if paths.get("other_induction_heads") else ";"))
    group = evidence.get("ablation")
    if group:
        (rep_before, rep_after), (first_before, first_after) = group["repeated_loss"], group["first_half_loss"]
        lines.append(f"- mean-ablating {', '.join(group['heads'])} together raises the loss on the repeated half of "
                     f"random sequences from {rep_before:.2f} to {rep_after:.2f} nats, while the loss on the "
                     f"first half (which nothing earlier predicts) goes from {first_before:.2f} to {first_after:.2f}.")
    return lines + [""]
