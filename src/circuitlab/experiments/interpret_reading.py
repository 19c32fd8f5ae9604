"""Ready-made experiments for `circuitlab interpret` and the demo report that read the model itself: its QK/OV
circuits and its heads (the other interpret experiments are methods: circuitlab/methods/).

EXPERIMENTS maps a name to fn(model, tokenizer, out_dir, prompt) -> ExperimentResult. Each runs its
analysis on sensible defaults, writes PNG figures into out_dir and returns its findings: summary
(readable lines), figures (file names in out_dir) and data (JSON-able numbers). The tokenizer needs encode(str) -> list[int]
and decode(list[int]) -> str.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from circuitlab.analysis.qk_ov import (copying_scores, direct_path, k_composition_qk_circuit, ov_circuit, pos_qk_circuit,
                                          top_token_pairs)
from circuitlab.analysis.folding import weights_model
from circuitlab.analysis.heads.detectors import induction_by_period, induction_test_tokens
from circuitlab.analysis.heads import classify_heads
from circuitlab.analysis.heads.induction import in_context_learning_score
from circuitlab.analysis.heads.induction_circuit import induction_and_previous_head
from circuitlab.model import model_device
from circuitlab.experiments.result import ExperimentResult
from circuitlab.methods.base import prompt_tokens  # noqa: F401 (the prompt every prompted experiment encodes)
from circuitlab.names import head_name

SEED = 0


def _head_tokens(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED)
    return induction_test_tokens(16, min(model.cfg.n_ctx, 64), model.cfg.d_vocab, gen)


def _name(head: tuple[int, int]) -> str:
    return head_name(*head)


# ---------------------------------------------------------------------------- circuits


@torch.no_grad()
def run_circuits(model, tokenizer, out_dir: Path, prompt: str | None) -> ExperimentResult:
    """The direct path, copying and composition scores, the induction head's QK (through the
    previous-token head) and OV circuits on the prompt's tokens, the previous-token head's positional
    QK circuit. Norms are folded into the weights first."""
    from circuitlab.viz.qk_ov import composition_figure, copying_scores_figure, qk_ov_figure

    out_dir = Path(out_dir)
    wm = weights_model(model)
    if tokenizer is None:  # weights only: the heatmaps show the first token ids, labelled by id
        ids = list(range(min(24, model.cfg.d_vocab)))
        strs = [f"<{i}>" for i in ids]
    else:
        ids = list(dict.fromkeys(prompt_tokens(model, tokenizer, prompt).tolist()))[:24]  # tokens for heatmaps
        strs = [tokenizer.decode([i]) for i in ids]
    bigrams = direct_path(wm)
    figures = [qk_ov_figure(bigrams.submatrix(ids, ids), strs, strs, "direct path W_E W_U", "output logit",
                              "input token", "logit").save_png(out_dir / "direct_path.png").name]
    top_bigrams = top_token_pairs(bigrams, k=10, tokenizer=tokenizer)
    found: dict[str, Any] = {"folded_norms": model.cfg.norm != "none",
                             "direct_path_top_pairs": top_bigrams.to_dict()["pairs"]}
    summary = []
    if model.cfg.n_layers > 0:
        # The labels' weight evidence is these circuits' scores: compute them once, in classify_heads.
        classes = classify_heads(model, _head_tokens(model).to(model_device(model)))
        # None where heads are not additive: then the scores' own analysis refuses the model (NEEDS below)
        copying = classes.copying if classes.copying is not None else copying_scores(wm)
        figures.append(copying_scores_figure(copying.scores).save_png(out_dir / "copying_scores.png").name)
        found["copying"] = copying.to_dict()
        summary.append(f"copying heads (score >= {copying.threshold}): "
                       f"{', '.join(_name(h) for h in copying.copying_heads()) or 'none'}")
    else:
        summary.append("a 0-layer model: its logits are the direct path (bigram table) alone")
    if model.cfg.n_layers > 1:
        comp = classes.composition
        found["composition"] = comp.to_dict()
        figures.append(composition_figure({m: getattr(comp, m) for m in ("q", "k", "v")}, comp.baseline_mean,
                                          comp.baseline_std).save_png(out_dir / "composition_scores.png").name)
        for mode in ("k", "q", "v"):
            best = comp.top(mode, 1)
            if best:
                w, r, s = best[0]
                summary.append(f"strongest {mode.upper()}-composition: {_name(w)} -> {_name(r)} {s:.3f} "
                               f"(random baseline {comp.baseline_mean:.3f} ± {comp.baseline_std:.3f})")
        head, prev = induction_and_previous_head(classes)
        labelled = head in classes.heads_with("induction")
        qk = k_composition_qk_circuit(wm, head, prev)
        ov = ov_circuit(wm, head[0])[head[1]]
        figures.append(qk_ov_figure(qk.submatrix(ids, ids), strs, strs,
                                      f"{_name(head)} QK via {_name(prev)}: query token vs token before the key",
                                      "token before the key").save_png(out_dir / "induction_qk.png").name)
        figures.append(qk_ov_figure(ov.submatrix(ids, ids), strs, strs, f"{_name(head)} full OV circuit",
                                      "output logit", "attended token", "logit"
                                      ).save_png(out_dir / "induction_ov.png").name)
        if model.cfg.positional == "learned":
            n = min(24, model.cfg.n_ctx)
            pos_qk = pos_qk_circuit(wm, prev[0])[prev[1]].submatrix(list(range(n)), list(range(n)))
            figures.append(qk_ov_figure(pos_qk, title=f"{_name(prev)} positional QK", x_title="key position",
                                          y_title="query position").save_png(out_dir / "prev_token_pos_qk.png").name)
        found["induction"] = {
            "head": _name(head), "labelled": labelled, "prev_token_head": _name(prev),
            "k_composition": round(float(comp.k[prev[0], prev[1], head[0], head[1]]), 6),
            "copying_score": round(float(copying.scores[head]), 6),
            "ov_top_pairs": top_token_pairs(ov, k=10, tokenizer=tokenizer).to_dict()["pairs"],
            "qk_top_pairs": top_token_pairs(qk, k=10, tokenizer=tokenizer).to_dict()["pairs"],
        }
        what = "induction head" if labelled else "best induction candidate (not confirmed)"
        ind = found["induction"]
        summary.append(f"{what} {_name(head)}: K-composition with {_name(prev)} {ind['k_composition']:.3f}, "
                       f"copying score {ind['copying_score']:.3f}")
    return ExperimentResult("circuits", summary, figures, found)


# ---------------------------------------------------------------------------- heads


@torch.no_grad()
def run_heads(model, tokenizer, out_dir: Path, prompt: str | None) -> ExperimentResult:
    """Detectors and labels on tiled random tokens, attention patterns of the labelled heads,
    and the in-context-learning score on the same sequences."""
    from circuitlab.analysis.heads import attention_view
    from circuitlab.viz.heads import attention_patterns_figure, head_scores_figure

    if model.cfg.n_layers == 0:
        return ExperimentResult("heads", ["a 0-layer model has no attention heads"])
    out_dir = Path(out_dir)
    tokens = _head_tokens(model).to(model_device(model))
    classes = classify_heads(model, tokens)
    figures = [head_scores_figure(classes.scores.scores, classes=classes).save_png(out_dir / "head_scores.png").name]
    shown = list(dict.fromkeys(classes.heads_with("previous-token")[:2] + classes.heads_with("induction")[:2]))
    if shown:
        view = attention_view(model, tokens[:1], tokenizer, classes)
        figures.append(attention_patterns_figure(view, "Attention on a random segment tiled to fill the sequence",
                                                 heads=[_name(h) for h in shown]
                                                 ).save_png(out_dir / "head_patterns.png").name)
    icl = in_context_learning_score(model, tokens)
    eos = getattr(tokenizer, "eos_id", None)
    sweep = (induction_by_period(model, exclude=[] if eos is None else [eos], progress=True)
             if model.cfg.n_ctx >= 8 else None)
    if sweep is not None:
        from circuitlab.viz.training import induction_by_period_figure

        figures.append(induction_by_period_figure({"model": sweep.to_dict()}
                                                  ).save_png(out_dir / "induction_by_period.png").name)
    summary = [str(label) for label in classes.labels if label.label not in ("low-entropy", "diffuse")]
    summary += [f"not assigned: {label}" for label in classes.rejected]
    if classes.weights_unread:
        summary.append(f"weight checks left out (copying score, K-composition): {classes.weights_unread}")
    summary.append(f"in-context learning score on tiled random tokens: {icl.score:.3f} nats "
                   f"(loss at position {icl.late_pos} minus at {icl.early_pos})")
    if sweep is not None:
        worst = int(sweep.best.argmin())
        summary.append(f"induction test [r, r] at periods {sweep.periods[0]}-{sweep.periods[-1]}: best head's score "
                       f"{float(sweep.best.min()):.2f} at worst (period {sweep.periods[worst]}), loss on the second copy "
                       f"at most {float(sweep.loss_second.max()):.2f} nats (first copy {float(sweep.loss_first.mean()):.2f})")
    found = classes.to_dict()
    found.update(induction_by_period=sweep.to_dict() if sweep is not None else None,
                 tables={"Induction test [r, r] by period": sweep.table()} if sweep is not None else {})
    found.update(icl=icl.to_dict(), labels_by_head={_name((l, h)): classes.labels_of(l, h)
                                                    for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)})
    return ExperimentResult("heads", summary, figures, found)


# The analyses that read only the weights and token ids (no text): they run on a model without a tokenizer.
NO_TEXT = ("circuits", "heads")

# What an experiment assumes of the architecture (model.assumptions names), beyond what every analysis holds:
# interpret skips it, with a warning, on a model that breaks one (asked for by name: refused in one line).
NEEDS: dict[str, tuple[str, ...]] = {"circuits": ("additive_heads",)}

EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "circuits": run_circuits,
    "heads": run_heads,
}
