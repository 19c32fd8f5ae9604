"""View of linear probes: score by residual point per task, with the random-label control and chance."""
from __future__ import annotations

from typing import Any

import numpy as np

from circuitlab.viz.figure import FigureSpec, Panel, Series, as_array, field_of


def probe_figure(results: Any) -> FigureSpec:
    """Val score by residual point, one colour per task: solid = probe, dashed = random-label control,
    dotted = chance (the most frequent class); accuracy and R² share the 0..1 axis. results: a ProbeResult,
    or task name -> ProbeResult / ProbeResult.to_dict()."""
    if field_of(results, "points") is not None and field_of(results, "val_score") is not None:
        results = {field_of(results, "task", "probe"): results}
    series = []
    for i, (name, res) in enumerate(results.items()):
        points = list(field_of(res, "points"))
        series.append(Series(points, as_array(field_of(res, "val_score")).tolist(),
                             f"{name} ({field_of(res, 'score', 'score')})", "line+markers", i, group=name))
        control = as_array(field_of(res, "control_score"))
        if np.isfinite(control).any():
            series.append(Series(points, control.tolist(), f"{name} control", color=i, dash="dash", opacity=0.7,
                                 group=name))
        chance = field_of(res, "chance")
        if chance is not None:
            series.append(Series(points, [float(chance)] * len(points), f"{name} chance", color=i, dash="dot",
                                 width=1, group=name))
    return FigureSpec([Panel(series=series, x_title="residual stream point", y_title="val score",
                             y_range=(-0.05, 1.05))], "Linear probes by layer", height=400)
