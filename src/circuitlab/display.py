"""How result objects display in Jupyter, without the analyses importing the figures.

Analyses sit below the figures (viz/ draws result objects, so it imports analysis/), hence a result
class cannot import its own figure. Instead a result class inherits Displayed, whose _repr_html_ asks
the renderer that viz registered for it here (viz/interactive.py: @renders(PatchResult) ...). In a
notebook the package root loads viz/interactive.py as soon as circuitlab is imported, so every result
displays as its interactive figure; elsewhere (the CLI, scripts) nothing extra is imported.
"""
from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

_RENDERERS: dict[type, Callable[[Any], str]] = {}


def renders(*classes: type) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """Register fn(result) -> HTML as the Jupyter display of each class (and its subclasses)."""
    def register(fn: Callable[[Any], str]) -> Callable[[Any], str]:
        for cls in classes:
            _RENDERERS[cls] = fn
        return fn
    return register


def renderer_for(obj: Any) -> Callable[[Any], str] | None:
    return next((_RENDERERS[c] for c in type(obj).__mro__ if c in _RENDERERS), None)


class Displayed:
    """Mixin for result objects: _repr_html_ is the registered figure, else the repr as text."""

    def _repr_html_(self) -> str:
        render = renderer_for(self)
        return render(self) if render is not None else f"<pre>{html.escape(repr(self))}</pre>"
