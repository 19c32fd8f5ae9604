"""Figures in Jupyter, offline: notebook_html(fig) is the HTML a FigureSpec (or plotly figure) displays as.

Set circuitlab.viz.notebook.NOTEBOOK_PLOTLYJS = "always" where every output is its own page.
"""
from __future__ import annotations

import sys
import uuid
from typing import Any

from circuitlab.viz.parts import FigureData

# "once": plotly.js (about 4.8 MB) goes into the first figure a Python process displays, later ones
# reuse it (the page's window.Plotly); "always": into every figure (needed where each output is its own
# page, as in Colab, which "auto" detects). Both work offline.
NOTEBOOK_PLOTLYJS = "auto"
_sent = False


def notebook_html(fig: Any, include_plotlyjs: bool | None = None) -> str:
    """A FigureSpec (or plotly figure) as an HTML fragment for Jupyter's _repr_html_, with no network
    access: plotly.js is inlined the first time (or every time, see NOTEBOOK_PLOTLYJS), and later
    fragments check that it is there."""
    global _sent
    if isinstance(fig, FigureData):
        from circuitlab.viz.plotly_render import to_plotly

        fig = to_plotly(fig)
    if include_plotlyjs is None:
        mode = NOTEBOOK_PLOTLYJS
        if mode == "auto":
            mode = "always" if "google.colab" in sys.modules else "once"
        include_plotlyjs = mode == "always" or not _sent
    div_id = f"circuitlab-{uuid.uuid4().hex[:12]}"
    body = fig.to_html(full_html=False, include_plotlyjs=bool(include_plotlyjs), div_id=div_id)
    if include_plotlyjs:
        _sent = True
        return body
    note = ("plotly.js is not loaded on this page: run circuitlab.viz.notebook.reset_notebook() and "
            "display this again")
    guard = (f'<script>if (typeof window.Plotly === "undefined") {{ var e = document.getElementById("{div_id}");'
             f' if (e) e.textContent = "{note}"; }}</script>')
    return body + guard


def reset_notebook() -> None:
    """Inline plotly.js again in the next figure displayed (after outputs holding it were cleared)."""
    global _sent
    _sent = False
