"""The heads as a method (`interpret --experiments heads`; the analyses: analysis/heads/): detectors and labels on
tiled random tokens (behaviour and weight evidence), the labelled heads' attention patterns, the in-context
learning score and the induction test at every period; its typed result. Its report sections (the heads table,
induction by period) are drawn by the report from the run (report/sections.py), which reads this result; the views:
viz/heads.py, viz/training.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.heads import HeadClasses, classify_heads
from circuitlab.analysis.heads.detectors import induction_by_period, induction_test_tokens
from circuitlab.analysis.heads.induction import in_context_learning_score
import circuitlab.memory as memory
from circuitlab.checks import Number
from circuitlab.errors import InputError
from circuitlab.methods.base import Method, MethodResult
from circuitlab.model import model_device
from circuitlab.names import head_name
from circuitlab.spec import Options, option

if TYPE_CHECKING:
    from circuitlab.model import Transformer

SEED = 0
SWEEP_PERIODS, LONGEST_PERIOD = (4, 16, 64), 128   # the default sweep: short, middle, long, and the longest


def sweep_periods(n_ctx: int) -> list[int]:
    """The default periods of the heads experiment's induction sweep: 4, 16 and 64 where they fit, and the longest
    [r, r] the context holds up to 128 tokens (a 64-token context: 4, 16, 32; SmolLM2's 8192: 4, 16, 64, 128).
    Bounded so that a long context does not cost minutes: every [r, r] is a forward pass over 16 x 2 p tokens."""
    longest = min(n_ctx // 2, LONGEST_PERIOD)
    return sorted({p for p in SWEEP_PERIODS if p <= longest} | {longest})


@dataclass(frozen=True)
class HeadsOptions(Options):
    title = "heads (--experiments heads)"
    periods: tuple[int, ...] | None = option(None, Number(int, low=2), nargs="+", metavar="P",
                                             help="the periods of the induction test [r, r] (default: 4, 16, 64 and "
                                                  "the longest up to 128 that fits the context)")


def head_test_tokens(model: "Transformer") -> torch.Tensor:
    """The tiled random tokens [batch, pos] the heads are labelled on (the circuits method reads the same labels)."""
    gen = torch.Generator().manual_seed(SEED)
    return induction_test_tokens(16, min(model.cfg.n_ctx, 64), model.cfg.d_vocab, gen)


@dataclass
class HeadsFindings(MethodResult):
    """classes: the HeadClasses (labels, rejected, scores, copying, composition; its to_dict() is written at the top
    level of the entry, as results.json holds it); induction_by_period: the [r, r] sweep; tables: it as Markdown;
    icl: the in-context learning score; labels_by_head: "L1H0" -> its labels. All absent for a 0-layer model."""

    name = "heads"
    classes: HeadClasses | None = None
    induction_by_period: dict[str, Any] | None = None
    tables: dict[str, list[str]] | None = None
    icl: dict[str, Any] | None = None
    labels_by_head: dict[str, list[str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.classes is None:   # a 0-layer model: the summary alone
            return {"summary": list(self.summary), "figures": list(self.figures)}
        return {**self.classes.to_dict(), "induction_by_period": self.induction_by_period, "tables": self.tables,
                "icl": self.icl, "labels_by_head": self.labels_by_head, "summary": list(self.summary),
                "figures": list(self.figures)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadsFindings":
        own = ("induction_by_period", "tables", "icl", "labels_by_head", "summary", "figures")
        rest = {k: v for k, v in d.items() if k not in own}
        classes = HeadClasses.from_dict(rest) if "labels" in rest else None   # absent for a 0-layer model
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), classes, d.get("induction_by_period"),
                   d.get("tables"), d.get("icl"), d.get("labels_by_head"))


@torch.no_grad()
def run_heads(model: "Transformer", tokenizer: Any, out_dir: Path, options: HeadsOptions,
              prompt: str | None = None) -> HeadsFindings:
    """Detectors and labels on tiled random tokens, attention patterns of the labelled heads,
    and the in-context-learning score on the same sequences."""
    from circuitlab.analysis.heads import attention_view
    from circuitlab.viz.heads import attention_patterns_figure, head_scores_figure

    if model.cfg.n_layers == 0:
        return HeadsFindings(["a 0-layer model has no attention heads"], [])
    out_dir = Path(out_dir)
    tokens = head_test_tokens(model).to(model_device(model))
    classes = classify_heads(model, tokens)
    figures = [head_scores_figure(classes.scores.scores, classes=classes).save_png(out_dir / "head_scores.png").name]
    shown = list(dict.fromkeys(classes.heads_with("previous-token")[:2] + classes.heads_with("induction")[:2]))
    if shown:
        view = attention_view(model, tokens[:1], tokenizer, classes)
        figures.append(attention_patterns_figure(view, "Attention on a random segment tiled to fill the sequence",
                                                 heads=[head_name(*h) for h in shown]
                                                 ).save_png(out_dir / "head_patterns.png").name)
    icl = in_context_learning_score(model, tokens)
    eos = getattr(tokenizer, "eos_id", None)
    periods = heads_periods(model, options)
    sweep = (induction_by_period(model, periods, exclude=[] if eos is None else [eos], progress=True)
             if periods else None)
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
    labels_by_head = {head_name(l, h): classes.labels_of(l, h)
                      for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)}
    return HeadsFindings(summary, figures, classes, sweep.to_dict() if sweep is not None else None,
                         {"Induction test [r, r] by period": sweep.table()} if sweep is not None else {},
                         icl.to_dict(), labels_by_head)


def check_heads(model: "Transformer", tokenizer: Any, options: HeadsOptions, **_: Any) -> None:
    """Refuse periods whose two copies do not fit the context, before any work."""
    longest = model.cfg.n_ctx // 2
    bad = [p for p in options.periods or () if p > longest]
    if bad:
        raise InputError(f"--periods {' '.join(map(str, bad))}: two copies of r must fit the context of "
                         f"{model.cfg.n_ctx} tokens (periods up to {longest})")


def label_forwards(model: "Transformer") -> list[tuple[int, int]]:
    """The forward passes of the labels (classify_heads on head_test_tokens), as (rows, tokens per row): the tiled
    tokens and their two [r, r] tests."""
    from circuitlab.analysis.heads import detector_periods

    seq = min(model.cfg.n_ctx, 64)
    return [(16, seq)] + [(16, 2 * p) for p in detector_periods(min(model.cfg.n_ctx, 256))]


def heads_periods(model: "Transformer", options: HeadsOptions) -> list[int]:
    """The periods of the heads experiment's sweep: --periods, else sweep_periods (none for a context under 8)."""
    return list(options.periods or (sweep_periods(model.cfg.n_ctx) if model.cfg.n_ctx >= 8 else []))


def labels_estimate(model: "Transformer", runs: list[tuple[int, int]]) -> list[memory.Estimate]:
    """The labels' cost (classify_heads) and more forward passes `runs`: each caching the attention patterns, then
    the weight evidence (folded norms, copying scores, composition scores; analysis.qk_ov's flops and measured
    efficiencies), one Estimate each."""
    from circuitlab.analysis.qk_ov import COMPOSITION_EFFICIENCY, COPYING_EFFICIENCY, composition_flops, copying_flops
    from circuitlab.model.transformer import cache_estimate

    cfg, held = model.cfg, memory.tensor_bytes(model)
    parts = [cache_estimate(model, rows, n, lambda name: name.endswith("hook_pattern"))
             for rows, n in label_forwards(model) + runs]
    parts.append(memory.Estimate("copying scores", {}, held=held, flops=copying_flops(cfg),
                                 efficiency=COPYING_EFFICIENCY))
    if cfg.n_layers > 1:
        parts.append(memory.Estimate("composition scores", {}, held=held, flops=composition_flops(cfg),
                                     efficiency=COMPOSITION_EFFICIENCY))
    parts.append(fold_estimate(model))
    return parts


def fold_estimate(model: "Transformer") -> memory.Estimate:
    """weights_model: a copy of the weights with the norms folded in, about 3 s for SmolLM2's 135 M parameters
    (a copy runs far below matmul speed: counted as 200 flops a parameter at the probe's speed)."""
    n = sum(p.numel() for p in model.parameters())
    return memory.Estimate("folded weights", {"folded copy": memory.tensor_bytes(model)},
                           held=memory.tensor_bytes(model), flops=200.0 * n)


def estimate_heads(model: "Transformer", tokenizer: Any, options: HeadsOptions, **_: Any) -> memory.Estimate:
    """The labels (labels_estimate), the attention view and in-context-learning score's forward passes, and one
    per period of the sweep (16 x 2 p tokens each)."""
    if model.cfg.n_layers == 0:
        return memory.Estimate("heads (a 0-layer model: nothing to run)", {}, held=memory.tensor_bytes(model),
                               flops=0.0)
    seq = min(model.cfg.n_ctx, 64)
    periods = heads_periods(model, options)
    from circuitlab.methods.base import figures_estimate

    parts = labels_estimate(model, [(1, seq), (16, seq)] + [(16, 2 * p) for p in periods])
    parts.append(figures_estimate(model, 2 + bool(periods)))   # scores, patterns (when labelled), the sweep
    return memory.Estimate.one_after_another(
        f"heads (labels on 16 x {seq} tiled tokens, induction sweep at periods "
        f"{', '.join(map(str, periods)) or 'none'}, copying and composition scores)", parts)


METHOD = Method("heads", HeadsOptions, HeadsFindings, run_heads, None, needs_text=False, check=check_heads,
                estimate=estimate_heads)
