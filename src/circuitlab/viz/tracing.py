"""Views of causal tracing: the paper's three panels (hidden states, MLP, attention; severed traces beside
them when computed), tokens down and layers across, subject tokens marked with *. Each takes the result
object or its to_dict() form (as stored in results.json)."""
from __future__ import annotations

from typing import Any

import numpy as np

from circuitlab.viz import token_label
from circuitlab.viz.spec import FigureSpec, Heatmap, Panel, as_array, field_of

# The paper's colours: purple hidden states, green MLPs, red attention.
SCALE = {"hidden": "Purples", "mlp": "Greens", "attn": "Reds", "hidden_no_mlp": "Purples",
         "hidden_no_attn": "Purples"}


def _what(kind: str, window: int) -> str:
    layers = f"window of {window} layer{'s' if window != 1 else ''}"
    return {"hidden": "hidden states (after each layer)", "mlp": f"MLP outputs ({layers})",
            "attn": f"attention outputs ({layers})", "hidden_no_mlp": "hidden, later MLPs frozen",
            "hidden_no_attn": "hidden, later attention frozen"}[kind]


def _token_rows(trace: Any) -> list[str]:
    tokens = field_of(trace, "tokens")
    strs = field_of(trace, "token_strs") or [str(t) for t in tokens]
    start, end = field_of(trace, "subject")
    return [f"{i} {token_label(s, 12)}" + ("*" if start <= i < end else "") for i, s in enumerate(strs)]


def causal_trace_figure(trace: Any) -> FigureSpec:
    """One heatmap per traced kind: the metric (e.g. the answer's probability) with each (layer, token)
    restored, tokens down (subject tokens marked *), layers across; the colour scale runs from the
    corrupted run's value up. trace: a CausalTrace or its to_dict()."""
    values, window = field_of(trace, "values"), int(field_of(trace, "window"))
    metric, clean, corrupt = field_of(trace, "metric"), float(field_of(trace, "clean_value")), \
        float(field_of(trace, "corrupt_value"))
    answer = field_of(trace, "answer_str") or str(field_of(trace, "answer"))
    rows = _token_rows(trace)
    panels = []
    for kind, v in values.items():
        grid = as_array(v).T  # [pos, layer]
        finite = grid[np.isfinite(grid)]
        lo = min(corrupt, float(finite.min())) if finite.size else corrupt
        hi = max(clean, float(finite.max())) if finite.size else clean
        heat = Heatmap(grid, [f"L{l}" for l in range(grid.shape[1])], rows, lo, hi, SCALE[kind],
                       value_name=metric)
        panels.append(Panel(_what(kind, window), "layer", "token", heat, name=kind))
    title = (f"Causal tracing: {metric} of {answer!r} (clean {clean:.3g}, subject* corrupted {corrupt:.3g}) "
             "with one state restored")
    return FigureSpec(panels, title, cols=min(4, len(panels)))


def average_trace_figure(average: Any) -> FigureSpec:
    """The average indirect effect over prompts, one heatmap per kind: token categories down (the paper's),
    layers across. average: an AverageTrace or its to_dict()."""
    values, window = field_of(average, "values"), int(field_of(average, "window"))
    categories = list(field_of(average, "categories"))
    panels = []
    for kind, v in values.items():
        grid = as_array(v).T  # [category, layer]
        finite = grid[np.isfinite(grid)]
        hi = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        heat = Heatmap(grid, [f"L{l}" for l in range(grid.shape[1])], categories, min(0.0, float(finite.min()))
                       if finite.size else 0.0, hi, SCALE[kind], value_name="AIE")
        panels.append(Panel(_what(kind, window), "layer", "", heat, name=kind))
    n = len(field_of(average, "prompts", None) or field_of(average, "traces", None) or [])
    title = (f"Average indirect effect over {n} prompts ({field_of(average, 'metric')}; average total effect "
             f"{float(field_of(average, 'total_effect')):.3g})")
    return FigureSpec(panels, title, cols=min(4, len(panels)))
