"""Any FigureSpec (viz/figure.py; it reads only the data, viz/parts.py) as an interactive plotly figure: report.html, `circuitlab serve`, Jupyter.

Heatmaps get category axes (rows top to bottom, repeated labels numbered so they stay apart), the cell
values and the spec's hover lines on hover; layout "menu" stacks every panel's traces on one set of axes
and a dropdown shows one panel at a time. Text from the spec is escaped here: plotly reads a few HTML
tags in titles, ticks and hovers. compact_json is a figure's JSON with what repeats written once, for a page
that holds UNPACK_JS (report.html).
"""
from __future__ import annotations

import base64
import html
import json
import math
import re
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from circuitlab.atomic import json_text
from circuitlab.viz.parts import FigureData, Heatmap, Panel, Series

TEMPLATE = "plotly_white"
DASHES = {"solid": "solid", "dash": "dash", "dot": "dot", "dashdot": "dashdot"}
MOST_TICKS = 48


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=False)


def unique(labels: list[str]) -> list[str]:
    """Labels made unique ("a", "a #2"): a category axis would merge repeated ones into one row."""
    seen: dict[str, int] = {}
    out = []
    for s in labels:
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.append(s if n == 0 else f"{s} #{n + 1}")
    return out


def _heatmap_trace(h: Heatmap, p: Panel, name: str, showscale: bool, colorbar: dict) -> go.Heatmap:
    x, y = unique([_esc(s) for s in h.x]), unique([_esc(s) for s in h.y])
    hover = (f"{_esc(p.y_title) or 'row'}: %{{y}}<br>{_esc(p.x_title) or 'column'}: %{{x}}<br>"
             f"{_esc(h.value_name) or 'value'}: %{{z:{h.value_format}}}")
    extra: dict[str, Any] = {}
    if h.hover is not None:
        extra["customdata"] = [["<br>".join(_esc(line) for line in cell.split("\n")) for cell in row] for row in h.hover]
        hover += "<br>%{customdata}"
    if h.text is not None:
        extra.update(text=[[_esc(s) for s in row] for row in h.text], texttemplate="%{text}", textfont=dict(size=9))
    elif h.annotate:
        extra.update(texttemplate="%{z:.2f}", textfont=dict(size=10))
    return go.Heatmap(z=np.round(h.z, 5).astype(np.float32), x=x, y=y, zmin=h.zmin, zmax=h.zmax,
                      colorscale=h.scale, hoverongaps=False, name=name, showscale=showscale and h.colorbar,
                      colorbar={"title": dict(text=_esc(h.value_name)), "thickness": 12, **colorbar},
                      hovertemplate=hover + f"<extra>{_esc(name)}</extra>", **extra)


def _series_trace(s: Series) -> go.BaseTraceType:
    colour = s.colour()
    common = dict(name=_esc(s.name), legendgroup=s.group, opacity=s.opacity, showlegend=bool(s.name))
    y = [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in s.y]
    if s.kind == "hbar":
        return go.Bar(x=y, y=[_esc(c) for c in s.x], orientation="h", marker_color=colour,
                      hovertemplate="%{y}: %{x:+.4g}<extra></extra>", **common)
    if s.kind == "bar":
        return go.Bar(x=[_esc(c) if isinstance(c, str) else c for c in s.x], y=y, marker_color=colour,
                      hovertemplate="%{x}: %{y:+.4g}<extra></extra>", **common)
    mode = {"line": "lines", "markers": "markers", "line+markers": "lines+markers"}[s.kind]
    extra: dict[str, Any] = {}
    if s.text is not None:
        extra.update(text=[_esc(t) for t in s.text], hovertemplate="%{x}: %{y:.4g} (%{text})<extra></extra>")
    return go.Scatter(x=list(s.x), y=y, mode=mode, line=dict(color=colour, dash=DASHES[s.dash], width=s.width),
                      marker=dict(size=5), **common, **extra)


def _ticks(labels: list[str], ids: list[str]) -> dict:
    step = max(1, math.ceil(len(ids) / MOST_TICKS))
    return dict(tickmode="array", tickvals=ids[::step], ticktext=[_esc(s) for s in labels[::step]])


