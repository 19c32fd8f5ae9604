"""The logit lens as a method (`interpret --experiments logit_lens`; the analysis: analysis/lens/): the residual
stream after the embeddings and after each layer read through the final norm and the unembedding, on the prompt
(default: a short story); its typed result and report section (the view: viz/lens.py, shared with the explorer
and the tuned lens)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.lens import logit_lens
from circuitlab.data.stories import DEFAULT_PROMPT
from circuitlab.methods.base import (Method, MethodResult, NoOptions, check_prompt, one_prompt_estimate,
                                     prompt_tokens)
from circuitlab.model import model_device
from circuitlab.viz.fragments import Section, bullet_list, paragraph

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class LogitLensFindings(MethodResult):
    """lens: the LogitLens's to_dict() (written at the top level of the entry, as results.json holds it); prompt:
    the text read (the default prompt's when none was given)."""

    name = "logit_lens"
    lens: dict[str, Any]
    prompt: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.lens, "prompt": self.prompt, "summary": list(self.summary), "figures": list(self.figures)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LogitLensFindings":
        lens = {k: v for k, v in d.items() if k not in ("prompt", "summary", "figures")}
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), lens, d.get("prompt") or "")


@torch.no_grad()
def run_logit_lens(model: "Transformer", tokenizer: Any, out_dir: Path, options: NoOptions,
                   prompt: str | None = None) -> LogitLensFindings:
    """Logit lens on the prompt (default: a short story)."""
    from circuitlab.viz.lens import logit_lens_figure

    tokens = prompt_tokens(model, tokenizer, prompt)
    lens = logit_lens(model, tokens.to(model_device(model)), k=5, tokenizer=tokenizer)
    figure = logit_lens_figure(lens, max_positions=24).save_png(Path(out_dir) / "logit_lens.png").name
    # Where did the final answer firm up the most between the embeddings and the output?
    rise = lens.final_top_probs[-1] - lens.final_top_probs[0]
    assert lens.token_strs is not None and lens.top_strs is not None   # read with the tokenizer
    summary = []
    for p in rise.argsort(descending=True)[:3].tolist():
        traj = " -> ".join(f"{float(x):.2f}" for x in lens.final_top_probs[:, p])
        summary.append(f"{lens.token_strs[p]!r} -> {lens.top_strs[-1][p][0]!r}: probability by layer {traj}")
    return LogitLensFindings(summary, [figure], lens.to_dict(), prompt or DEFAULT_PROMPT)


def logit_lens_section(found: LogitLensFindings) -> Section:
    from circuitlab.viz.lens import logit_lens_figure

    parts = [paragraph(f"Prompt: {found.prompt}") if found.prompt else "", bullet_list(found.summary),
             logit_lens_figure(found.lens)]
    return Section("logit-lens", "Logit lens", parts,
                   "The residual stream after the embeddings and after each layer, read through the final norm and "
                   "the unembedding: the top next token at each point, and how sure the model already is.")


METHOD = Method("logit_lens", NoOptions, LogitLensFindings, run_logit_lens, logit_lens_section, check=check_prompt,
                estimate=one_prompt_estimate("logit_lens"))
