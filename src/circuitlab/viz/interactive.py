"""Interactive figures (plotly) for the HTML report, Jupyter display and the web app.

Every builder is a pure function of tensors / lists / result objects (or their ``to_dict()`` form, as
stored in results.json) and returns a ``plotly.graph_objects.Figure``; nothing here reads or writes
files. Turn a figure into HTML with ``fig.to_html(full_html=False, include_plotlyjs=False)`` (the
report inlines plotly.js once) or ``notebook_html(fig)`` (Jupyter).

    attention_figure(tokens, patterns, head_names=None, labels=None, title=..., active=None)
        tokens: list[str] [pos]; patterns [n_heads_total, q, k] or [n_layers, n_heads, q, k] (flattened
        to heads "L{l}H{h}"); labels: head name -> label ("induction"); active: the head shown first.
        One heatmap per head, a dropdown picks the head; hover: query token, key token, weight. The
        causal upper triangle is blank.
    training_curves_figure(curves, phase_change=None)
        curves: run name -> metrics.jsonl records (or one run's records); phase_change: the demo's
        phase_change dict (keys "tokens", ...), or run name -> such a dict. Loss (train, val, repeated
        tokens) and best induction / previous-token score against tokens seen; the phase change is a
        dashed line inside a shaded band (the best induction score's rise: from the last point below 20% of
        it to the first at 80%).
    heatmap_figure(matrix, row_labels=None, col_labels=None, title="", ...)
        matrix [rows, cols] (tensor, array or nested lists, NaN/None blank); a diverging scale centred
        at 0 by default. For QK/OV circuits, patching, ablation and composition scores.
    head_scores_figure(scores, title=...)
        scores: detector name -> [layer][head]; one [layer, head] heatmap per detector, a dropdown picks it.
    logit_lens_figure(lens, max_positions=40)
        lens: LogitLens or LogitLens.to_dict(); top-1 probability per (residual point, position),
        the top-1 token written in each cell, the top-k in the hover.
    logit_attribution_figure(dla, n=20)
        dla: LogitAttribution or its to_dict(); bars of the n largest mean direct attributions.
    patching_figure(result, tokens=None, value="recovery")
        result: PatchResult or its to_dict(); [layer, pos] / [layer, head] one heatmap, 3-D results one
        panel per layer (heads down, positions across).
    probe_figure(results)
        results: ProbeResult, or task name -> ProbeResult / to_dict(); val score by residual point,
        dashed random-label control, dotted chance.
    lines_figure(x, series, title="", x_title="", y_title="", category=False)
        series: name -> values [len(x)]; one line per series (lens KL by layer, steering by coefficient).

`notebook_html(fig)` gives a figure's HTML for ``_repr_html_`` (plotly.js inlined, see NOTEBOOK_PLOTLYJS).
"""
from __future__ import annotations

import html
import math
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from circuitlab.analysis.attribution import LogitAttribution
from circuitlab.analysis.heads import AttentionPatterns
from circuitlab.analysis.lens import LogitLens
from circuitlab.analysis.patching import PatchResult
from circuitlab.analysis.probing import ProbeResult
from circuitlab.display import renders
from circuitlab.names import head_name
from circuitlab.training.phase import best_head_score, phase_band
from circuitlab.viz import token_label

TEMPLATE = "plotly_white"
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


# ---------------------------------------------------------------------------- helpers


def _array(x: Any) -> np.ndarray:
    """A tensor / array / nested list (None = missing) as a float numpy array with NaN for missing."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return np.array(_none_to_nan(x), dtype=np.float64)


def _none_to_nan(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_none_to_nan(v) for v in x]
    return float("nan") if x is None else x


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """obj.name for a result object, obj[name] for its to_dict() form."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _esc(s: str) -> str:
    """Safe inside plotly's hover / tick text, which understands a few HTML tags."""
    return html.escape(s, quote=False)


def _tick_step(n: int, most: int = 48) -> int:
    return max(1, math.ceil(n / most))


# ---------------------------------------------------------------------------- attention


