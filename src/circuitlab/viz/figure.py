"""What a figure shows, written once: each view (viz/heads.py, lens.py, patching.py, ...) is one function
returning a FigureSpec, and two generic renderers draw any spec:

    spec = logit_lens_figure(lens)           # circuitlab.viz.lens: data, labels, titles, colour scale
    spec.to_plotly()                         # interactive (viz/plotly_render.py): report.html, serve, Jupyter
    spec.save_png("lens.png")                # static (viz/png.py, matplotlib Agg): report.md
    spec                                     # in Jupyter: the plotly figure, offline

A spec is panels of one kind each: a heatmap, or series (lines, markers, bars), with reference rules
(horizontal / vertical lines, shaded x bands). Layout "grid" shows every panel; "menu" shows one panel at a
time in plotly (a dropdown picks it, e.g. one attention head) and every panel side by side in a PNG. Text is
plain (the plotly renderer escapes it); sizes are the renderers' business.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from circuitlab.viz.parts import (COLORS, SCALES, FigureData, Heatmap, Panel, Rule, Series,  # noqa: F401 (re-exported)
                                  as_array)


@dataclass
class FigureSpec(FigureData):
    """A figure (FigureData: panels, title, layout ...) that draws itself: to_plotly(), save_png(path), and
    its plotly figure in Jupyter."""

    def to_plotly(self):
        """The interactive figure (plotly.graph_objects.Figure)."""
        from circuitlab.viz.plotly_render import to_plotly

        return to_plotly(self)

    def save_png(self, path: str | Path) -> Path:
        """Draw with matplotlib on a private Agg canvas and write a PNG; returns the path."""
        from circuitlab.viz.png import to_png

        return to_png(self, path)

    def _repr_html_(self) -> str:
        from circuitlab.viz.notebook import notebook_html

        return notebook_html(self)


# ---------------------------------------------------------------------------- helpers for the views


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """obj.name for a result object, obj[name] for its to_dict() form (as stored in results.json)."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def symmetric_limits(z: np.ndarray, centre: float = 0.0) -> tuple[float, float]:
    """(lo, hi) around centre covering every finite value (±1 when there is none)."""
    finite = z[np.isfinite(z)]
    lim = float(np.abs(finite - centre).max()) if finite.size else 1.0
    lim = lim if lim > 0 and math.isfinite(lim) else 1.0
    return centre - lim, centre + lim


def heatmap_figure(matrix: Any, row_labels: Sequence[Any] | None = None, col_labels: Sequence[Any] | None = None,
                   title: str = "", *, x_title: str = "", y_title: str = "", zmid: float | None = 0.0,
                   zmin: float | None = None, zmax: float | None = None, colorscale: str = "RdBu_r",
                   value_name: str = "value", annotate: bool | None = None) -> FigureSpec:
    """One heatmap of matrix [rows, cols], rows top to bottom (QK/OV circuits, copying, composition).
    zmid=0 centres a diverging scale on 0 (symmetric limits unless zmin/zmax are given); zmid=None uses
    zmin..zmax (or the data range). annotate: write the values (default: at most 150 cells). Labels are
    shown as given: pass token strings through viz.token_label."""
    m = as_array(matrix)
    if m.ndim != 2:
        raise ValueError(f"heatmap_figure needs a 2-D matrix, got shape {m.shape}")
    rows = [str(s) for s in row_labels] if row_labels is not None else [str(i) for i in range(m.shape[0])]
    cols = [str(s) for s in col_labels] if col_labels is not None else [str(i) for i in range(m.shape[1])]
    if zmid is not None and zmin is None and zmax is None:
        zmin, zmax = symmetric_limits(m, zmid)
    heat = Heatmap(m, cols, rows, zmin, zmax, colorscale, annotate=m.size <= 150 if annotate is None else annotate,
                   value_name=value_name)
    return FigureSpec([Panel(heatmap=heat, x_title=x_title, y_title=y_title)], title=title)


def lines_figure(x: Sequence[Any], series: Mapping[str, Sequence[Any]], title: str = "", x_title: str = "",
                 y_title: str = "", category: bool = False) -> FigureSpec:
    """One line with markers per named series [len(x)] against x (category: x as labels, in order), e.g. the
    tuned lens's and the logit lens's KL by layer."""
    xs = [str(v) for v in x] if category else list(x)
    lines = [Series(xs, [None if v is None else float(v) for v in ys], name, "line+markers", i)
             for i, (name, ys) in enumerate(series.items())]
    return FigureSpec([Panel(series=lines, x_title=x_title, y_title=y_title)], title, height=360)
