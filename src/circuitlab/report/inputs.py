"""Report sections for the inputs and layers of a prediction, from the experiments' to_dict() forms:

    input_attribution_section(found)   tokens shaded by each method (interpret's "input_attribution")
    tuned_lens_section(found)          tuned lens beside the logit lens, KL by layer (interpret's "tuned_lens")
    steering_section(found)            a coefficient sweep: table, figure, generations (`circuitlab steer --out`)
    write_steering_report(out, found)  report.html of one sweep
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from circuitlab.report.html import (Section, bullet_list, details, esc, key_value_table, paragraph, table_html,
                                    write_html_report)


def input_attribution_section(found: Mapping[str, Any]) -> Section:
    from circuitlab.viz.tokens import attribution_methods_html

    methods = found["methods"]
    rows = []
    for method, d in methods.items():
        strs = d.get("token_strs") or [str(t) for t in d["tokens"]]
        if d.get("samples") is not None:  # shap, lime: a fit to sampled coalitions, not a path integral
            how = (f"{d['samples']} coalitions, {d['baseline']} baseline; surrogate R² {d['surrogate_r2']:.2f}"
                   + ("; sums to the change exactly" if method == "shap" else ""))
        elif d.get("completeness_error") is not None:
            how = f"completeness error {100 * d['completeness_error']:.2g}% ({d['steps']} steps, {d['baseline']} baseline)"
        else:
            how = "-"
        rows.append({"method": method,
                     "top tokens": ", ".join(f"{strs[t['pos']]!r} ({t['pos']}) {t['score']:+.3g}" for t in d["top"][:3]),
                     "how": how})
    parts = [paragraph(f"Prompt: {found['prompt']}") if found.get("prompt") else "",
             bullet_list(found.get("summary", [])[:1]), attribution_methods_html(methods), table_html(rows)]
    mixing = methods.get("context-mixing")
    if mixing and mixing.get("per_layer"):
        from circuitlab.viz.tokens import attribution_html

        parts.append(details("context mixing layer by layer", attribution_html(mixing)))
    target = f"logit({found['target']!r}) - logit({found['foil']!r})" if found.get("foil") else "the top logit"
    return Section("input-attribution", "Input attribution", parts,
                   f"Which input tokens the prediction after the last token depends on: {target}. Integrated "
                   "gradients and gradient × input are in logit units and sum (over tokens) to the change of the "
                   "metric; saliency is the gradient's size; occlusion is the metric's drop when the token is "
                   "replaced; context mixing is the share of the last residual that came from each token, read "
                   "from attention and the size of what each head writes; KernelSHAP is each token's Shapley value "
                   "(its average effect over coalitions of the other tokens; they sum to the change from the "
                   "baseline) and LIME the coefficient of a linear surrogate fitted to the same kind of "
                   "perturbations, weighted by closeness to the prompt.")


def tuned_lens_section(found: Mapping[str, Any]) -> Section:
    from circuitlab.viz.lens import logit_lens_figure
    from circuitlab.viz.spec import lines_figure

    kl = found["held_out_kl"]
    labels = kl["labels"]
    rows = [{"residual after": lab, "logit lens KL": a, "tuned lens KL": b}
            for lab, a, b in zip(labels, kl["logit"], kl["tuned"])]
    comparison = found["comparison"]
    parts = [bullet_list(found.get("summary", [])),
             lines_figure(labels, {"logit lens": kl["logit"], "tuned lens": kl["tuned"]},
                          "KL to the model's final distribution on held-out stories", "residual after",
                          "KL (nats per token)", category=True),
             table_html(rows),
             paragraph(f"Prompt: {found['prompt']}") if found.get("prompt") else "",
             '<div class="side-by-side" style="display:flex;flex-wrap:wrap;gap:8px">',
             logit_lens_figure(comparison["logit"]), logit_lens_figure(comparison["tuned"]), "</div>"]
    if found.get("train"):
        parts.append(details("how the tuned lens was trained", key_value_table(found["train"])))
    return Section("tuned-lens", "Tuned lens and logit lens", parts,
                   "The logit lens reads each layer's residual through the final norm and unembedding as it is; the "
                   "tuned lens first applies an affine translator per layer, trained so the read-out matches the "
                   "model's final distribution. Lower KL: the layer's read-out is closer to what the model finally "
                   "predicts.")


def steering_section(found: Mapping[str, Any]) -> Section:
    from circuitlab.viz.steering import steering_figure

    coefs = found["coefs"]
    series = {"preference for the positive prompts": found["preference"],
              "cost on neutral text": found["neutral_cost"]}
    if found.get("metric") is not None:
        series[found.get("metric_name") or "metric"] = found["metric"]
    rows = [{"coefficient": c, **{name: float(v[i]) for name, v in series.items()},
             "neutral loss": float(found["neutral_loss"][i])} for i, c in enumerate(coefs)]
    vec = found.get("vector", {})
    parts = [key_value_table({"added at": vec.get("hook_name"), "direction from": vec.get("source"),
                              "positive prompts": vec.get("n_positive"), "negative prompts": vec.get("n_negative"),
                              "direction norm": vec.get("norm")}),
             steering_figure(found), table_html(rows)]
    generations = found.get("generations") or {}
    if generations:
        prompt = found.get("prompt", "")
        items = "".join(f"<li><b>{esc(c)}</b>: {esc(prompt)}<i>{esc(texts[0] if texts else '')}</i></li>"
                        for c, texts in generations.items())
        parts.append(details("a generation per coefficient (first sample)", f"<ul>{items}</ul>"))
    return Section("steering", "Steering", parts,
                   "The direction times the coefficient is added to the residual stream at every position. "
                   "Preference: mean next-token loss on the negative prompts minus on the positive ones (higher: the "
                   "model expects the positive set more); cost: the rise of the loss on neutral text.")


def write_steering_report(out: str | Path, found: Mapping[str, Any], title: str = "circuitlab steer") -> Path:
    """out/report.html (or the .html path out) for one steering sweep (SteeringSweep.to_dict() + prompt and
    generations, as `circuitlab steer` writes to steering.json)."""
    return write_html_report(out, [steering_section(found)], title, found.get("vector", {}).get("hook_name", ""))