def _axes(fig: go.Figure, p: Panel, row: int, col: int) -> None:
    where = dict(row=row, col=col)
    xa: dict[str, Any] = dict(title_text=_esc(p.x_title))
    ya: dict[str, Any] = dict(title_text=_esc(p.y_title))
    h = p.heatmap
    if h is not None:
        x, y = unique([_esc(s) for s in h.x]), unique([_esc(s) for s in h.y])
        xa.update(type="category", tickangle=-90 if len(x) > 8 else 0, **_ticks(h.x_ticks or h.x, x))
        ya.update(type="category", autorange="reversed", **_ticks(h.y_ticks or h.y, y))
    elif any(s.kind == "hbar" for s in p.series):
        ya.update(type="category", autorange="reversed")
        xa.update(zeroline=True, zerolinecolor="black")
    if p.x_log:
        xa.update(type="log")
    if p.y_range is not None:
        lo, hi = p.y_range
        ya.update(rangemode="tozero") if hi is None else ya.update(range=[lo, hi])
    fig.update_xaxes(**xa, **where)
    fig.update_yaxes(**ya, **where)


def _rules(fig: go.Figure, p: Panel, row: int, col: int) -> None:
    for r in p.rules:
        line = dict(color=r.colour(), dash=DASHES[r.dash], width=1.5 if r.x is not None else 1)
        label = dict(annotation_text=_esc(r.label), annotation_position="top",
                     annotation_font=dict(size=10, color=r.colour())) if r.label else {}
        if r.x is not None and r.x_to is not None:
            fig.add_vrect(x0=r.x, x1=r.x_to, fillcolor=r.colour(), opacity=r.opacity, line_width=0, row=row, col=col)
        elif r.x is not None:
            fig.add_vline(x=r.x, line=line, row=row, col=col, **label)
        elif r.y is not None:
            fig.add_hline(y=r.y, line=line, row=row, col=col, **label)


def _height(spec: FigureData, rows: int, cols: int) -> int:
    if spec.height:
        return spec.height
    panels = spec.panels[:1] if spec.layout == "menu" else spec.panels
    total = 0
    for r in range(rows):
        row = panels[r * cols:(r + 1) * cols]
        sizes = []
        for p in row:
            if p.heatmap is not None:
                sizes.append(max(160, 22 * len(p.heatmap.y) + 70))
            elif any(s.kind == "hbar" for s in p.series):
                sizes.append(max(160, 24 * max(len(s.x) for s in p.series)))
            else:
                sizes.append(330)
        total += max(sizes)
    return int(min(1400, max(280, total + 130)))


