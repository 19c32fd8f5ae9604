"""Views of attention heads: attention patterns (one head at a time) and detector scores per [layer, head]."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from circuitlab.analysis.heads import AttentionPatterns, HeadClasses
from circuitlab.names import head_name
from circuitlab.viz import token_label
from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, as_array

TITLES = {"previous_token": "previous token", "current_token": "current token", "first_token": "first token (sink)",
          "duplicate_token": "duplicate token", "induction": "induction",
          "entropy": "attention entropy (0 sharp, 1 uniform)"}


def head_names_for(n_layers: int, n_heads: int) -> list[str]:
    return [head_name(l, h) for l in range(n_layers) for h in range(n_heads)]


def attention_figure(tokens: Sequence[str], patterns: Any, head_names: Sequence[str] | None = None,
                     labels: Mapping[str, str] | None = None, title: str = "Attention pattern",
                     active: str | None = None, heads: Sequence[str] | None = None) -> FigureSpec:
    """One [query, key] heatmap per head, shown one at a time (menu; a PNG shows them side by side).

    tokens: the sequence's token strings [pos]; patterns [heads, query, key] or [layers, heads, query, key];
    head_names: one per head (default "L{l}H{h}" for 4-D input, else "H{i}"); labels: head name -> label
    ("induction"); active: the head shown first; heads: keep only these (e.g. for a PNG). Keys after the
    query are blank; hover: query token, key token, weight.
    """
    p = as_array(patterns)
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
    if len(tokens) < n_k or n_q > n_k:
        raise ValueError(f"{len(tokens)} tokens for patterns over {n_q} queries and {n_k} keys")
    p = p.copy()
    p[:, np.triu(np.ones((n_q, n_k), dtype=bool), k=1 + n_k - n_q)] = np.nan  # keys after the query: blank
    labels = dict(labels or {})
    shown = [token_label(t, 12) for t in tokens]
    off = n_k - n_q  # queries are the last n_q positions (all of them in the usual square pattern)
    # Unique ids ("tok (pos i)") keep repeated tokens apart; the ticks show the token alone.
    keys = [f"{shown[j]} (pos {j})" for j in range(n_k)]
    queries = [f"{shown[off + i]} (pos {off + i})" for i in range(n_q)]
    keep = [i for i, n in enumerate(names) if heads is None or n in heads]
    panels = [Panel(heatmap=Heatmap(p[i], keys, queries, 0.0, 1.0, "Blues", x_ticks=shown[:n_k],
                                    y_ticks=shown[off:off + n_q], value_name="weight", value_format=".3f"),
                    x_title="key", y_title="query", name=names[i], label=labels.get(names[i], ""))
              for i in keep]
    first = [names[i] for i in keep].index(active) if active in [names[i] for i in keep] else 0
    side = min(900, max(420, 16 * max(n_q, n_k) + 160))
    return FigureSpec(panels, title, layout="menu", active=first, height=side, width=side + 60)


def attention_patterns_figure(view: AttentionPatterns, title: str = "Attention pattern", active: str | None = None,
                              heads: Sequence[str] | None = None) -> FigureSpec:
    """The viewer of an AttentionPatterns (analysis.heads.attention_view), opening on head `active`
    (default: the first induction head, if labelled, else L0H0); heads: keep only these."""
    if active is None:
        active = next((h for h in view.head_names if "induction" in view.labels.get(h, "")
                       and (heads is None or h in heads)), None)
    return attention_figure(view.tokens, view.patterns, view.head_names, view.labels, title, active, heads)


def head_scores_figure(scores: Mapping[str, Any], title: str = "Head scores",
                       classes: HeadClasses | None = None) -> FigureSpec:
    """One [layer, head] heatmap (0..1, values written) per detector, one at a time (menu); scores:
    detector name -> [layer][head] (HeadScores.scores or its JSON). With classes, each detector's entry
    names the heads it labelled."""
    panels = []
    for name, grid in scores.items():
        m = as_array(grid)
        label = ""
        if classes is not None and name != "entropy":
            label = ", ".join(head_name(l, h) for l, h in classes.heads_with(name.replace("_", "-"))) or "none"
        panels.append(Panel(heatmap=Heatmap(m, [f"H{h}" for h in range(m.shape[1])],
                                            [f"L{l}" for l in range(m.shape[0])], 0.0, 1.0, "Blues", annotate=True,
                                            value_name="score", value_format=".3f"),
                            x_title="head", y_title="layer", name=TITLES.get(name, name.replace("_", " ")),
                            label=label))
    first = panels[0].heatmap if panels else None  # every panel here is a heatmap
    n_layers = first.z.shape[0] if first is not None else 1
    return FigureSpec(panels, title, layout="menu", height=min(700, 200 + 40 * n_layers))
