"""report.html's figure payload: what repeats is written once (viz.plotly_render.compact_json), and the page's
clUnpack rebuilds exactly the figure plotly would draw from fig.to_json(); the JSON cannot end its script."""
import base64
import json
import re
import shutil
import subprocess

import numpy as np
import plotly.graph_objects as go
import pytest

from circuitlab.report.html import Section, page_js, plotly_js, render_html, script_safe
from circuitlab.viz.figure import heatmap_figure, lines_figure
from circuitlab.viz.plotly_render import UNPACK_JS, compact_json
from circuitlab.viz.heads import attention_figure


UNSAFE = "a </script><!-- <SCRIPT> b<br>c"  # raw text a plotly figure may carry: kept, yet cannot end the script


def patterns(n_layers: int, n_heads: int, n: int, seed: int = 0) -> np.ndarray:
    p = np.random.default_rng(seed).random((n_layers, n_heads, n, n)).astype(np.float32)
    return p / p.sum(-1, keepdims=True)


def tokens(n: int) -> list[str]:
    return [f"tok{i}" for i in range(n)]


def figure_texts(page: str) -> list[str]:
    return re.findall(r"clUnpack\((.*?)\); Plotly\.newPlot", page)


def test_a_menu_figure_writes_each_heads_data_once_and_its_labels_once():
    """SmolLM2's viewer is 270 heads: labels, colour scale and the menu's visible lists were written once per
    head (3.3 MB for a 36-token prompt); now a head costs its weights and little else."""
    n_layers, n_heads, n = 10, 9, 24
    spec = attention_figure(tokens(n), patterns(n_layers, n_heads, n))
    text = json.dumps(compact_json(spec, []), separators=(",", ":"))
    small = json.dumps(compact_json(attention_figure(tokens(n), patterns(1, 2, n)), []))
    # A key label: in the traces' shared x and y and the axes' ticks, as many times for 90 heads as for 2.
    assert text.count('"tok5 (pos 5)"') == small.count('"tok5 (pos 5)"') == 4
    assert text.count('"colorscale"') == 1 and "[false," not in text and ",false]" not in text
    z = json.loads(spec.to_plotly().to_json())["data"][0]["z"]["bdata"]  # one head's weights, base64 float32
    per_head = len(z) // 2 + 500  # as int16 steps (shown to 3 decimals), its name, hover, visibility, menu entry
    assert len(text) <= n_layers * n_heads * per_head + 12_000, len(text)


def test_a_page_writes_plotlyjs_and_the_template_once():
    figs = [heatmap_figure(np.eye(3), title=f"h{i}") for i in range(4)] + [lines_figure([1, 2], {"a": [1.0, 2.0]})]
    page = render_html([Section("s", "S", figs)])
    assert [json.loads(t)["layout"]["template"] for t in figure_texts(page)] == [0] * 5  # the page's first
    # the template (plotly_white, 7 KB): once per page, not once per figure
    assert page.replace(plotly_js(), "").count('"colorway"') == 1
    assert len(figure_texts(page)) == 5 and all(len(t) < 4_000 for t in figure_texts(page))


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's clUnpack")
def test_clunpack_rebuilds_plotlys_figure_exactly():
    figs = [attention_figure(tokens(6), patterns(2, 3, 6), labels={"L1H2": "induction"}, active="L1H2"),
            heatmap_figure(np.arange(12.0).reshape(3, 4), ["a", "b", "c"], list("wxyz"), "grid"),
            lines_figure([1, 2, 3], {"one": [1.0, None, 3.0], "two": [0.5, 0.25, 0.125]}, "lines"),
            go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name=UNSAFE), layout=dict(title=dict(text=UNSAFE)))]
    templates: list[str] = []
    packed = [compact_json(f, templates) for f in figs]
    text = script_safe(json.dumps(packed))
    assert "</" not in text and "<!--" not in text and "<script" not in text.lower()
    # typed arrays as lists (NaN as null) for the comparison
    script = (page_js(templates) + "\nvar figs = " + text + ";\n"
              "function plain(z) { return Array.isArray(z) ? z.map(plain) : ArrayBuffer.isView(z) ? Array.from(z) : z; }\n"
              "process.stdout.write(JSON.stringify(figs.map(function (f) { var u = clUnpack(f); "
              "u.data.forEach(function (t) { if (t.z) t.z = plain(t.z); }); "
              "return {data: u.data, layout: u.layout}; })));\n")
    assert "@TEMPLATES@" in UNPACK_JS
    out = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    plotly = [json.loads((f.to_plotly() if hasattr(f, "to_plotly") else f).to_json()) for f in figs]
    # The attention weights (shown ".3f"): rounded to 3 decimals, the blank cells blank; the grid (".4g") exact.
    for got, want in zip(out[0]["data"], plotly[0]["data"]):
        z, expected = np.array(got.pop("z"), dtype=float), decoded(want.pop("z"))
        assert np.array_equal(np.isnan(z), np.isnan(expected))
        assert np.array_equal(z[~np.isnan(z)], np.round(expected[~np.isnan(z)], 3).astype(np.float32))
    assert out == plotly


def decoded(z: dict) -> np.ndarray:
    values = np.frombuffer(base64.b64decode(z["bdata"]), dtype={"f4": "<f4", "f8": "<f8"}[z["dtype"]])
    return values.astype(float).reshape([int(n) for n in z["shape"].split(",")])


def test_heatmap_cells_are_rounded_only_to_what_the_figure_shows():
    """int16 steps where the hover shows fixed decimals and a step is finer than the colour scale draws; the
    float cells as they were where the hover shows significant digits, or the range is too narrow."""
    m = np.random.default_rng(1).random((4, 5))
    m[0, :2] = [0.0625, 0.1235]  # a tie (rounded up, as the hover does) and 0.12349999 in float32 (down)
    spec = heatmap_figure(m, zmid=None, zmin=0.0, zmax=1.0, annotate=False)
    spec.panels[0].heatmap.value_format = ".3f"
    steps = compact_json(spec)["data"][0]["z"]
    assert steps["dtype"] == "i2" and steps["steps"] == 3
    q = np.frombuffer(base64.b64decode(steps["bdata"]), dtype="<i2").reshape(4, 5)
    shown = np.array([float(f"{v:.3f}") for v in np.round(m, 5).astype(np.float32).ravel()])  # Python's format
    shown[0] = 0.063  # ... rounds the exact tie 0.0625 to even; the hover (JavaScript's toFixed) rounds it up
    assert q[0, 0] == 63 and q[0, 1] == 123 and np.array_equal(q.ravel(), np.round(shown * 1000))
    spec.panels[0].heatmap.value_format = ".3g"                  # significant digits: kept as floats
    assert compact_json(spec)["data"][0]["z"]["dtype"] == "f4"
    spec.panels[0].heatmap.annotate = True                       # the cells' text at ".2f", the hover at ".3f"
    assert compact_json(spec)["data"][0]["z"]["dtype"] == "f4"
    spec.panels[0].heatmap.annotate = False
    spec.panels[0].heatmap.value_format = ".3f"
    spec.panels[0].heatmap.zmin, spec.panels[0].heatmap.zmax = 0.0, 0.4   # a step is 1/400 of the colour range
    assert compact_json(spec)["data"][0]["z"]["dtype"] == "f4"