def head_names_for(n_layers: int, n_heads: int) -> list[str]:
    return [head_name(l, h) for l in range(n_layers) for h in range(n_heads)]


def attention_figure(tokens: Sequence[str], patterns: Any, head_names: Sequence[str] | None = None,
                     labels: Mapping[str, str] | None = None, title: str = "Attention pattern",
                     active: str | None = None) -> go.Figure:
    """One heatmap trace per head (only one visible: `active`, default the first) and a dropdown to
    choose the head.

    tokens: the sequence's token strings [pos]; patterns [heads, query, key] or [layers, heads, query, key];
    head_names: one per head (default "L{l}H{h}" for 4-D input, else "H{i}"); labels: head name -> label,
    shown in the dropdown and the title.
    """
    p = _array(patterns)
    if p.ndim == 4:
        names = list(head_names) if head_names is not None else head_names_for(p.shape[0], p.shape[1])
        p = p.reshape(-1, *p.shape[2:])
    elif p.ndim == 3:
        names = list(head_names) if head_names is not None else [f"H{i}" for i in range(p.shape[0])]
    else:
        raise ValueError(f"patterns must be [heads, q, k] or [layers, heads, q, k], got shape {p.shape}")
    n_q, n_k = p.shape[1:]
    if len(names) != p.shape[0]:
        raise ValueError(f"{len(names)} head names for {p.shape[0]} heads")
    if active is not None and active not in names:
        raise ValueError(f"no head named {active!r}")
    first = names.index(active) if active is not None else 0
    if len(tokens) < n_k or n_q > n_k:
        raise ValueError(f"{len(tokens)} tokens for patterns over {n_q} queries and {n_k} keys")
    p = p.copy()
    causal = np.triu(np.ones((n_q, n_k), dtype=bool), k=1 + n_k - n_q)
    p[:, causal] = np.nan  # keys after the query: blank, not 0
    p = np.round(p, 4).astype(np.float32)
    labels = dict(labels or {})
    shown = [token_label(t, 12) for t in tokens]
    # Categories are unique ("tok (pos i)"), so repeated tokens keep their own rows and columns;
    # the hover reads them, the ticks show the token alone.
    keys = [f"{_esc(shown[j])} (pos {j})" for j in range(n_k)]
    off = n_k - n_q  # queries are the last n_q positions (all of them in the usual square pattern)
    queries = [f"{_esc(shown[off + i])} (pos {off + i})" for i in range(n_q)]

    def head_title(name: str) -> str:
        lab = labels.get(name)
        return f"{title}: {name}" + (f" ({lab})" if lab else "")

    fig = go.Figure()
    for i, name in enumerate(names):
        fig.add_trace(go.Heatmap(
            z=p[i], x=keys, y=queries, name=name, visible=i == first, zmin=0.0, zmax=1.0, colorscale="Blues",
            hoverongaps=False, colorbar=dict(title=dict(text="weight"), thickness=12),
            hovertemplate="query: %{y}<br>key: %{x}<br>weight: %{z:.3f}<extra>" + _esc(name) + "</extra>"))
    step = _tick_step(max(n_q, n_k))
    buttons = []
    for i, name in enumerate(names):
        lab = labels.get(name)
        buttons.append(dict(label=name + (f" ({lab})" if lab else ""), method="update",
                            args=[{"visible": [j == i for j in range(len(names))]},
                                  {"title.text": _esc(head_title(name))}]))
    side = min(900, max(420, 16 * max(n_q, n_k) + 160))
    fig.update_layout(
        template=TEMPLATE, title=dict(text=_esc(head_title(names[first]))), width=side + 60, height=side,
        margin=dict(l=90, r=40, t=90, b=90),
        updatemenus=[dict(buttons=buttons, direction="down", showactive=True, active=first, x=1.0, xanchor="right",
                          y=1.12, yanchor="top")],
        xaxis=dict(title=dict(text="key"), type="category", tickmode="array", tickvals=keys[::step],
                   ticktext=[_esc(s) for s in shown[:n_k:step]], tickangle=-90, side="bottom"),
        yaxis=dict(title=dict(text="query"), type="category", autorange="reversed", tickmode="array",
                   tickvals=queries[::step], ticktext=[_esc(s) for s in shown[off:off + n_q:step]]))
    return fig


