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
from circuitlab.methods.base import Method, MethodResult, NoOptions, one_prompt_estimate
from circuitlab.model import model_device
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

SEED = 0


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
def run_heads(model: "Transformer", tokenizer: Any, out_dir: Path, options: NoOptions,
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
    labels_by_head = {head_name(l, h): classes.labels_of(l, h)
                      for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)}
    return HeadsFindings(summary, figures, classes, sweep.to_dict() if sweep is not None else None,
                         {"Induction test [r, r] by period": sweep.table()} if sweep is not None else {},
                         icl.to_dict(), labels_by_head)


METHOD = Method("heads", NoOptions, HeadsFindings, run_heads, None, needs_text=False,
                estimate=one_prompt_estimate("heads"))
