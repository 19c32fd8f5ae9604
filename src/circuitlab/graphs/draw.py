"""A static drawing of a pruned graph as one self-contained SVG (no scripts, no CDN).

Columns are prompt positions, rows are layers (tokens at the bottom, logits at the top); nodes sharing a
cell are spread across it. Features are circles (area ~ influence share), errors grey squares, tokens and
logits labelled boxes. Edges are blue (positive) or red (negative), their opacity and width ~ |weight|.
"""
from __future__ import annotations

import html

import torch

from circuitlab.graphs.attribution_graph import Graph, Pruned

CELL_W, CELL_H, PAD = 110, 90, 60


def graph_svg(graph: Graph, pruned: Pruned) -> str:
    """The pruned graph drawn as an SVG document string."""
    keep = pruned.node_mask.nonzero().flatten().tolist()
    T, L = graph.n_pos, graph.n_layers
    width, height = PAD * 2 + CELL_W * T, PAD * 2 + CELL_H * (L + 2)
    cells: dict[tuple[int, int], list[int]] = {}
    for i in keep:
        n = graph.node(i)
        row = {"token": 0, "logit": L + 1}.get(n["kind"], n.get("layer", 0) + 1)
        cells.setdefault((row, n["pos"]), []).append(i)
    xy: dict[int, tuple[float, float]] = {}
    for (row, pos), members in cells.items():
        for k, i in enumerate(members):
            x = PAD + CELL_W * pos + CELL_W * (k + 1) / (len(members) + 1)
            if graph.node(i)["kind"] == "logit":
                x = PAD + CELL_W * (pos - 0.5 * (len(members) - 1) + k)
            xy[i] = (x, height - PAD - CELL_H * row - CELL_H / 2)
    infl = graph.node_influence().clamp(min=0)
    top = float(infl.max()) or 1.0
    mask = pruned.edge_mask & pruned.node_mask[:, None] & pruned.node_mask[None, :]
    t_idx, s_idx = mask.nonzero(as_tuple=True)
    w = graph.adjacency[t_idx, s_idx].double()
    wmax = float(w.abs().max()) if len(w) else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for row in range(L + 2):
        y = height - PAD - CELL_H * row - CELL_H / 2
        name = "tokens" if row == 0 else "logits" if row == L + 1 else f"layer {row - 1}"
        parts.append(f'<text x="4" y="{y + 4:.0f}" fill="#666">{name}</text>')
    order = torch.argsort(w.abs()) if len(w) else torch.zeros(0, dtype=torch.long)
    for j in order.tolist():
        t, s, v = int(t_idx[j]), int(s_idx[j]), float(w[j])
        (x1, y1), (x2, y2) = xy[s], xy[t]
        a = abs(v) / wmax
        colour = "#2563eb" if v > 0 else "#dc2626"
        parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
                     f'stroke-opacity="{0.15 + 0.85 * a:.2f}" stroke-width="{0.5 + 3.5 * a:.2f}">'
                     f'<title>{html.escape(graph.label(s))} -> {html.escape(graph.label(t))}: {v:+.4g}</title></line>')
    for i in keep:
        x, y = xy[i]
        n, title = graph.node(i), html.escape(graph.label(i))
        if n["kind"] == "feature":
            r = 4 + 8 * (float(infl[i]) / top) ** 0.5
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="#f59e0b" stroke="#92400e">'
                         f'<title>{title} (act {n["activation"]:.3g})</title></circle>'
                         f'<text x="{x + r + 2:.1f}" y="{y + 4:.1f}" font-size="9">F{n["feature"]}</text>')
        elif n["kind"] == "error":
            parts.append(f'<rect x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="#9ca3af">'
                         f'<title>{title}</title></rect>')
        else:
            text = (graph.token_strs[n["pos"]] if n["kind"] == "token" and graph.token_strs else
                    str(n["token"]) if n["kind"] == "token" else n["label"])
            fill = "#e5e7eb" if n["kind"] == "token" else "#bbf7d0"
            label = html.escape(repr(text)[1:-1][:14])
            parts.append(f'<rect x="{x - 45:.1f}" y="{y - 10:.1f}" width="90" height="20" rx="4" fill="{fill}">'
                         f'<title>{title}</title></rect><text x="{x:.1f}" y="{y + 4:.1f}" '
                         f'text-anchor="middle">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)
