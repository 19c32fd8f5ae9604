"""Figures of analysis results, static (PNG through matplotlib's Agg canvas, png.py) and interactive
(interactive.py, plotly); import from the submodules. Nothing here changes matplotlib's backend: a
notebook that displays our results keeps its own."""


def token_label(s: str, n: int | None = None) -> str:
    """A token string made visible: escapes for control characters, ␣ for spaces, cut to n characters."""
    s = repr(s)[1:-1].replace(" ", "␣")
    return s if n is None or len(s) <= n else s[: n - 1] + "…"