# ---------------------------------------------------------------------------- training


def _longest_period(tracked: Sequence[Mapping]) -> str | None:
    """The longest period tracked in "induction_by_period" (keys are periods as strings), if any."""
    periods = {int(p) for r in tracked for p in (r.get("induction_by_period") or {})}
    return str(max(periods)) if periods else None


def training_curves_figure(curves: Mapping[str, Sequence[Mapping]] | Sequence[Mapping],
                           phase_change: Mapping[str, Any] | None = None) -> go.Figure:
    """Left: train loss, val loss and loss on the repeated half of random sequences; middle: the best
    head's induction and previous-token scores, and the best induction score on [r, r] at the longest
    tracked period; right: the in-context-learning score on natural text (loss late in the context minus
    early: it falls when induction heads form); x: tokens seen. The phase change (the demo's
    phase_change dict, or run name -> dict) is a dashed line in a shaded band on every panel: the
    training loss's bump (a slower fall, or a rise) lies inside it."""
    if not isinstance(curves, Mapping):
        curves = {"run": list(curves)}
    if phase_change is not None and "tokens" in phase_change:
        phase_change = {next(iter(curves), "run"): phase_change}
    phase_change = dict(phase_change or {})
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Loss", "Head scores", "In-context learning score"),
                        horizontal_spacing=0.07)
    for i, (name, records) in enumerate(curves.items()):
        color = COLORS[i % len(COLORS)]
        logged = [r for r in records if "loss" in r]
        if logged:
            fig.add_trace(go.Scatter(x=[r["tokens"] for r in logged], y=[r["loss"] for r in logged], mode="lines",
                                     name=f"{name} train loss", line=dict(color=color, width=1), opacity=0.5,
                                     legendgroup=name), row=1, col=1)
        val = [r for r in records if "val_loss" in r]
        if val:
            fig.add_trace(go.Scatter(x=[r["tokens"] for r in val], y=[r["val_loss"] for r in val],
                                     mode="lines+markers", name=f"{name} val loss", legendgroup=name,
                                     line=dict(color=color, dash="dot"), marker=dict(size=4)), row=1, col=1)
        tracked = [r for r in records if "induction" in r]
        if tracked:
            x = [r["tokens"] for r in tracked]
            fig.add_trace(go.Scatter(x=x, y=[r.get("repeat_loss") for r in tracked], mode="lines",
                                     name=f"{name} loss on repeated tokens", legendgroup=name,
                                     line=dict(color=color, dash="dash")), row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=[best_head_score(r["induction"]) for r in tracked], mode="lines",
                                     name=f"{name} best induction score", legendgroup=name,
                                     line=dict(color=color)), row=1, col=2)
            fig.add_trace(go.Scatter(x=x, y=[best_head_score(r.get("prev_token")) for r in tracked], mode="lines",
                                     name=f"{name} best previous-token score", legendgroup=name,
                                     line=dict(color=color, dash="dot")), row=1, col=2)
            longest = _longest_period(tracked)
            if longest is not None:
                fig.add_trace(go.Scatter(x=x, y=[(r.get("induction_by_period") or {}).get(longest) for r in tracked],
                                         mode="lines", name=f"{name} best induction score, [r, r] period {longest}",
                                         legendgroup=name, line=dict(color=color, dash="dashdot")), row=1, col=2)
        icl = [r for r in records if r.get("icl") is not None]
        if icl:
            fig.add_trace(go.Scatter(x=[r["tokens"] for r in icl], y=[r["icl"] for r in icl], mode="lines+markers",
                                     name=f"{name} in-context learning score", legendgroup=name,
                                     line=dict(color=color), marker=dict(size=3)), row=1, col=3)
        pc = phase_change.get(name)
        if pc and pc.get("tokens") is not None:
            band = phase_band(records)
            for col in (1, 2, 3):
                if band and band[1] > band[0]:
                    fig.add_vrect(x0=band[0], x1=band[1], fillcolor=color, opacity=0.12, line_width=0,
                                  row=1, col=col)
                fig.add_vline(x=pc["tokens"], line=dict(color=color, dash="dash", width=1.5), row=1, col=col)
            fig.add_annotation(x=pc["tokens"], y=1.0, yref="y2 domain", xref="x2", showarrow=False,
                               yanchor="bottom", text=f"{_esc(name)} phase change (step {pc.get('step', '?')})",
                               font=dict(size=10, color=color))
    fig.update_xaxes(title_text="tokens seen")
    fig.update_yaxes(title_text="loss (nats)", row=1, col=1)
    fig.update_yaxes(title_text="score", range=[0, 1.05], row=1, col=2)
    fig.update_yaxes(title_text="late minus early loss (nats)", row=1, col=3)
    fig.update_layout(template=TEMPLATE, height=450, margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.2, font=dict(size=10)), hovermode="x unified")
    return fig


