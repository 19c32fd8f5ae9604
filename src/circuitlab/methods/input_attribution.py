"""Input attribution as a method (`interpret --experiments input_attribution`; the analysis:
analysis/input_attribution/): every registered technique (integrated gradients, gradient × input, saliency,
occlusion, context mixing, KernelSHAP, LIME and any registered since) for the prediction at the prompt's last
token, the model's top token against its second; its options (interpret_options: every technique's own, from the
technique registry), its typed result and report section (the views: viz/tokens.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.input_attribution import attribute_methods, technique_options
from circuitlab.data.stories import DEFAULT_PROMPT
import circuitlab.memory as memory
from circuitlab.methods.base import Method, MethodResult, NoOptions, prompt_tokens
from circuitlab.spec import Options
from circuitlab.methods.tuned_lens import check_lens
from circuitlab.model import model_device
from circuitlab.viz.fragments import Section, bullet_list, details, paragraph, table_html

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class InputAttributionFindings(MethodResult):
    """prompt; target / foil: the explained logit difference's tokens; methods: method -> its
    InputAttribution.to_dict()."""

    name = "input_attribution"
    prompt: str
    target: str | None
    foil: str | None
    methods: dict[str, Any]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InputAttributionFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), d.get("prompt") or "", d.get("target"),
                   d.get("foil"), d["methods"])


def interpret_options() -> type[Options]:
    """Every registered technique's options but the baseline (each technique starts from its own), as
    `interpret`'s flags: --steps, --span, --samples, --seed, --kernel-width, --exact, --paired, ..."""
    return technique_options("InputAttributionOptions", left_out=("baseline",), title="input attribution")


def check_input_attribution(model: "Transformer", tokenizer: Any, options: Options, prompt: str | None = None,
                            lens: str | Path | None = None, **_: Any) -> None:
    """The prompt and the lens (check_lens), then what each technique refuses for this prompt (shap's exact
    values on more than 16 tokens, more coalitions than memory holds), before any method runs."""
    import warnings

    from circuitlab.analysis.input_attribution import techniques

    check_lens(model, tokenizer, NoOptions(), prompt=prompt, lens=lens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a long prompt warns once, when it runs
        n = len(prompt_tokens(model, tokenizer, prompt))
    for t in techniques():
        if t.check is not None:
            t.check(t.option_values(options.to_dict()), n)


def run_input_attribution(model: "Transformer", tokenizer: Any, out_dir: Path, options: Options,
                          prompt: str | None = None, lens: str | Path | None = None) -> InputAttributionFindings:
    """Every registered technique (with `options`' values) for the prediction at the prompt's last token: the
    model's top token against its second (a logit difference)."""
    tokens = prompt_tokens(model, tokenizer, prompt)
    with torch.no_grad():
        top2 = model(tokens[None].to(model_device(model)))[0, -1].topk(2).indices.tolist()
    found = attribute_methods(model, tokens, top2[0], top2[1], tokenizer=tokenizer, **options.to_dict())
    first = found["ig"]
    assert first.completeness_error is not None   # integrated gradients measure it
    summary = [f"explained: logit({first.target_str!r}) - logit({first.foil_str!r}) after the last token"]
    for method, res in found.items():
        strs = res.token_strs or [str(t) for t in res.tokens]
        tops = ", ".join(f"{strs[p]!r} (pos {p}) {s:+.3g}" for p, s in res.top(3))
        summary.append(f"{method}: {tops}")
    summary.append(f"integrated gradients: completeness error {100 * first.completeness_error:.2g}% with "
                   f"{first.steps} steps from the {first.baseline} baseline")
    return InputAttributionFindings(summary, [], prompt or DEFAULT_PROMPT, first.target_str, first.foil_str,
                                  {m: r.to_dict() for m, r in found.items()})


def _how(method: str, d: dict[str, Any]) -> str:
    """How one method's scores were made (its to_dict() form): the fit for shap / lime, completeness for paths."""
    if d.get("samples") is not None:  # shap, lime: a fit to sampled coalitions, not a path integral
        return (f"{d['samples']} coalitions, {d['baseline']} baseline; surrogate R² {d['surrogate_r2']:.2f}"
                + ("; sums to the change exactly" if d.get("completeness_error") is not None else ""))   # shap's fit
    if d.get("completeness_error") is not None:
        return f"completeness error {100 * d['completeness_error']:.2g}% ({d['steps']} steps, {d['baseline']} baseline)"
    return "-"


def input_attribution_section(found: InputAttributionFindings) -> Section:
    from circuitlab.viz.tokens import attribution_methods_html

    methods = found.methods
    rows = []
    for method, d in methods.items():
        strs = d.get("token_strs") or [str(t) for t in d["tokens"]]
        rows.append({"method": method,
                     "top tokens": ", ".join(f"{strs[t['pos']]!r} ({t['pos']}) {t['score']:+.3g}"
                                             for t in d["top"][:3]),
                     "how": _how(method, d)})
    parts = [paragraph(f"Prompt: {found.prompt}") if found.prompt else "",
             bullet_list(found.summary[:1]), attribution_methods_html(methods), table_html(rows)]
    mixing = methods.get("context-mixing")
    if mixing and mixing.get("per_layer"):
        from circuitlab.viz.tokens import attribution_html

        parts.append(details("context mixing layer by layer", attribution_html(mixing)))
    target = f"logit({found.target!r}) - logit({found.foil!r})" if found.foil else "the top logit"
    return Section("input-attribution", "Input attribution", parts,
                   f"Which input tokens the prediction after the last token depends on: {target}. Integrated "
                   "gradients and gradient × input are in logit units and sum (over tokens) to the change of the "
                   "metric; saliency is the gradient's size; occlusion is the metric's drop when the token is "
                   "replaced; context mixing is the share of the last residual that came from each token, read "
                   "from attention and the size of what each head writes; KernelSHAP is each token's Shapley value "
                   "(its average effect over coalitions of the other tokens; they sum to the change from the "
                   "baseline) and LIME the coefficient of a linear surrogate fitted to the same kind of "
                   "perturbations, weighted by closeness to the prompt.")


def estimate_input_attribution(model: Transformer, tokenizer: Any, options: Any, prompt: str | None = None,
                               **_: Any) -> memory.Estimate:
    """Every registered technique on the prompt, one after another."""
    from circuitlab.analysis.input_attribution import attribution_estimate, technique_names

    n = len(prompt_tokens(model, tokenizer, prompt))
    values = options.to_dict() if options is not None else {}
    return memory.Estimate.one_after_another(f"input attribution ({', '.join(technique_names())} on {n} tokens)",
                                             [attribution_estimate(model, n, m, **values) for m in technique_names()])


METHOD = Method("input_attribution", interpret_options, InputAttributionFindings, run_input_attribution,
                input_attribution_section, inputs=("prompt", "lens"), check=check_input_attribution,
                estimate=estimate_input_attribution)
