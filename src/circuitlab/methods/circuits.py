"""QK / OV circuits as a method (`interpret --experiments circuits`; the analyses: analysis/qk_ov.py, folding.py):
the direct path, copying and composition scores (norms folded first), the induction head's QK circuit through its
previous-token head and its OV circuit on the prompt's tokens, the previous-token head's positional QK circuit; its
typed result. Its report section is drawn by the report from the run's model (report/sections.py: circuits_section,
which takes the head pair from this result); the views: viz/qk_ov.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.folding import weights_model
from circuitlab.analysis.heads import classify_heads
from circuitlab.analysis.heads.induction_circuit import induction_and_previous_head
from circuitlab.analysis.qk_ov import (CompositionScores, CopyingScores, copying_scores, direct_path,
                                      k_composition_qk_circuit, ov_circuit, pos_qk_circuit, top_token_pairs)
from circuitlab.methods.base import Method, MethodResult, NoOptions, check_prompt, prompt_tokens
from circuitlab.methods.heads import head_test_tokens
from circuitlab.model import model_device
from circuitlab.names import head_name
from circuitlab.spec import Result

if TYPE_CHECKING:
    import circuitlab.memory as memory
    from circuitlab.model import Transformer


@dataclass
class InductionPair(Result):
    """The induction head (labelled: confirmed by classify_heads, else the best candidate), its previous-token
    head, their K-composition and the head's copying score, the top OV and QK token pairs (TokenPairs "pairs")."""

    head: str
    labelled: bool
    prev_token_head: str
    k_composition: float
    copying_score: float
    ov_top_pairs: list[dict[str, Any]]
    qk_top_pairs: list[dict[str, Any]]


@dataclass
class CircuitsFindings(MethodResult):
    """folded_norms; direct_path_top_pairs: the bigram table's strongest pairs; copying: CopyingScores;
    composition: CompositionScores; induction: the induction head, its previous-token head, their
    K-composition and copying score, the top QK and OV token pairs (models of two layers or more)."""

    name = "circuits"
    folded_norms: bool
    direct_path_top_pairs: list[Any]
    copying: CopyingScores | None = None
    composition: CompositionScores | None = None
    induction: InductionPair | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CircuitsFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), bool(d.get("folded_norms")),
                   list(d.get("direct_path_top_pairs") or []),
                   CopyingScores.from_dict(d["copying"]) if d.get("copying") else None,
                   CompositionScores.from_dict(d["composition"]) if d.get("composition") else None,
                   InductionPair.from_dict(d["induction"]) if d.get("induction") else None)