def induction_by_period_figure(sweeps: Mapping[str, Mapping[str, Any]], min_score: float = 0.6,
                               max_loss: float = 2.0) -> go.Figure:
    """sweeps: model name -> PeriodSweep.to_dict(). Left: the best head's induction score on [r, r] by
    period (hover names the head); right: the loss on the first and the second copy; the demo's targets
    as grey dashed lines."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Induction score on [r, r] by period",
                                                        "Loss on [r, r] by period"), horizontal_spacing=0.1)
    for i, (name, sweep) in enumerate(sweeps.items()):
        color = COLORS[i % len(COLORS)]
        fig.add_trace(go.Scatter(x=sweep["periods"], y=sweep["best"], mode="lines+markers", name=f"{name} best head",
                                 text=sweep.get("best_head"), legendgroup=name, line=dict(color=color),
                                 hovertemplate="period %{x}: %{y:.3f} (%{text})<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=sweep["periods"], y=sweep["loss_second"], mode="lines+markers",
                                 name=f"{name} loss on the second copy", legendgroup=name,
                                 line=dict(color=color)), row=1, col=2)
        fig.add_trace(go.Scatter(x=sweep["periods"], y=sweep["loss_first"], mode="lines",
                                 name=f"{name} loss on the first copy", legendgroup=name,
                                 line=dict(color=color, dash="dot")), row=1, col=2)
    fig.add_hline(y=min_score, line=dict(color="grey", dash="dash", width=1), row=1, col=1)
    fig.add_hline(y=max_loss, line=dict(color="grey", dash="dash", width=1), row=1, col=2)
    fig.update_xaxes(title_text="period of r")
    fig.update_yaxes(title_text="induction score", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="loss (nats)", rangemode="tozero", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=400, margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.22, font=dict(size=10)))
    return fig


# ---------------------------------------------------------------------------- heatmaps


def heatmap_figure(matrix: Any, row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
                   title: str = "", *, x_title: str = "", y_title: str = "", zmid: float | None = 0.0,
                   zmin: float | None = None, zmax: float | None = None, colorscale: str = "RdBu_r",
                   value_name: str = "value", annotate: bool | None = None) -> go.Figure:
    """A heatmap of matrix [rows, cols], rows top to bottom; labels are shown as given (pass token
    strings through token_label to make spaces and control characters visible). zmid=0 centres a diverging scale on 0
    (symmetric limits unless zmin/zmax are given); zmid=None uses zmin..zmax (or the data range).
    annotate: write the values in the cells (default: when there are at most 150 cells)."""
    m = _array(matrix)
    if m.ndim != 2:
        raise ValueError(f"heatmap_figure needs a 2-D matrix, got shape {m.shape}")
    rows = [_esc(str(s)) for s in row_labels] if row_labels is not None else [str(i) for i in range(m.shape[0])]
    cols = [_esc(str(s)) for s in col_labels] if col_labels is not None else [str(i) for i in range(m.shape[1])]
    finite = m[np.isfinite(m)]
    if zmid is not None and zmin is None and zmax is None:
        lim = float(np.abs(finite - zmid).max()) if finite.size else 1.0
        zmin, zmax = zmid - (lim or 1.0), zmid + (lim or 1.0)
    # Duplicate labels (a token appearing twice) would merge rows on a category axis: number them.
    y = _unique(rows)
    x = _unique(cols)
    if annotate is None:
        annotate = m.size <= 150
    fig = go.Figure(go.Heatmap(
        z=np.round(m, 5).astype(np.float32), x=x, y=y, zmin=zmin, zmax=zmax, zmid=None if zmin is not None else zmid,
        colorscale=colorscale, hoverongaps=False, colorbar=dict(thickness=12),
        texttemplate="%{z:.2f}" if annotate else None, textfont=dict(size=10),
        hovertemplate=f"{_esc(y_title) or 'row'}: %{{y}}<br>{_esc(x_title) or 'column'}: %{{x}}<br>"
                      f"{_esc(value_name)}: %{{z:.4g}}<extra></extra>"))
    height = min(900, max(280, 22 * m.shape[0] + 160))
    fig.update_layout(template=TEMPLATE, title=dict(text=_esc(title)), height=height,
                      margin=dict(l=90, r=30, t=60, b=90),
                      xaxis=dict(title=dict(text=_esc(x_title)), type="category", tickangle=-90 if len(x) > 8 else 0),
                      yaxis=dict(title=dict(text=_esc(y_title)), type="category", autorange="reversed"))
    return fig


def _unique(labels: list) -> list:
    seen: dict[Any, int] = {}
    out = []
    for s in labels:
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.append(s if n == 0 else f"{s} #{n + 1}")
    return out


def head_scores_figure(scores: Mapping[str, Any], title: str = "Head scores") -> go.Figure:
    """One [layer, head] heatmap per detector (0..1), a dropdown picks the detector."""
    names = list(scores)
    fig = go.Figure()
    for i, name in enumerate(names):
        m = _array(scores[name])
        fig.add_trace(go.Heatmap(
            z=np.round(m, 4), x=[f"H{h}" for h in range(m.shape[1])], y=[f"L{l}" for l in range(m.shape[0])],
            zmin=0, zmax=1, colorscale="Blues", visible=i == 0, texttemplate="%{z:.2f}", name=name,
            hovertemplate="%{y}%{x}: %{z:.3f}<extra>" + _esc(name) + "</extra>", colorbar=dict(thickness=12)))
    buttons = [dict(label=name.replace("_", " "), method="update",
                    args=[{"visible": [j == i for j in range(len(names))]},
                          {"title.text": f"{_esc(title)}: {_esc(name.replace('_', ' '))}"}])
               for i, name in enumerate(names)]
    n_layers = _array(scores[names[0]]).shape[0] if names else 1
    fig.update_layout(template=TEMPLATE, height=min(700, 200 + 40 * n_layers),
                      title=dict(text=f"{_esc(title)}: {_esc(names[0].replace('_', ' '))}" if names else title),
                      updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.25,
                                        yanchor="top")],
                      yaxis=dict(autorange="reversed", type="category"), xaxis=dict(type="category"),
                      margin=dict(l=60, r=30, t=80, b=40))
    return fig


# ---------------------------------------------------------------------------- residual stream


def logit_lens_figure(lens: Any, max_positions: int = 40) -> go.Figure:
    """Rows: residual after embed / each layer; columns: the last max_positions positions. Colour: the
    top-1 next token's probability; text: that token; hover: the top-k with probabilities and the
    probability of the model's final answer."""
    labels = list(_field(lens, "labels"))
    top_probs = _array(_field(lens, "top_probs"))  # [point, pos, k]
    tokens = list(_field(lens, "tokens"))
    token_strs = _field(lens, "token_strs") or [str(t) for t in tokens]
    top_strs = _field(lens, "top_strs")
    top_tokens = _field(lens, "top_tokens")
    if top_strs is None:
        ids = top_tokens.tolist() if hasattr(top_tokens, "tolist") else top_tokens
        top_strs = [[[str(t) for t in row] for row in point] for point in ids]
    final = _field(lens, "final_top_probs")
    final = _array(final) if final is not None else None
    n_pos = len(tokens)
    start = max(0, n_pos - max_positions)
    z = top_probs[:, start:, 0]
    text, hover = [], []
    for i in range(len(labels)):
        text.append([_esc(token_label(top_strs[i][p][0], 8)) for p in range(start, n_pos)])
        row = []
        for p in range(start, n_pos):
            topk = "<br>".join(f"{_esc(token_label(s, 16))}: {float(top_probs[i, p, j]):.3f}"
                               for j, s in enumerate(top_strs[i][p]))
            extra = f"<br>p(final answer): {float(final[i, p]):.3f}" if final is not None else ""
            row.append(f"top-{len(top_strs[i][p])}:<br>{topk}{extra}")
        hover.append(row)
    x = [f"{_esc(token_label(token_strs[p], 10))} (pos {p})" for p in range(start, n_pos)]
    fig = go.Figure(go.Heatmap(
        z=np.round(z, 4), x=x, y=labels, text=text, customdata=hover, texttemplate="%{text}", textfont=dict(size=9),
        zmin=0, zmax=1, colorscale="Blues", colorbar=dict(title=dict(text="p(top-1)"), thickness=12),
        hovertemplate="residual after %{y}, input %{x}<br>%{customdata}<extra></extra>"))
    name = str(_field(lens, "name", None) or "logit lens")
    fig.update_layout(template=TEMPLATE, title=dict(text=f"{_esc(name[:1].upper() + name[1:])}: top-1 next token and "
                                                         "its probability"),
                      height=max(260, 40 * len(labels) + 200), width=max(700, 38 * len(x) + 150),
                      xaxis=dict(title=dict(text="input token (prediction is for the next one)"), type="category",
                                 tickangle=-90, tickmode="array", tickvals=x,
                                 ticktext=[_esc(token_label(token_strs[p], 10)) for p in range(start, n_pos)]),
                      yaxis=dict(title=dict(text="residual after"), type="category", autorange="reversed"),
                      margin=dict(l=70, r=30, t=60, b=110))
    return fig


