"""The parts of a figure spec, as plain data: heatmaps, series, rules, panels and the figure around them.

Views build a circuitlab.viz.figure.FigureSpec (this data plus its renderers); the renderers
(plotly_render.py, png.py) read only this module, so no circle runs between a spec and its renderers.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
class FigureData:
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
