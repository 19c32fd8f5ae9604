"""Direct logit attribution as a method (`interpret --experiments attribution`; the analysis:
analysis/logit_attribution.py): each component's direct part of the logit difference between the model's top two
predictions at the prompt's last position, and what the leading MLP's most active neurons promote; its typed
result and report section (the view: viz/lens.py's logit_attribution_figure)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.checks import LAST_POS
from circuitlab.analysis.logit_attribution import direct_logit_attribution, neuron_output_tokens, residual_decomposition
from circuitlab.data.stories import DEFAULT_PROMPT
from circuitlab.methods.base import (Method, MethodResult, NoOptions, check_prompt, one_prompt_estimate,
                                     prompt_tokens)
from circuitlab.model import model_device
from circuitlab.model.assumptions import ASSUMPTIONS, unmet
from circuitlab.viz.fragments import Section, bullet_list, paragraph

if TYPE_CHECKING:
    from circuitlab.model import Transformer



@dataclass
class AttributionFindings(MethodResult):
    """prompt; answer / wrong: the top two predictions' text; attribution: the LogitAttribution's to_dict();
    decomposition: the residual decomposition's; neurons: the leading MLP's neurons' output tokens (models with
    MLPs and pre-norms)."""

    name = "attribution"
    prompt: str
    answer: str | None
    wrong: str | None
    attribution: dict[str, Any]
    decomposition: dict[str, Any]
    neurons: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AttributionFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), d.get("prompt") or "", d.get("answer"),
                   d.get("wrong"), d["attribution"], d.get("decomposition") or {}, d.get("neurons"))


@torch.no_grad()
def run_attribution(model: "Transformer", tokenizer: Any, out_dir: Path, options: NoOptions,
                    prompt: str | None = None) -> AttributionFindings:
    """Direct logit attribution at the prompt's last position, to the logit difference between the
    model's top two predictions; for the MLP with the largest share, what its most active neurons promote."""
    from circuitlab.viz.lens import logit_attribution_figure

    tokens = prompt_tokens(model, tokenizer, prompt).to(model_device(model))[None]
    logits, cache = model.run_with_cache(tokens)
    top2 = logits[0, -1].topk(2).indices.tolist()
    parts = residual_decomposition(model, cache)
    dla = direct_logit_attribution(model, cache, answer=top2[0], wrong=top2[1], pos=LAST_POS, decomposition=parts)
    figure = logit_attribution_figure(dla).save_png(Path(out_dir) / "logit_attribution.png").name
    a, b = tokenizer.decode([top2[0]]), tokenizer.decode([top2[1]])
    summary = [f"logit({a!r}) - logit({b!r}) = {float(dla.logit[0]):.3f} at the last position; largest direct parts: "
               + ", ".join(f"{c} {v:+.3f}" for c, v in dla.top(5))]
    found = AttributionFindings(summary, [figure], prompt or DEFAULT_PROMPT, a, b, dla.to_dict(), parts.to_dict())
    if model.cfg.has_mlp and unmet(model, "pre_norm"):
        summary.append(f"the MLP neurons' output tokens are left out: they read W_out through the unembedding, and "
                       f"this model has {ASSUMPTIONS['pre_norm'][2](model.cfg)}")
    elif model.cfg.has_mlp:
        mlp_labels = [i for i, lab in enumerate(dla.labels) if lab.endswith("MLP")]
        best = max(mlp_labels, key=lambda i: abs(float(dla.mean()[i])))
        layer = int(dla.labels[best].split()[0][1:])
        active = cache["post", layer][0, -1].topk(5).indices.tolist()
        neurons = neuron_output_tokens(model, layer, active, k=5, tokenizer=tokenizer)
        found.neurons = neurons.to_dict()
        summary.append(f"L{layer} MLP's most active neurons at the last position promote: "
                       + "; ".join(f"n{n}: {', '.join(repr(s) for s in strs[:3])}"
                                   for n, strs in zip(neurons.neurons, neurons.top_strs or [])))
    return found


def attribution_section(found: AttributionFindings) -> Section:
    from circuitlab.viz.lens import logit_attribution_figure

    title = (f"Direct logit attribution: logit({found.answer!r}) - logit({found.wrong!r})"
             if found.answer is not None else None)
    parts = [paragraph(f"Prompt: {found.prompt}") if found.prompt else "", bullet_list(found.summary),
             logit_attribution_figure(found.attribution, title=title)]
    return Section("attribution", "Direct logit attribution", parts,
                   "Each component's direct contribution (through the final norm's scale) to the logit difference "
                   "between the model's top two predictions at the last position.")


METHOD = Method("attribution", NoOptions, AttributionFindings, run_attribution, attribution_section, check=check_prompt,
                estimate=one_prompt_estimate("attribution"))