def logit_attribution_figure(dla: Any, n: int = 20, title: str | None = None) -> go.Figure:
    """Horizontal bars of the n components with the largest mean |direct logit attribution|, biggest on top."""
    labels = list(_field(dla, "labels"))
    mean = _field(dla, "mean")
    values = _array(mean() if callable(mean) else mean)
    order = np.argsort(-np.abs(np.nan_to_num(values)), kind="stable")[:n][::-1]
    names = [_esc(labels[i]) for i in order]
    vals = [float(values[i]) for i in order]
    wrong = _field(dla, "wrong")
    what = "logit difference" if wrong is not None else "logit"
    colors = ["#d62728" if v < 0 else "#1f77b4" for v in vals]
    fig = go.Figure(go.Bar(x=vals, y=names, orientation="h", marker_color=colors,
                           hovertemplate="%{y}: %{x:+.4f}<extra></extra>"))
    pos = _field(dla, "pos")
    fig.update_layout(template=TEMPLATE, height=max(260, 24 * len(names) + 120),
                      title=dict(text=_esc(title or f"Direct logit attribution at position {pos}")),
                      xaxis=dict(title=dict(text=f"direct contribution to the {what}"), zeroline=True,
                                 zerolinecolor="black"),
                      yaxis=dict(type="category"), margin=dict(l=110, r=30, t=60, b=50))
    return fig


