"""The tuned lens against the logit lens as a method (`interpret --experiments tuned_lens`, `lens show --out`; the
analysis: analysis/lens/tuned.py): both lenses on the prompt side by side and their KL to the model's final
distribution per layer on held-out built-in stories; its typed result and report section (the views: viz/lens.py,
viz/figure.py's lines_figure).

The lens (an input `interpret` shares): a tuned-lens folder; the one saved beside the checkpoint by default, else
one is trained here quickly (QUICK_LENS_STEPS).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.analysis.lens.tuned import (TunedLens, compare_lenses, mean_kl_to_final, story_batches,
                                            train_tuned_lens)
from circuitlab.data.stories import DEFAULT_PROMPT
import circuitlab.memory as memory
from circuitlab.methods.base import Method, MethodResult, NoOptions, check_prompt, prompt_tokens
from circuitlab.viz.fragments import Section, bullet_list, details, key_value_table, paragraph, table_html

if TYPE_CHECKING:
    from circuitlab.model import Transformer

QUICK_LENS_STEPS = 150  # a lens trained inside `interpret` when none is saved (`circuitlab lens train` does more)


@dataclass
class TunedLensFindings(MethodResult):
    """prompt; lens_source: where the lens came from; train: how it was trained; comparison: both lenses on the
    prompt (LensComparison.to_dict()); held_out_kl: labels and each lens's KL per layer; tables: the same as
    Markdown (report.md). All absent for a 0-layer model."""

    name = "tuned_lens"
    prompt: str | None = None
    lens_source: str | None = None
    train: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None
    held_out_kl: dict[str, list] | None = None
    tables: dict[str, list[str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.held_out_kl is None:   # a 0-layer model: the summary alone
            return {"summary": list(self.summary), "figures": list(self.figures)}
        return {"prompt": self.prompt, "lens_source": self.lens_source, "train": self.train,
                "comparison": self.comparison, "held_out_kl": self.held_out_kl, "tables": self.tables,
                "summary": list(self.summary), "figures": list(self.figures)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TunedLensFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), d.get("prompt"), d.get("lens_source"),
                   d.get("train"), d.get("comparison"), d.get("held_out_kl"), d.get("tables"))


def load_or_train_lens(model: "Transformer", tokenizer: Any, lens: str | Path | None, steps: int = QUICK_LENS_STEPS
                       ) -> tuple[TunedLens, str]:
    """The tuned lens saved in `lens` (checked against the model), or one trained on built-in stories
    when lens is None or holds none; and where it came from."""
    if lens is not None and TunedLens.exists(lens):
        return TunedLens.load(lens, model), f"loaded from {lens}"
    seq = min(64, model.cfg.n_ctx)
    trained = train_tuned_lens(model, story_batches(tokenizer, n_batches=8, batch_size=8, seq_len=seq), steps=steps,
                               progress=True)   # seconds to a minute: shown
    return trained, (f"trained here for {steps} steps on built-in stories (train a better one with "
                     "`circuitlab lens train`)")


def run_tuned_lens(model: "Transformer", tokenizer: Any, out_dir: Path, options: NoOptions, prompt: str | None = None,
                   lens: str | Path | None = None) -> TunedLensFindings:
    """The tuned lens beside the logit lens on the prompt, and both lenses' KL to the model's final
    distribution per layer on held-out built-in stories."""
    if model.cfg.n_layers == 0:
        return TunedLensFindings(["a 0-layer model has no layers to translate"], [])
    tuned, source = load_or_train_lens(model, tokenizer, lens)
    tokens = prompt_tokens(model, tokenizer, prompt)
    both = compare_lenses(model, tokens, tuned, tokenizer=tokenizer)
    held_out = story_batches(tokenizer, n_batches=2, batch_size=8, seq_len=min(64, model.cfg.n_ctx), seed=2)
    logit_kl, tuned_kl = mean_kl_to_final(model, held_out), mean_kl_to_final(model, held_out, tuned)
    labels = both.logit.labels
    summary = [f"tuned lens {source}",
               "KL to the final distribution on held-out stories (nats), logit lens -> tuned lens: "
               + ", ".join(f"{lab} {a:.3g} -> {b:.3g}" for lab, a, b in
                           zip(labels[:-1], logit_kl.tolist(), tuned_kl.tolist()))]
    table = ["| after | logit lens KL | tuned lens KL |", "|---|---|---|"]
    table += [f"| {lab} | {a:.4f} | {b:.4f} |" for lab, a, b in zip(labels, logit_kl.tolist(), tuned_kl.tolist())]
    return TunedLensFindings(summary, [], prompt or DEFAULT_PROMPT, source, tuned.train_info, both.to_dict(),
                           {"labels": labels, "logit": [round(x, 6) for x in logit_kl.tolist()],
                            "tuned": [round(x, 6) for x in tuned_kl.tolist()]},
                           {"KL to the final distribution on held-out stories": table})


def check_lens(model: "Transformer", tokenizer: Any, options: NoOptions, prompt: str | None = None,
          lens: str | Path | None = None, **_: Any) -> None:
    """The prompt, and a saved lens that does not fit the model."""
    check_prompt(model, tokenizer, options, prompt)
    if lens is not None and TunedLens.exists(lens):
        TunedLens.load(lens, model)


def tuned_lens_section(found: TunedLensFindings) -> Section:
    from circuitlab.viz.lens import logit_lens_figure
    from circuitlab.viz.figure import lines_figure

    if found.held_out_kl is None or found.comparison is None:   # a 0-layer model: its summary says why
        raise KeyError("held_out_kl")
    kl = found.held_out_kl
    labels = kl["labels"]
    rows = [{"residual after": lab, "logit lens KL": a, "tuned lens KL": b}
            for lab, a, b in zip(labels, kl["logit"], kl["tuned"])]
    comparison = found.comparison
    parts = [bullet_list(found.summary),
             lines_figure(labels, {"logit lens": kl["logit"], "tuned lens": kl["tuned"]},
                          "KL to the model's final distribution on held-out stories", "residual after",
                          "KL (nats per token)", category=True),
             table_html(rows),
             paragraph(f"Prompt: {found.prompt}") if found.prompt else "",
             '<div class="side-by-side" style="display:flex;flex-wrap:wrap;gap:8px">',
             logit_lens_figure(comparison["logit"]), logit_lens_figure(comparison["tuned"]), "</div>"]
    if found.train:
        parts.append(details("how the tuned lens was trained", key_value_table(found.train)))
    return Section("tuned-lens", "Tuned lens and logit lens", parts,
                   "The logit lens reads each layer's residual through the final norm and unembedding as it is; the "
                   "tuned lens first applies an affine translator per layer, trained so the read-out matches the "
                   "model's final distribution. Lower KL: the layer's read-out is closer to what the model finally "
                   "predicts.")


def estimate_tuned_lens(model: Transformer, tokenizer: Any, options: Any, lens: Any = None, **_: Any
                        ) -> memory.Estimate:
    """A quick lens trained when none is saved (8 batches of 8 x 64 tokens), else held-out stories read."""
    from circuitlab.analysis.lens.tuned import TunedLens, lens_estimate
    from circuitlab.methods.tuned_lens import QUICK_LENS_STEPS
    from circuitlab.model.transformer import cache_estimate

    seq = min(64, model.cfg.n_ctx)
    if lens is not None and TunedLens.exists(lens):
        return cache_estimate(model, 8, seq, lambda n: "resid" in n)
    return lens_estimate(model, 8, seq, QUICK_LENS_STEPS, 8)


METHOD = Method("tuned_lens", NoOptions, TunedLensFindings, run_tuned_lens, tuned_lens_section,
                inputs=("prompt", "lens"), check=check_lens, estimate=estimate_tuned_lens)