def to_plotly(spec: FigureData) -> go.Figure:
    """The spec as a plotly Figure (template plotly_white)."""
    panels = spec.panels
    menu = spec.layout == "menu"
    cols = 1 if menu else spec.n_cols()
    rows = 1 if menu else -(-len(panels) // cols)
    many = not menu and len(panels) > 1
    heat = any(p.heatmap is not None for p in panels)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[_esc(p.title) for p in panels] if many else None,
                        horizontal_spacing=0.12 if heat and cols > 1 else 0.07,
                        vertical_spacing=min(0.12, 0.3 / rows) if rows > 1 else 0.1)
    # One colour bar when every heatmap shares its scale and limits, else one beside each panel.
    scales = {(p.heatmap.zmin, p.heatmap.zmax, p.heatmap.scale) for p in panels if p.heatmap is not None}
    shared = menu or (len(scales) == 1 and next(iter(scales))[0] is not None)
    owners: list[int] = []  # the panel of each trace
    for i, p in enumerate(panels):
        row, col = (1, 1) if menu else (i // cols + 1, i % cols + 1)
        visible = None if not menu else i == spec.active
        if p.heatmap is not None:
            colorbar: dict[str, Any] = {}
            if many and not shared:
                suffix = "" if i == 0 else str(i + 1)
                xd, yd = fig.layout[f"xaxis{suffix}"].domain, fig.layout[f"yaxis{suffix}"].domain
                colorbar = dict(x=xd[1] + 0.01, y=(yd[0] + yd[1]) / 2, len=yd[1] - yd[0], thickness=10)
            trace = _heatmap_trace(p.heatmap, p, p.name or p.title, not many or not shared or i == 0, colorbar)
            trace.visible = visible
            fig.add_trace(trace, row=row, col=col)
            owners.append(i)
        for s in p.series:
            trace = _series_trace(s)
            trace.visible = visible
            fig.add_trace(trace, row=row, col=col)
            owners.append(i)
        if not menu or i == spec.active:
            _axes(fig, p, row, col)
        _rules(fig, p, row, col)
    layout: dict[str, Any] = dict(template=TEMPLATE, height=_height(spec, rows, cols),
                                  margin=dict(l=80, r=40, t=90 if menu else 60, b=90 if heat else 50))
    if spec.width:
        layout["width"] = spec.width
    if menu:
        def title(p: Panel) -> str:
            return _esc(f"{spec.title}: {p.menu_label()}" if spec.title else p.menu_label())

        buttons = [dict(label=_esc(p.menu_label()), method="update",
                        args=[{"visible": [o == i for o in owners]}, {"title.text": title(p)}])
                   for i, p in enumerate(panels)]
        layout.update(title=dict(text=title(panels[spec.active])),
                      updatemenus=[dict(buttons=buttons, direction="down", showactive=True, active=spec.active,
                                        x=1.0, xanchor="right", y=1.15, yanchor="top")])
    else:
        layout["title"] = dict(text=_esc(spec.title or (panels[0].title if not many else "")))
    if any(p.series for p in panels):
        if many:
            layout.update(legend=dict(orientation="h", y=-0.22, font=dict(size=10)), hovermode="x unified")
    fig.update_layout(**layout)
    return fig


# ---------------------------------------------------------------------------- compact JSON for a page


# Unpacking a compact figure (compact_json): the page's one copy of each template, the keys every trace shares
# and each menu button's visible list (one true per panel) are put back before Plotly.newPlot, so plotly gets
# the figure as made.
UNPACK_JS = """
var CL_TEMPLATES = @TEMPLATES@;
function clCopy(v) { return JSON.parse(JSON.stringify(v)); }
function clSteps(z) {
  var s = atob(z.bdata), b = new Uint8Array(s.length), i;
  for (i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  var q = new Int16Array(b.buffer), v = new Float32Array(q.length), d = Math.pow(10, z.steps);
  for (i = 0; i < q.length; i++) v[i] = q[i] === -32768 ? NaN : q[i] / d;
  var shape = String(z.shape).split(",").map(Number), rows = [];
  if (shape.length < 2) return v;
  for (i = 0; i < shape[0]; i++) rows.push(v.subarray(i * shape[1], (i + 1) * shape[1]));
  return rows;
}
function clUnpack(f) {
  if (f.common) {
    f.data = f.data.map(function (t) {
      var o = {}, k;
      for (k in f.common) o[k] = clCopy(f.common[k]);
      for (k in t) o[k] = t[k];
      return o;
    });
  }
  f.data.forEach(function (t) { if (t.z && t.z.steps !== undefined) t.z = clSteps(t.z); });
  if (typeof f.layout.template === "number") f.layout.template = clCopy(CL_TEMPLATES[f.layout.template]);
  (f.layout.updatemenus || []).forEach(function (m) {
    (m.buttons || []).forEach(function (b) {
      (b.args || []).forEach(function (a) {
        if (a && a.visible && a.visible.on) {
          var v = [], i;
          for (i = 0; i < a.visible.n; i++) v.push(false);
          a.visible.on.forEach(function (j) { v[j] = true; });
          a.visible = v;
        }
      });
    });
  });
  return f;
}
"""


def compact_json(fig: Any, templates: list[str] | None = None) -> dict:
    """A figure (a viz FigureSpec or a plotly figure) as the dict clUnpack reads: plotly's {"data", "layout"}
    (numeric arrays as base64 typed arrays) with what repeats written once:

    - "common": the trace keys whose values every trace shares (a menu figure's x and y labels, colour
      scale, limits: one heatmap per head), left out of each trace;
    - layout.template: an index into templates (the page's list of template JSON texts, appended to);
    - a menu button's visible list [n traces] as {"on": [indices of the true ones], "n": n};
    - a heatmap's float cells rounded to what its hover shows (".3f": 3 decimals, half away from 0), as int16 steps
      {"dtype": "i2", "bdata", "shape", "steps": decimals} (blank cells -32768), where a step is under 1/500 of
      the colour range (finer than the colour scale draws) and every value fits: half the bytes of float32.
    Every other value is kept exactly; clUnpack rebuilds the figure plotly would get from fig.to_json().
    """
    if hasattr(fig, "to_plotly"):
        fig = fig.to_plotly()
    d = json.loads(fig.to_json())
    data, layout = d.get("data") or [], d.get("layout") or {}
    for trace in data:
        steps = _int_steps(trace)
        if steps is not None:
            trace["z"] = steps
    if len(data) > 1:
        texts = [{k: json_text(v, sort_keys=True) for k, v in t.items()} for t in data]
        shared = [k for k, v in texts[0].items() if len(v) >= 16 and all(t.get(k) == v for t in texts[1:])]
        if shared:
            d["common"] = {k: data[0][k] for k in shared}
            d["data"] = [{k: v for k, v in t.items() if k not in d["common"]} for t in data]
    if templates is not None and "template" in layout:
        text = json_text(layout["template"], sort_keys=True, separators=(",", ":"))
        if text not in templates:
            templates.append(text)
        layout["template"] = templates.index(text)
    for menu in layout.get("updatemenus") or []:
        for button in menu.get("buttons") or []:
            for arg in button.get("args") or []:
                vis = arg.get("visible") if isinstance(arg, dict) else None
                if isinstance(vis, list) and vis and all(isinstance(v, bool) for v in vis):
                    arg["visible"] = {"on": [i for i, v in enumerate(vis) if v], "n": len(vis)}
    return d


Z_FORMAT = re.compile(r"%\{z(?::([^}]*))?\}")
BLANK = -32768  # an int16 step that stands for a blank (NaN) cell


def _int_steps(trace: dict) -> dict | None:
    """A heatmap trace's z ({"dtype": "f4" or "f8", "bdata", "shape"}) as int16 steps of 10^-n, n the decimals
    its hover (and cell text) shows (every z format there ".nf", the same n); None where that would show other
    values, draw other colours (a step of 1/500 of the colour range or more) or not fit."""
    z = trace.get("z")
    if trace.get("type") != "heatmap" or not isinstance(z, dict) or z.get("dtype") not in ("f4", "f8"):
        return None
    formats = Z_FORMAT.findall(f"{trace.get('hovertemplate', '')} {trace.get('texttemplate', '')}")
    decimals = {m.group(1) if (m := re.fullmatch(r"\.(\d)f", f)) else None for f in formats}
    if len(decimals) != 1 or None in decimals:  # fewer decimals in a cell's text could round the other way
        return None
    n = int(decimals.pop() or 0)
    values = np.frombuffer(base64.b64decode(z["bdata"]), dtype="<f4" if z["dtype"] == "f4" else "<f8")
    values = values.astype(np.float64)
    finite = values[np.isfinite(values)]
    if not finite.size or np.isinf(values).any():
        return None
    lo = float(trace["zmin"]) if trace.get("zmin") is not None else float(finite.min())
    hi = float(trace["zmax"]) if trace.get("zmax") is not None else float(finite.max())
    scaled = finite * 10.0 ** n
    steps = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # half away from 0, as the hover's toFixed rounds
    if hi - lo < 500 * 10.0 ** -n or np.abs(steps).max() > 32767:
        return None
    q = np.full(values.shape, BLANK, dtype="<i2")
    q[np.isfinite(values)] = steps
    return {"dtype": "i2", "bdata": base64.b64encode(q.tobytes()).decode("ascii"), "shape": z.get("shape"), "steps": n}
