"""Tokens shaded by a score: input attribution as plain HTML (inline styles, nothing fetched; offline)."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from circuitlab.analysis.input_attribution import InputAttribution
from circuitlab.display import renders
from circuitlab.viz import token_label


def _shade(value: float, scale: float) -> str:
    """Blue for positive, red for negative, opacity by |value| / scale."""
    a = 0.0 if scale <= 0 else min(1.0, abs(value) / scale)
    rgb = "33,102,172" if value >= 0 else "178,24,43"
    return f"rgba({rgb},{a:.3f})"


def shaded_tokens_html(tokens: Sequence[str], scores: Sequence[float], mark: int | None = None,
                       label: str = "") -> str:
    """One line of tokens, each with its background shaded by its score (title: the exact score);
    `mark` outlines one position (the one whose prediction is explained)."""
    scale = max((abs(s) for s in scores), default=0.0)
    cells = []
    for i, (tok, s) in enumerate(zip(tokens, scores)):
        outline = "outline:2px solid #222;" if i == mark else ""
        cells.append(f'<span title="pos {i}: {s:.4g}" style="background:{_shade(s, scale)};{outline}'
                     f'padding:1px 2px;margin:1px;border-radius:3px;font-family:monospace;white-space:pre">'
                     f"{html.escape(token_label(tok))}</span>")
    head = f'<span style="display:inline-block;min-width:7.5em;color:#555">{html.escape(label)}</span>' if label else ""
    return f'<div style="line-height:1.9">{head}{"".join(cells)}</div>'


def attribution_html(result: Any) -> str:
    """An InputAttribution (or its to_dict()) as HTML: the summary, the shaded tokens, and for context
    mixing one shaded line per layer."""
    d = result if isinstance(result, dict) else result.to_dict()
    strs = d.get("token_strs") or [str(t) for t in d["tokens"]]
    parts = [f'<div style="font-family:sans-serif;font-size:13px"><b>{html.escape(d["summary"])}</b>',
             shaded_tokens_html(strs, d["scores"], d["pos"], "all layers" if d.get("per_layer") else "")]
    for layer, row in enumerate(d.get("per_layer") or []):
        parts.append(shaded_tokens_html(strs, row, d["pos"], f"layer {layer}"))
    parts.append('<div style="color:#555">blue: pushes the metric up, red: down; hover a token for its score'
                 "</div></div>")
    return "".join(parts)


def attribution_methods_html(results: Mapping[str, Any]) -> str:
    """Several attributions of the same prediction (method -> InputAttribution or its to_dict()): one line
    of shaded tokens per method, each on its own scale (the methods' units differ), with its top tokens."""
    parts = ['<div style="font-family:sans-serif;font-size:13px">']
    for method, result in results.items():
        d = result if isinstance(result, Mapping) else result.to_dict()
        strs = d.get("token_strs") or [str(t) for t in d["tokens"]]
        parts.append(shaded_tokens_html(strs, d["scores"], d["pos"], method))
    parts.append('<div style="color:#555">each line on its own scale; blue: pushes the metric up, red: down; the '
                 "outlined token is the one whose next-token prediction is explained; hover a token for its score"
                 "</div></div>")
    return "".join(parts)


# How an InputAttribution displays in Jupyter (circuitlab.display): its tokens, shaded.
renders(InputAttribution)(attribution_html)
