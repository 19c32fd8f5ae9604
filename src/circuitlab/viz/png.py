"""Any FigureSpec (viz/figure.py; it reads only the data, viz/parts.py) as a PNG, for report.md: a matplotlib Figure drawn on its own Agg canvas,
so writing a PNG never touches the global backend (pyplot's state machine, a notebook's inline backend)
and needs no display. Layout "menu" draws every panel side by side (pass the view only the panels worth
a static picture, e.g. the heads named)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from circuitlab.viz.parts import FigureData, Heatmap, Panel

DPI = 110
DASHES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}
MOST_TICKS = 48
MAX_SIZE = (18.0, 16.0)  # inches, the whole figure
BLANK = "#f2f2f2"  # NaN cells
CMAPS = {"Blues": "Blues", "RdBu": "RdBu", "RdBu_r": "RdBu_r", "Viridis": "viridis", "Magma": "magma",
         "Purples": "Purples", "Greens": "Greens", "Reds": "Reds"}  # spec.SCALES


def _text(s: str) -> str:
    """Plain text for matplotlib, which reads $...$ as mathtext."""
    return str(s).replace("$", r"\$")


def _panel_size(p: Panel) -> tuple[float, float]:
    if p.heatmap is not None:
        rows, cols = p.heatmap.z.shape
        per_col = 0.6 if p.heatmap.text is not None else 0.38
        return min(14.0, max(3.4, 1.8 + per_col * cols)), min(12.0, max(2.4, 1.3 + 0.36 * rows))
    if any(s.kind == "hbar" for s in p.series):
        return 6.0, 1.0 + 0.28 * max(len(s.x) for s in p.series)
    return 5.2, 3.6


def _ticks(ax, h: Heatmap, size: tuple[float, float]) -> None:
    for labels, n, axis, inches in ((h.x_ticks or h.x, h.z.shape[1], "x", size[0]),
                                    (h.y_ticks or h.y, h.z.shape[0], "y", size[1])):
        step = max(1, math.ceil(n / min(MOST_TICKS, max(4, int(5 * inches)))))  # at most ~5 labels an inch
        where = list(range(0, n, step))
        shown = [_text(labels[i]) for i in where]
        if axis == "x":
            ax.set_xticks(where, shown, fontsize=7, rotation=90 if n > 8 or max(map(len, shown), default=0) > 6 else 0)
        else:
            ax.set_yticks(where, shown, fontsize=7)


def _draw_heatmap(fig: Figure, ax, h: Heatmap, size: tuple[float, float]) -> None:
    cmap = matplotlib.colormaps[CMAPS[h.scale]].with_extremes(bad=BLANK)
    finite = h.z[np.isfinite(h.z)]
    lo = h.zmin if h.zmin is not None else (float(finite.min()) if finite.size else 0.0)
    hi = h.zmax if h.zmax is not None else (float(finite.max()) if finite.size else 1.0)
    norm = Normalize(lo, hi if hi > lo else lo + 1e-6)
    im = ax.imshow(np.ma.masked_invalid(h.z), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    _ticks(ax, h, size)
    if h.text is not None or h.annotate:
        for i in range(h.z.shape[0]):
            for j in range(h.z.shape[1]):
                v = h.z[i, j]
                s = h.text[i][j] if h.text is not None else ("" if math.isnan(v) else f"{v:.2f}")
                if not s:
                    continue
                r, g, b, _ = cmap(norm(v)) if not math.isnan(v) else (1, 1, 1, 1)
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, _text(s), ha="center", va="center", fontsize=6 if h.text is not None else 7,
                        color="white" if dark else "black")
    if h.colorbar and not h.annotate:  # annotated cells carry their values
        fig.colorbar(im, ax=ax, fraction=0.046, label=_text(h.value_name))


def _draw_series(ax, p: Panel) -> None:
    for s in p.series:
        colour = s.colour()
        label = _text(s.name) if s.name else None
        y = [np.nan if v is None else v for v in s.y]
        if s.kind == "hbar":
            ax.barh([_text(c) for c in s.x], y, color=colour, label=label)
            ax.invert_yaxis()  # first category on top, as in plotly
            ax.axvline(0, color="black", lw=0.8)
            ax.tick_params(axis="y", labelsize=8)
        elif s.kind == "bar":
            ax.bar([_text(c) if isinstance(c, str) else c for c in s.x], y, color=colour, label=label)
            ax.axhline(0, color="grey", lw=0.8)
        else:
            ax.plot(list(s.x), y, color=colour, ls="none" if s.kind == "markers" else DASHES[s.dash],
                    marker="o" if s.kind != "line" else None, markersize=3, lw=s.width or 1.5, alpha=s.opacity,
                    label=label)
    if all(isinstance(v, str) for s in p.series for v in s.x) and any(len(s.x) > 8 for s in p.series):
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.grid(alpha=0.3)


def _draw_rules(ax, p: Panel) -> None:
    for r in p.rules:
        if r.x is not None and r.x_to is not None:
            ax.axvspan(r.x, r.x_to, color=r.colour(), alpha=r.opacity, lw=0)
        elif r.x is not None:
            ax.axvline(r.x, color=r.colour(), ls=DASHES[r.dash], lw=1, alpha=0.8)
            if r.label:
                ax.text(r.x, 1.0, _text(r.label), transform=ax.get_xaxis_transform(), fontsize=6, ha="center",
                        va="bottom", color=r.colour())
        elif r.y is not None:
            ax.axhline(r.y, color=r.colour(), ls=DASHES[r.dash], lw=1, label=_text(r.label) if r.label else None)


def draw(spec: FigureData) -> Figure:
    """The spec as a matplotlib Figure on a private Agg canvas (tight layout: faster than constrained)."""
    panels = spec.panels
    cols = spec.n_cols() if spec.layout == "grid" or spec.cols else min(4, len(panels))
    rows = -(-len(panels) // cols)
    sizes = [_panel_size(p) for p in panels]
    w, h = max(w for w, _ in sizes), max(h for _, h in sizes)
    shrink = min(1.0, MAX_SIZE[0] / (cols * w), MAX_SIZE[1] / (rows * h))  # many big panels: keep proportions
    w, h = w * shrink, h * shrink
    width, height = cols * w, rows * h + (0.4 if len(panels) > 1 and spec.title else 0)
    fig = Figure(figsize=(width, height), layout="tight")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).flat
    many = len(panels) > 1
    for p, ax in zip(panels, axes):
        if p.heatmap is None and not p.series and not p.rules:
            ax.axis("off")  # a placeholder keeping a grid's rows aligned
        if p.heatmap is not None:
            _draw_heatmap(fig, ax, p.heatmap, (w, h))
        if p.series:
            _draw_series(ax, p)
        _draw_rules(ax, p)
        if ax.get_legend_handles_labels()[0] and not any(s.kind == "hbar" for s in p.series):
            ax.legend(fontsize=7)
        title = p.menu_label() if spec.layout == "menu" else (p.title if many else p.title or spec.title)
        ax.set_title(_text(title), fontsize=9)
        ax.set_xlabel(_text(p.x_title))
        ax.set_ylabel(_text(p.y_title))
        if p.x_log:
            ax.set_xscale("log")
        if p.y_range is not None:
            ax.set_ylim(p.y_range[0], p.y_range[1])
    for ax in list(axes):
        ax.axis("off")  # grid cells left over
    if many and spec.title:
        fig.suptitle(_text(spec.title), fontsize=9)
    return fig


def to_png(spec: FigureData, path: str | Path) -> Path:
    """Draw the spec and write it to path as PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draw(spec).savefig(path, dpi=DPI)
    return path
