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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

# matplotlib's tab10 = plotly's default sequence: a series' colour i is the same in both renderers.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
# Colour scales both renderers know (plotly name; matplotlib takes it lower-cased).
SCALES = ("Blues", "RdBu", "RdBu_r", "Viridis", "Magma", "Purples", "Greens", "Reds")


@dataclass
class Heatmap:
    """z [rows, cols] (NaN = blank); x / y: one label per column / row, rows drawn top to bottom.
    x_ticks / y_ticks: the labels shown on the axes when x / y are longer ids (hover shows x / y).
    text: a string written in each cell; annotate: write the values (2 decimals) instead;
    hover: extra lines per cell (plotly only); value_name / value_format: the value in the hover and on the
    colour bar."""

    z: np.ndarray
    x: list[str]
    y: list[str]
    zmin: float | None = None
    zmax: float | None = None
    scale: str = "RdBu_r"
    x_ticks: list[str] | None = None
    y_ticks: list[str] | None = None
    text: list[list[str]] | None = None
    annotate: bool = False
    hover: list[list[str]] | None = None
    value_name: str = ""
    value_format: str = ".4g"
    colorbar: bool = True

    def __post_init__(self) -> None:
        self.z = as_array(self.z)
        if self.z.ndim != 2:
            raise ValueError(f"a heatmap needs a 2-D matrix, got shape {self.z.shape}")
        if self.scale not in SCALES:
            raise ValueError(f"colour scale must be one of {SCALES}, not {self.scale!r}")
        if (len(self.y), len(self.x)) != self.z.shape:
            raise ValueError(f"{len(self.y)} row and {len(self.x)} column labels for a {tuple(self.z.shape)} matrix")


@dataclass
class Series:
    """One line / set of markers / bars. kind "bar" draws vertical bars at x, "hbar" horizontal bars
    (categories in y, values in x, first at the top). color: a palette index (COLORS) or a colour, or one
    colour per bar; dash: solid, dash, dot or dashdot; text: a hover label per point (plotly)."""

    x: Sequence[Any]
    y: Sequence[Any]
    name: str = ""
    kind: Literal["line", "markers", "line+markers", "bar", "hbar"] = "line"
    color: int | str | Sequence[str] | None = None
    dash: str = "solid"
    width: float | None = None
    opacity: float = 1.0
    text: Sequence[str] | None = None
    group: str | None = None  # legend group (plotly): one run's series toggle together

    def colour(self) -> Any:
        return COLORS[self.color % len(COLORS)] if isinstance(self.color, int) else self.color


@dataclass
class Rule:
    """A reference mark: a horizontal line at y, a vertical line at x, or a shaded band x..x_to."""

    x: float | None = None
    y: float | None = None
    x_to: float | None = None
    color: int | str = "grey"
    dash: str = "dash"
    label: str = ""
    opacity: float = 0.12  # of a band

    def colour(self) -> str:
        return COLORS[self.color % len(COLORS)] if isinstance(self.color, int) else self.color


@dataclass
class Panel:
    """One set of axes: a heatmap, or series. name: the trace name and menu entry (layout "menu");
    label: a note after it in the menu ("induction"). y_range (lo, hi), hi None = from lo up."""

    title: str = ""
    x_title: str = ""
    y_title: str = ""
    heatmap: Heatmap | None = None
    series: list[Series] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    y_range: tuple[float, float | None] | None = None
    x_log: bool = False
    name: str = ""
    label: str = ""

    def menu_label(self) -> str:
        return self.name + (f" ({self.label})" if self.label else "")


@dataclass
class FigureSpec:
    """panels, laid out as a grid of `cols` columns (default: up to 3) or as a menu opening on panel
    `active`. height / width: plotly pixels, when the renderer's guess from the content will not do."""

    panels: list[Panel]
    title: str = ""
    layout: Literal["grid", "menu"] = "grid"
    cols: int | None = None
    active: int = 0
    height: int | None = None
    width: int | None = None

    def __post_init__(self) -> None:
        if not self.panels:
            raise ValueError("a figure needs at least one panel")
        if not 0 <= self.active < len(self.panels):
            raise ValueError(f"active panel {self.active} of {len(self.panels)}")

    def n_cols(self) -> int:
        return self.cols or min(3, len(self.panels))

    def to_plotly(self):
        """The interactive figure (plotly.graph_objects.Figure)."""
        from circuitlab.viz.plotly_render import to_plotly

        return to_plotly(self)

    def save_png(self, path: str | Path) -> Path:
        """Draw with matplotlib on a private Agg canvas and write a PNG; returns the path."""
        from circuitlab.viz.png import to_png

        return to_png(self, path)

    def _repr_html_(self) -> str:
        from circuitlab.viz.interactive import notebook_html

        return notebook_html(self)


# ---------------------------------------------------------------------------- helpers for the views


def as_array(x: Any) -> np.ndarray:
    """A tensor / array / nested list (None = missing) as a float64 numpy array, NaN for missing."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return np.array(_none_to_nan(x), dtype=np.float64)


def _none_to_nan(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_none_to_nan(v) for v in x]
    return float("nan") if x is None else x


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
