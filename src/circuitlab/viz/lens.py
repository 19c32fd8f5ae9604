"""Views of the residual stream: the logit lens table and direct logit attribution bars."""
from __future__ import annotations

from typing import Any

import numpy as np

from circuitlab.viz import token_label
from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, Series, as_array, field_of


def logit_lens_figure(lens: Any, max_positions: int = 40) -> FigureSpec:
    """Rows: residual after embed / each layer; columns: the last max_positions positions. Colour: the
    top-1 next token's probability; text: that token; hover: the top-k with probabilities and the
    probability of the model's final answer. lens: LogitLens or its to_dict()."""
    labels = list(field_of(lens, "labels"))
    top_probs = as_array(field_of(lens, "top_probs"))  # [point, pos, k]
    tokens = list(field_of(lens, "tokens"))
    token_strs = field_of(lens, "token_strs") or [str(t) for t in tokens]
    top_strs = field_of(lens, "top_strs")
    if top_strs is None:
        top = field_of(lens, "top_tokens")
        top = top.tolist() if hasattr(top, "tolist") else top
        top_strs = [[[str(t) for t in row] for row in point] for point in top]
    final = field_of(lens, "final_top_probs")
    final = as_array(final) if final is not None else None
    n_pos = len(tokens)
    positions = range(max(0, n_pos - max_positions), n_pos)
    text, hover = [], []
    for i in range(len(labels)):
        text.append([token_label(top_strs[i][p][0], 8) for p in positions])
        row = []
        for p in positions:
            topk = "\n".join(f"{token_label(s, 16)}: {float(top_probs[i, p, j]):.3f}"
                             for j, s in enumerate(top_strs[i][p]))
            extra = f"\np(final answer): {float(final[i, p]):.3f}" if final is not None else ""
            row.append(f"top-{len(top_strs[i][p])}:\n{topk}{extra}")
        hover.append(row)
    inputs = [token_label(token_strs[p], 10) for p in positions]
    heat = Heatmap(top_probs[:, positions.start:, 0], [f"{s} (pos {p})" for s, p in zip(inputs, positions)], labels,
                   0.0, 1.0, "Blues", x_ticks=inputs, text=text, hover=hover, value_name="p(top-1)",
                   value_format=".3f")
    name = str(field_of(lens, "name", None) or "logit lens")  # a tuned lens's read-out names itself
    title = f"{name[:1].upper() + name[1:]}: top-1 next token and its probability"
    return FigureSpec([Panel(heatmap=heat, x_title="input token (prediction is for the next one)",
                             y_title="residual after")], title,
                      height=max(260, 40 * len(labels) + 200), width=max(700, 38 * len(inputs) + 150))


def logit_attribution_figure(dla: Any, n: int = 20, title: str | None = None) -> FigureSpec:
    """Horizontal bars of the n components with the largest mean |direct logit attribution|, biggest on top
    (red: negative). dla: LogitAttribution or its to_dict()."""
    labels = list(field_of(dla, "labels"))
    mean = field_of(dla, "mean")
    values = as_array(mean() if callable(mean) else mean)
    order = np.argsort(-np.abs(np.nan_to_num(values)), kind="stable")[:n]
    vals = [float(values[i]) for i in order]
    bars = Series([labels[i] for i in order], vals, kind="hbar",
                  color=["#d62728" if v < 0 else "#1f77b4" for v in vals])
    what = "logit difference" if field_of(dla, "wrong") is not None else "logit"
    return FigureSpec([Panel(series=[bars], x_title=f"direct contribution to the {what}")],
                      title or f"Direct logit attribution at position {field_of(dla, 'pos')}")