# ---------------------------------------------------------------------------- causal


def patching_figure(result: Any, tokens: Sequence[str] | None = None, value: str = "recovery",
                    title: str | None = None) -> go.Figure:
    """A PatchResult (or its to_dict()) as heatmaps of value "recovery" (1 = clean behaviour, 0 =
    corrupted), "effect" (change from the patched run's base) or "values".

    [layer, pos] / [layer, head]: one heatmap, layers down; [layer, pos, head] / [layer, head, dest_pos]:
    one panel per layer, heads down and positions across.
    """
    values = _array(_field(result, "values"))
    clean, corrupt = float(_field(result, "clean_value")), float(_field(result, "corrupt_value"))
    direction = _field(result, "direction", "denoise")
    axes = list(_field(result, "axes"))
    if axes and axes[0] == "layer":  # the to_dict() form lists the layer axis too
        axes = axes[1:]
    layers = list(_field(result, "layers"))
    if value == "recovery":
        grid = (values - corrupt) / (clean - corrupt) if clean != corrupt else np.full_like(values, np.nan)
    elif value == "effect":
        grid = values - (corrupt if direction == "denoise" else clean)
    elif value == "values":
        grid = values
    else:
        raise ValueError(f"value must be recovery, effect or values, not {value!r}")
    target = _field(result, "target")
    name = title or (f"{_field(result, 'method', 'activation')} patching: {target} "
                     f"({value}, metric {_field(result, 'metric', 'metric')}, {direction})")
    limits = dict(zmin=-1.0, zmax=1.0) if value == "recovery" else {}

    def pos_labels(n: int) -> list[str]:
        return [f"{i} {token_label(tokens[i], 10)}" if tokens is not None and i < len(tokens) else str(i)
                for i in range(n)]

    axis_labels = {"pos": pos_labels, "dest_pos": pos_labels, "head": lambda n: [f"H{h}" for h in range(n)]}
    if len(axes) == 1:
        return heatmap_figure(grid, [f"L{l}" for l in layers], axis_labels[axes[0]](grid.shape[1]), name,
                              x_title="position" if axes[0] == "pos" else axes[0], y_title="layer",
                              value_name=value, colorscale="RdBu", annotate=False, **limits)
    per_layer = grid if axes[0] == "head" else np.swapaxes(grid, 1, 2)  # [layer, head, pos]
    n_heads, n_pos = per_layer.shape[1:]
    fig = make_subplots(rows=len(layers), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[f"layer {l}" for l in layers])
    finite = per_layer[np.isfinite(per_layer)]
    lim = limits.get("zmax") or (float(np.abs(finite).max()) if finite.size else 1.0) or 1.0
    xs = _unique([_esc(s) for s in pos_labels(n_pos)])
    for i, l in enumerate(layers):
        fig.add_trace(go.Heatmap(z=np.round(per_layer[i], 5).astype(np.float32), x=xs,
                                 y=[f"H{h}" for h in range(n_heads)],
                                 zmin=-lim, zmax=lim, colorscale="RdBu", hoverongaps=False, showscale=i == 0,
                                 colorbar=dict(thickness=12),
                                 hovertemplate=f"L{l}%{{y}} at %{{x}}: %{{z:.3f}}<extra>{value}</extra>"),
                      row=i + 1, col=1)
        fig.update_yaxes(autorange="reversed", type="category", row=i + 1, col=1)
    fig.update_xaxes(type="category", tickangle=-90)
    fig.update_layout(template=TEMPLATE, title=dict(text=_esc(name)),
                      height=min(1400, 120 + len(layers) * (60 + 18 * n_heads)),
                      margin=dict(l=60, r=30, t=70, b=90))
    return fig


