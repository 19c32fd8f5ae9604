"""Figures of analysis results, static (matplotlib, Agg backend) and interactive (interactive.py, plotly);
import from the submodules."""
import matplotlib

matplotlib.use("Agg")


def token_label(s: str, n: int | None = None) -> str:
    """A token string made visible: escapes for control characters, ␣ for spaces, cut to n characters."""
    s = repr(s)[1:-1].replace(" ", "␣")
    return s if n is None or len(s) <= n else s[: n - 1] + "…"
