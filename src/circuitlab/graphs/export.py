"""The pruned graph as the JSON that Neuronpedia's and circuit-tracer's graph viewer reads.

    data = neuronpedia_json(graph, pruned, slug="lily", scan="my-model")
    write_neuronpedia(graph, "out/lily.json", slug="lily")

Top-level keys `metadata`, `qParams`, `nodes`, `links`. Node ids follow circuit-tracer:
feature "{layer}_{feature}_{pos}", error "0_{layer}_{pos}", token "E_{token}_{pos}",
logit "{n_layers + 1}_{token}_{pos}" (pos: the last position). Links hold {source, target, weight}
with the raw adjacency weight. Only kept nodes and edges are written; a node with no kept edge is left
out except tokens and logits.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from circuitlab.atomic import atomic_write_text
from circuitlab.graphs.graph import Graph, Pruned


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _node(graph: Graph, i: int, cumulative: float) -> dict[str, Any]:
    n = graph.node(i)
    base = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "clerp": "",
            "influence": cumulative, "activation": None}
    if n["kind"] == "feature":
        layer, pos, feat = n["layer"], n["pos"], n["feature"]
        return {**base, "node_id": f"{layer}_{feat}_{pos}", "feature": _cantor(layer, feat), "layer": str(layer),
                "ctx_idx": pos, "feature_type": "cross layer transcoder", "jsNodeId": f"{layer}_{feat}-0",
                "activation": n["activation"]}
    if n["kind"] == "error":
        layer, pos = n["layer"], n["pos"]
        return {**base, "node_id": f"0_{layer}_{pos}", "feature": -1, "layer": str(layer), "ctx_idx": pos,
                "feature_type": "mlp reconstruction error", "jsNodeId": f"{layer}_{pos}-0"}
    if n["kind"] == "token":
        pos, tok = n["pos"], n["token"]
        return {**base, "node_id": f"E_{tok}_{pos}", "feature": pos, "layer": "E", "ctx_idx": pos,
                "feature_type": "embedding", "jsNodeId": f"E_{tok}-{pos}"}
    j = i - graph.logit_start
    layer, pos, tok = str(graph.n_layers + 1), n["pos"], n["token"] if n["token"] >= 0 else j
    return {**base, "node_id": f"{layer}_{tok}_{pos}", "feature": tok, "layer": layer, "ctx_idx": pos,
            "feature_type": "logit", "token_prob": n["weight"], "is_target_logit": j == 0,
            "jsNodeId": f"L_{tok}-{pos}", "clerp": f'Output "{n["label"]}" (p={n["weight"]:.3f})', "influence": None}


def neuronpedia_json(graph: Graph, pruned: Pruned, slug: str = "graph", scan: str = "circuitlab") -> dict[str, Any]:
    """The viewer's JSON for the pruned graph (a dict; see write_neuronpedia)."""
    keep = pruned.node_mask.nonzero().flatten().tolist()
    nodes = {i: _node(graph, i, float(pruned.cumulative[i])) for i in keep}
    mask = pruned.edge_mask.clone()
    mask[~pruned.node_mask] = False
    mask[:, ~pruned.node_mask] = False
    targets, sources = mask.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources].tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
             for t, s, w in zip(targets.tolist(), sources.tolist(), weights)]
    linked = {x["source"] for x in links} | {x["target"] for x in links}
    used = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    tokens = graph.token_strs or [str(int(t)) for t in graph.tokens]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": tokens,
                "prompt": graph.prompt if graph.prompt is not None else "".join(tokens),
                "node_threshold": pruned.node_threshold, "schema_version": 1}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def write_neuronpedia(graph: Graph, path: str | Path, pruned: Pruned | None = None, slug: str = "graph",
                      scan: str = "circuitlab") -> Path:
    """Write the viewer's JSON (atomically); pruned defaults to graph.prune() with the default thresholds."""
    pruned = pruned if pruned is not None else graph.prune()
    path = Path(path)
    atomic_write_text(path, json.dumps(neuronpedia_json(graph, pruned, slug, scan)))
    return path