def probe_figure(results: Any) -> go.Figure:
    """Val score by residual point, one colour per task: solid = probe, dashed = random-label control,
    dotted = chance. results: a ProbeResult, or task name -> ProbeResult / ProbeResult.to_dict()."""
    if _field(results, "points") is not None and _field(results, "val_score") is not None:
        results = {_field(results, "task", "probe"): results}
    fig = go.Figure()
    for i, (name, res) in enumerate(results.items()):
        color = COLORS[i % len(COLORS)]
        points = list(_field(res, "points"))
        score = _field(res, "score", "score")
        fig.add_trace(go.Scatter(x=points, y=_array(_field(res, "val_score")).tolist(), mode="lines+markers",
                                 name=f"{name} ({score})", line=dict(color=color), legendgroup=name,
                                 hovertemplate=f"{_esc(name)} at %{{x}}: val {score} %{{y:.3f}}<extra></extra>"))
        control = _array(_field(res, "control_score"))
        if np.isfinite(control).any():
            fig.add_trace(go.Scatter(x=points, y=control.tolist(), mode="lines", name=f"{name} control",
                                     line=dict(color=color, dash="dash"), opacity=0.7, legendgroup=name))
        chance = _field(res, "chance")
        if chance is not None:
            fig.add_trace(go.Scatter(x=points, y=[float(chance)] * len(points), mode="lines",
                                     name=f"{name} chance", line=dict(color=color, dash="dot", width=1),
                                     legendgroup=name, hoverinfo="skip"))
    fig.update_layout(template=TEMPLATE, height=400, title=dict(text="Linear probes by layer"),
                      xaxis=dict(title=dict(text="residual stream point"), type="category"),
                      yaxis=dict(title=dict(text="val score"), range=[-0.05, 1.05]),
                      margin=dict(l=60, r=30, t=60, b=50))
    return fig


