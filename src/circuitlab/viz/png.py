"""PNG figures without pyplot: a matplotlib Figure drawn on its own Agg canvas, so writing a PNG never
touches the global backend (pyplot's state machine, a notebook's inline backend) and needs no display."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110


def subplots(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] | None = None, **kwargs: Any):
    """(Figure, axes) as pyplot.subplots would return them, on a private Agg canvas."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_png(fig: Figure, path: str | Path, tight: bool = True, crop: bool = True) -> Path:
    """Write fig to path as PNG. tight: tight_layout first; crop: trim the margins (bbox_inches="tight")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight" if crop else None)
    return path