@torch.no_grad()
def run_circuits(model: "Transformer", tokenizer: Any, out_dir: Path, options: NoOptions,
                 prompt: str | None = None) -> CircuitsFindings:
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
    found = CircuitsFindings([], figures, model.cfg.norm != "none", top_bigrams.to_dict()["pairs"])
    summary = found.summary
    if model.cfg.n_layers > 0:
        # The labels' weight evidence is these circuits' scores: compute them once, in classify_heads.
        classes = classify_heads(model, head_test_tokens(model).to(model_device(model)))
        # None where heads are not additive: then the scores' own analysis refuses the model (needs= below)
        copying = classes.copying if classes.copying is not None else copying_scores(wm)
        figures.append(copying_scores_figure(copying.scores).save_png(out_dir / "copying_scores.png").name)
        found.copying = copying
        summary.append(f"copying heads (score >= {copying.threshold}): "
                       f"{', '.join(head_name(*h) for h in copying.copying_heads()) or 'none'}")
    else:
        summary.append("a 0-layer model: its logits are the direct path (bigram table) alone")
    if model.cfg.n_layers > 1:
        comp = classes.composition
        assert comp is not None   # heads are additive here (needs=)
        found.composition = comp
        figures.append(composition_figure({m: getattr(comp, m) for m in ("q", "k", "v")}, comp.baseline_mean,
                                          comp.baseline_std).save_png(out_dir / "composition_scores.png").name)
        for mode in ("k", "q", "v"):
            best = comp.top(mode, 1)
            if best:
                w, r, s = best[0]
                summary.append(f"strongest {mode.upper()}-composition: {head_name(*w)} -> {head_name(*r)} {s:.3f} "
                               f"(random baseline {comp.baseline_mean:.3f} ± {comp.baseline_std:.3f})")
        head, prev = induction_and_previous_head(classes)
        labelled = head in classes.heads_with("induction")
        qk = k_composition_qk_circuit(wm, head, prev)
        ov = ov_circuit(wm, head[0])[head[1]]
        figures.append(qk_ov_figure(qk.submatrix(ids, ids), strs, strs,
                                      f"{head_name(*head)} QK via {head_name(*prev)}: query token vs token before the key",
                                      "token before the key").save_png(out_dir / "induction_qk.png").name)
        figures.append(qk_ov_figure(ov.submatrix(ids, ids), strs, strs, f"{head_name(*head)} full OV circuit",
                                      "output logit", "attended token", "logit"
                                      ).save_png(out_dir / "induction_ov.png").name)
        if model.cfg.positional == "learned":
            n = min(24, model.cfg.n_ctx)
            pos_qk = pos_qk_circuit(wm, prev[0])[prev[1]].submatrix(list(range(n)), list(range(n)))
            figures.append(qk_ov_figure(pos_qk, title=f"{head_name(*prev)} positional QK", x_title="key position",
                                          y_title="query position").save_png(out_dir / "prev_token_pos_qk.png").name)
        ind = found.induction = InductionPair(
            head_name(*head), labelled, head_name(*prev), round(float(comp.k[prev[0], prev[1], head[0], head[1]]), 6),
            round(float(copying.scores[head]), 6), top_token_pairs(ov, k=10, tokenizer=tokenizer).to_dict()["pairs"],
            top_token_pairs(qk, k=10, tokenizer=tokenizer).to_dict()["pairs"])
        what = "induction head" if labelled else "best induction candidate (not confirmed)"
        summary.append(f"{what} {head_name(*head)}: K-composition with {head_name(*prev)} {ind.k_composition:.3f}, "
                       f"copying score {ind.copying_score:.3f}")
    return found


TOP_PAIRS_EFFICIENCY = 0.6   # top_token_pairs: chunked products, then a comparison pass (SmolLM2: 3.4 TFLOP)


def estimate_circuits(model: "Transformer", tokenizer: Any, options: NoOptions, **_: Any) -> "memory.Estimate":
    """The folded weights, the direct path's top pairs (all d_vocab² entries of W_E W_U, in row chunks), the labels
    (methods.heads.labels_estimate), and the induction head's QK and OV top pairs (d_vocab² entries, inner d_head)."""
    import circuitlab.memory as memory
    from circuitlab.methods.base import figures_estimate
    from circuitlab.methods.heads import fold_estimate, labels_estimate

    cfg, held = model.cfg, memory.tensor_bytes(model)
    V = cfg.d_vocab
    chunk = {"a chunk of the direct path's rows": 1024 * V * next(model.parameters()).element_size()}
    parts = [fold_estimate(model),
             memory.Estimate("direct path", chunk, held=held, flops=2.0 * V * V * cfg.d_model,
                             efficiency=TOP_PAIRS_EFFICIENCY)]
    if cfg.n_layers > 0:
        parts += labels_estimate(model, [])
    if cfg.n_layers > 1:
        parts.append(memory.Estimate("QK and OV top pairs", chunk, held=held, flops=2 * 2.0 * V * V * cfg.head_dim,
                                     efficiency=TOP_PAIRS_EFFICIENCY))
    n_figures = 1 + (cfg.n_layers > 0) + 3 * (cfg.n_layers > 1) + (cfg.n_layers > 1 and cfg.positional == "learned")
    parts.append(figures_estimate(model, n_figures))
    return memory.Estimate.one_after_another(f"circuits (direct path and OV / QK top pairs over {V}² token pairs, "
                                             "copying and composition scores)", parts)


METHOD = Method("circuits", NoOptions, CircuitsFindings, run_circuits, None, needs=("additive_heads",),
                check=check_prompt, needs_text=False, estimate=estimate_circuits)
