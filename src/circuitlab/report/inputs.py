"""The steering report (`circuitlab steer --out`), from the sweep's JSON form read once as a SteeringFindings
(input attribution's and the tuned lens's sections are their methods' own: circuitlab.methods):

    steering_section(found)            a coefficient sweep: table, figure, generations (`circuitlab steer --out`)
    write_steering_report(out, found)  report.html of one sweep
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from circuitlab.report.html import Section, details, esc, key_value_table, table_html, write_html_report
from circuitlab.report.results import SteeringFindings


def steering_section(found: SteeringFindings | Mapping[str, Any]) -> Section:
    """found: the sweep typed (SteeringFindings), or its JSON form (read here, once)."""
    from circuitlab.viz.steering import steering_figure

    found = SteeringFindings.of(found)
    series = {"preference for the positive prompts": found.preference, "cost on neutral text": found.neutral_cost}
    if found.metric is not None:
        series[found.metric_name or "metric"] = found.metric
    rows = [{"coefficient": c, **{name: float(v[i]) for name, v in series.items()},
             "neutral loss": float(found.neutral_loss[i])} for i, c in enumerate(found.coefs)]
    vec = found.vector
    parts = [key_value_table({"added at": vec.hook_name, "direction from": vec.source,
                              "positive prompts": vec.n_positive, "negative prompts": vec.n_negative,
                              "direction norm": vec.norm}),
             steering_figure(found), table_html(rows)]
    if found.generations:
        items = "".join(f"<li><b>{esc(c)}</b>: {esc(found.prompt)}<i>{esc(texts[0] if texts else '')}</i></li>"
                        for c, texts in found.generations.items())
        parts.append(details("a generation per coefficient (first sample)", f"<ul>{items}</ul>"))
    return Section("steering", "Steering", parts,
                   "The direction times the coefficient is added to the residual stream at every position. "
                   "Preference: mean next-token loss on the negative prompts minus on the positive ones (higher: the "
                   "model expects the positive set more); cost: the rise of the loss on neutral text.")


def write_steering_report(out: str | Path, found: SteeringFindings | Mapping[str, Any],
                          title: str = "circuitlab steer") -> Path:
    """out/report.html (or the .html path out) for one steering sweep (SteeringFindings, or SteerResult.to_dict():
    SteeringSweep.to_dict() + prompt and generations, as `circuitlab steer` writes to steering.json)."""
    found = SteeringFindings.of(found)
    return write_html_report(out, [steering_section(found)], title, found.vector.hook_name or "")
