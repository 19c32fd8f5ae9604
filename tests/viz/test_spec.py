"""viz/spec.py, the deprecated name of viz/figure.py: it still imports for one release, warns, and gives
viz/figure.py's objects themselves."""
import importlib
import sys

import pytest


def test_the_old_name_warns_and_resolves_to_viz_figure(monkeypatch):
    import circuitlab.viz.figure as figure

    monkeypatch.delitem(sys.modules, "circuitlab.viz.spec", raising=False)
    with pytest.warns(DeprecationWarning, match=r"circuitlab\.viz\.spec is renamed circuitlab\.viz\.figure"):
        old = importlib.import_module("circuitlab.viz.spec")
    assert old.FigureSpec is figure.FigureSpec and old.heatmap_figure is figure.heatmap_figure
    with pytest.raises(AttributeError):
        old.not_a_name_of_viz_figure  # noqa: B018 - a name figure.py lacks is not invented
