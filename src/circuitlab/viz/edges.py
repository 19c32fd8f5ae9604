"""A circuit as a layered graph in SVG, written in pure Python (no graphviz): inputs at the bottom, logits
on top, one row per layer's heads and one per MLP; edges coloured by the reader input they enter (query,
key, value, MLP, logits), width by |score|, dashed where the score is negative.

    svg = circuit_svg(circuit)           # a string: <svg ...>...</svg>, for report.html, Jupyter or a paper
    Path("circuit.svg").write_text(svg)
"""
from __future__ import annotations

import html

from circuitlab.viz.figure import FigureSpec, Panel, Rule, Series

KIND_COLOURS = {"q": "#8e44ad", "k": "#1e8449", "v": "#2471a3", "mlp": "#ca6f1e", "logits": "#505a68"}
KIND_NAMES = {"q": "query", "k": "key", "v": "value", "mlp": "MLP input", "logits": "logits"}


def _rows(graph) -> dict[str, int]:
    """Node -> row (0 = input at the bottom)."""
    rows = {"input": 0}
    for name, layer in zip(graph.sources[1:], graph.source_layer[1:]):
        per_layer = 1 if graph.parallel or not graph.has_mlp else 2
        rows[name] = 1 + per_layer * layer + (1 if name.startswith("MLP") and per_layer == 2 else 0)
    rows["logits"] = max(rows.values()) + 1
    return rows


def circuit_svg(circuit, show_all_nodes: bool = False, width: int = 760, row_height: int = 90,
                title: str | None = None) -> str:
    """The circuit (analysis.edges.Circuit) as an SVG string. show_all_nodes: draw the nodes outside the
    circuit too, in grey. Scores come from circuit.scores (edges of unknown score are drawn thin)."""
    graph = circuit.graph
    rows = _rows(graph)
    used = set(circuit.nodes())
    shown = [n for n in graph.nodes if show_all_nodes or n in used]
    by_row: dict[int, list[str]] = {}
    for n in shown:
        by_row.setdefault(rows[n], []).append(n)
    n_rows = max(rows.values()) + 1
    height = row_height * n_rows + 60
    pos: dict[str, tuple[float, float]] = {}
    for r, names in by_row.items():
        for i, n in enumerate(names):
            pos[n] = ((i + 1) * width / (len(names) + 1), height - 40 - r * row_height)

    idx = circuit.edges.nonzero().flatten().tolist()
    scores = circuit.scores
    biggest = max((abs(float(scores[i])) for i in idx), default=0.0) if scores is not None else 0.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>']
    if title:
        parts.append(f'<text x="10" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>')
    pairs = graph.edge_pairs
    for i in idx:
        s, r = pairs[i].tolist()
        src, dst, kind = graph.sources[s], graph.reader_node[r], graph.reader_kind(r)
        if src not in pos or dst not in pos:
            continue
        (x1, y1), (x2, y2) = pos[src], pos[dst]
        # kv readers under grouped-query attention feed the whole group: drawn to the group's first head
        offset = {"q": -10, "k": 0, "v": 10}.get(kind, 0)
        x2 += offset
        value = float(scores[i]) if scores is not None else 0.0
        w = 1.0 + 7.0 * abs(value) / biggest if biggest > 0 else 1.5
        dash = ' stroke-dasharray="6 4"' if value < 0 else ""
        mid = (y1 + y2) / 2
        label = f"{src} → {graph.readers[r]}: {value:+.4g}" if scores is not None else f"{src} → {graph.readers[r]}"
        parts.append(f'<path d="M{x1:.1f},{y1 - 12:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2 + 12:.1f}" '
                     f'fill="none" stroke="{KIND_COLOURS[kind]}" stroke-width="{w:.2f}" stroke-opacity="0.8"{dash}>'
                     f'<title>{html.escape(label)}</title></path>')
    for n in shown:
        x, y = pos[n]
        inside = n in used
        fill = "#fdfefe" if inside else "#f2f3f4"
        stroke = "#1d2330" if inside else "#b3b6b7"
        w = max(44, 8 * len(n))
        parts.append(f'<rect x="{x - w / 2:.1f}" y="{y - 12:.1f}" width="{w}" height="24" rx="6" fill="{fill}" '
                     f'stroke="{stroke}"/><text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" '
                     f'fill="{stroke}">{html.escape(n)}</text>')
    legend_x = 10
    for kind, colour in KIND_COLOURS.items():
        parts.append(f'<line x1="{legend_x}" y1="{height - 10}" x2="{legend_x + 20}" y2="{height - 10}" '
                     f'stroke="{colour}" stroke-width="3"/><text x="{legend_x + 24}" y="{height - 6}">'
                     f'{KIND_NAMES[kind]}</text>')
        legend_x += 110
    parts.append(f'<text x="{legend_x}" y="{height - 6}" fill="#5b6475">dashed: negative score</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def faithfulness_figure(curves) -> FigureSpec:
    """curves: label -> Faithfulness (or its to_dict()); f against the percentage of edges kept (log axis),
    one line per method, with the 80 % and 90 % levels dotted."""
    series = []
    for i, (label, c) in enumerate(curves.items()):
        d = c if isinstance(c, dict) else c.to_dict()
        series.append(Series([100 * x for x in d["fractions"]], d["faithfulness"],
                             f"{label} (CPR {d['cpr']:.2f}, CMD {d['cmd']:.2f})", "line+markers", i,
                             text=[f"{n} edges" for n in d["n_edges"]]))
    levels = [Rule(y=level, color="#9aa1ad", dash="dot") for level in (0.8, 0.9)]
    return FigureSpec([Panel(series=series, rules=levels, x_title="edges kept (%, top by |score|)",
                             y_title="faithfulness f", x_log=True)], height=380)


__all__ = ["KIND_COLOURS", "circuit_svg", "faithfulness_figure"]