def lines_figure(x: Sequence[Any], series: Mapping[str, Sequence[float]], title: str = "", x_title: str = "",
                 y_title: str = "", category: bool = False) -> go.Figure:
    """One line with markers per named series [len(x)] against x (category: x as labels, in order).
    For the tuned lens's and the logit lens's KL by layer, and a steering sweep by coefficient."""
    fig = go.Figure()
    for i, (name, ys) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(x), y=[float("nan") if v is None else float(v) for v in ys],
                                 mode="lines+markers", name=_esc(name), line=dict(color=COLORS[i % len(COLORS)]),
                                 hovertemplate=f"{_esc(name)} at %{{x}}: %{{y:.4g}}<extra></extra>"))
    fig.update_layout(template=TEMPLATE, height=360, title=dict(text=_esc(title)),
                      xaxis=dict(title=dict(text=_esc(x_title)), type="category" if category else "-"),
                      yaxis=dict(title=dict(text=_esc(y_title))), margin=dict(l=60, r=30, t=60, b=50))
    return fig


# ---------------------------------------------------------------------------- Jupyter

# "once": plotly.js (about 4.8 MB) goes into the first figure a Python process displays, later ones
# reuse it (the page's window.Plotly); "always": into every figure (needed where each output is its own
# page, as in Colab, which "auto" detects). Both work offline.
NOTEBOOK_PLOTLYJS = "auto"
_sent = False


def notebook_html(fig: go.Figure, include_plotlyjs: bool | None = None) -> str:
    """A figure as an HTML fragment for Jupyter's _repr_html_, with no network access: plotly.js is
    inlined the first time (or every time, see NOTEBOOK_PLOTLYJS), and later fragments check that it
    is there."""
    global _sent
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
    note = ("plotly.js is not loaded on this page: run circuitlab.viz.interactive.reset_notebook() and "
            "display this again")
    guard = (f'<script>if (typeof window.Plotly === "undefined") {{ var e = document.getElementById("{div_id}");'
             f' if (e) e.textContent = "{note}"; }}</script>')
    return body + guard


def reset_notebook() -> None:
    """Inline plotly.js again in the next figure displayed (after outputs holding it were cleared)."""
    global _sent
    _sent = False


# ---------------------------------------------------------------------------- result objects


def attention_patterns_figure(view: AttentionPatterns, title: str = "Attention pattern",
                              active: str | None = None) -> go.Figure:
    """The viewer of an AttentionPatterns (analysis.heads.attention_view), opening on head `active`
    (default: the first induction head, if labelled, else L0H0)."""
    if active is None:
        active = next((h for h in view.head_names if "induction" in view.labels.get(h, "")), None)
    return attention_figure(view.tokens, view.patterns, view.head_names, view.labels, title, active)


# How each result object displays in Jupyter (circuitlab.display): its figure, plotly.js inlined.
renders(AttentionPatterns)(lambda view: notebook_html(attention_patterns_figure(view)))
renders(LogitLens)(lambda lens: notebook_html(logit_lens_figure(lens)))
renders(LogitAttribution)(lambda dla: notebook_html(logit_attribution_figure(dla)))
renders(PatchResult)(lambda result: notebook_html(patching_figure(result)))
renders(ProbeResult)(lambda result: notebook_html(probe_figure(result)))
