"""View of a steering sweep: the target metric and the neutral-text loss cost against the coefficient."""
from __future__ import annotations

from typing import Any

from circuitlab.viz.figure import FigureSpec, Panel, Rule, Series, as_array, field_of


def steering_figure(sweep: Any) -> FigureSpec:
    """Left: preference for the positive prompts (and the custom metric, if any) by coefficient; right: the
    increase of the loss on neutral text. sweep: a SteeringSweep or its to_dict() (steering.json)."""
    coefs = [float(c) for c in field_of(sweep, "coefs")]
    cost = field_of(sweep, "neutral_cost")
    target = [Series(coefs, as_array(field_of(sweep, "preference")).tolist(), "preference (nats/token)",
                     "line+markers", 0)]
    metric = field_of(sweep, "metric")
    if metric is not None:
        target.append(Series(coefs, as_array(metric).tolist(), field_of(sweep, "metric_name") or "metric",
                             "line+markers", 1))
    hook = field_of(field_of(sweep, "vector"), "hook_name")
    zero = [Rule(y=0.0, color="black", dash="solid")]
    return FigureSpec([Panel(f"Target metric ({hook})", "coefficient", series=target, rules=zero),
                       Panel("Cost on neutral text", "coefficient", "Δ loss (nats/token)", rules=zero,
                             series=[Series(coefs, as_array(cost() if callable(cost) else cost).tolist(), "",
                                            "line+markers", 3)])],
                      f"Steering along {hook}")
