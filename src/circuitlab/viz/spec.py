"""Deprecated name of circuitlab.viz.figure (FigureSpec and its helpers), kept for one release: `spec` is the
options spec (circuitlab.spec), one meaning per name. Importing it warns; every name resolves to viz/figure.py's."""
from __future__ import annotations

import warnings
from typing import Any

from circuitlab.viz import figure as _figure

warnings.warn("circuitlab.viz.spec is renamed circuitlab.viz.figure (FigureSpec, heatmap_figure, lines_figure, ...); "
              "the old name goes in the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_figure, name)
