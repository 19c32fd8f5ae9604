"""Views of causal analyses: patching heatmaps, attribution vs patching, path patching, ablations. Each
takes the result object or its to_dict() form (as stored in results.json)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from circuitlab.names import head_name, parse_head
from circuitlab.viz import token_label
from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, Series, as_array, field_of, symmetric_limits


def _pos_labels(n: int, tokens: Sequence[str] | None) -> list[str]:
    return [f"{i} {token_label(tokens[i], 10)}" if tokens is not None and i < len(tokens) else str(i) for i in range(n)]


def _heads(n: int) -> list[str]:
    return [f"H{h}" for h in range(n)]


def patching_figure(result: Any, tokens: Sequence[str] | None = None, value: str = "recovery",
                    title: str | None = None) -> FigureSpec:
    """A PatchResult (or its to_dict()) as heatmaps of value "recovery" (1 = clean behaviour, 0 =
    corrupted), "effect" (change from the patched run's base) or "values".

    [layer, pos] / [layer, head]: one heatmap, layers down; [layer, pos, head] / [layer, head, dest_pos]:
    one panel per layer, heads down and positions across. tokens: the prompt's token strings.
    """
    values = as_array(field_of(result, "values"))
    clean, corrupt = float(field_of(result, "clean_value")), float(field_of(result, "corrupt_value"))
    direction = field_of(result, "direction", "denoise")
    axes = list(field_of(result, "axes"))
    if axes and axes[0] == "layer":  # the to_dict() form lists the layer axis too
        axes = axes[1:]
    layers = list(field_of(result, "layers"))
    if value == "recovery":
        grid = (values - corrupt) / (clean - corrupt) if clean != corrupt else np.full_like(values, np.nan)
    elif value == "effect":
        grid = values - (corrupt if direction == "denoise" else clean)
    elif value == "values":
        grid = values
    else:
        raise ValueError(f"value must be recovery, effect or values, not {value!r}")
    name = title or (f"{field_of(result, 'method', 'activation')} patching: {field_of(result, 'target')} "
                     f"({value}, metric {field_of(result, 'metric', 'metric')}, {direction})")
    lo, hi = (-1.0, 1.0) if value == "recovery" else symmetric_limits(grid)
    if len(axes) == 1:
        cols = _pos_labels(grid.shape[1], tokens) if axes[0] in ("pos", "dest_pos") else _heads(grid.shape[1])
        heat = Heatmap(grid, cols, [f"L{l}" for l in layers], lo, hi, "RdBu", value_name=value)
        return FigureSpec([Panel(heatmap=heat, x_title="position" if axes[0] == "pos" else axes[0],
                                 y_title="layer")], name)
    per_layer = grid if axes[0] == "head" else np.swapaxes(grid, 1, 2)  # [layer, head, pos]
    n_heads, n_pos = per_layer.shape[1:]
    panels = [Panel(f"layer {l}", "position", "head",
                    Heatmap(per_layer[i], _pos_labels(n_pos, tokens), _heads(n_heads), lo, hi, "RdBu",
                            value_name=value),
                    name=f"L{l}") for i, l in enumerate(layers)]
    return FigureSpec(panels, name, cols=1)


def attribution_vs_patching_figure(check: Any) -> FigureSpec:
    """One scatter per target: attribution patching's estimated effect against the real one, with r and
    the diagonal. check: an AttributionCheck."""
    panels = []
    for name, r in check.correlation.items():
        real = check.patching[name].effect().flatten().tolist()
        est = check.attribution[name].effect().flatten().tolist()
        finite = [v for v in real + est if v == v]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        panels.append(Panel(f"{name}: r = {r:.3f}", "activation patching effect", "attribution estimate",
                            series=[Series(real, est, kind="markers", color=0, opacity=0.7),
                                    Series([lo, hi], [lo, hi], color="grey", dash="dash", width=0.8)]))
    return FigureSpec(panels, "Attribution patching against activation patching")


def path_patching_figure(results: Sequence[Any] | Mapping[str, Any]) -> FigureSpec:
    """One [sender layer, head] heatmap per receiver input: the recovery (1 = path unused, 0 = the whole
    corruption) with each sender's path patched, minus 1, so unused paths are white. results:
    PathPatchResults, or receiver input -> PathPatchResult.to_dict()."""
    panels = []
    for res in (results.values() if isinstance(results, Mapping) else results):
        receiver = field_of(res, "receiver")
        layer, head = parse_head(receiver) if isinstance(receiver, str) else receiver
        values = as_array(field_of(res, "values"))
        clean, corrupt = float(field_of(res, "clean_value")), float(field_of(res, "corrupt_value"))
        gap = clean - corrupt
        grid = ((values - corrupt) / gap - 1 if gap else np.full_like(values, np.nan))[:layer]
        title = f"sender -> {head_name(layer, head)} {field_of(res, 'receiver_input').upper()} input"
        heat = Heatmap(grid, _heads(grid.shape[1]), [f"L{l}" for l in range(layer)], -1.0, 1.0, "RdBu",
                       value_name="change")
        panels.append(Panel(title, "sender head", "sender layer", heat))
    return FigureSpec(panels, "path patching: change in normalised metric (-1 = the whole corruption)",
                      cols=len(panels))


def ablation_figure(result: Any, title: str | None = None) -> FigureSpec:
    """The metric's change per ablated component: bars for [layer] results, a [layer, head] / [layer, neuron]
    heatmap otherwise. result: AblationResult or its to_dict()."""
    values = as_array(field_of(result, "values"))
    change = values - float(field_of(result, "baseline"))
    kind, metric, layers = field_of(result, "kind"), field_of(result, "metric", "metric"), field_of(result, "layers")
    name = title or f"{field_of(result, 'method', '')} ablation of each {kind}: change in {metric}"
    rows = [f"L{l}" for l in layers]
    if change.ndim == 1:
        bars = Series(rows, change.tolist(), kind="bar", color=["#d62728" if v > 0 else "#1f77b4" for v in change])
        return FigureSpec([Panel(series=[bars], y_title=f"change in {metric}")], name)
    prefix = "H" if kind == "head" else "N"
    lo, hi = symmetric_limits(change)
    heat = Heatmap(change, [f"{prefix}{i}" for i in range(change.shape[1])], rows, lo, hi, "RdBu_r",
                   value_name="change")
    return FigureSpec([Panel(heatmap=heat, x_title=kind, y_title="layer")], name)
