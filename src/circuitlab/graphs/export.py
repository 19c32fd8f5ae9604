"""The pruned graph as the JSON that Neuronpedia's and circuit-tracer's graph viewer reads.

    data = neuronpedia_json(graph, pruned, slug="lily", scan="my-model")
    write_neuronpedia(graph, "out/lily.json", slug="lily")

Top-level keys `metadata`, `qParams`, `nodes`, `links`. Node ids follow circuit-tracer:
feature "{layer}_{feature}_{pos}", error "0_{layer}_{pos}" ("0_{layer}_{pos}_error" where that is also
the id of a feature node of layer 0 in the file), token "E_{token}_{pos}",
logit "{n_layers + 1}_{token}_{pos}" (pos: the last position). Links hold {source, target, weight}
with the raw adjacency weight. Only kept nodes and edges are written; a node with no kept edge is left
out except tokens and logits.

Beyond circuit-tracer's fields (viewers ignore unknown ones), for circuitlab's viewer to re-prune in the
page by Graph.prune's own rule: every node and link carries `influence_before`, the share of all node
(edge) influence held by the nodes (edges) strictly more influential than it, so that it is kept at
threshold t exactly when influence_before < t (edges: scored on the nodes kept at the file's node
threshold, as prune scores them); `metadata` carries both thresholds, the scores and `identity`, what the
graph was made with (graphs.transcoders.made_with: model and transcoder hashes). `qParams` holds
Neuronpedia's `pinnedIds` [node_id] and `supernodes` [[name, node_id, ...]], written back by the viewer.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeGuard

import torch

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import InputError
from circuitlab.graphs.attribution_graph import Graph, Pruned, edge_influence, node_influence, threshold_for
from circuitlab.graphs.loadings import HeadLoadings


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


def _share_before(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """For each of `values`, the share of scores.sum() held by the scores strictly greater than it, from
    the cumulative sum threshold_for uses (its non-zero scores, sorted), so that `before < t` <=> the value
    survives threshold_for(scores, t)."""
    flat = scores.flatten()
    ordered = flat[flat != 0].sort(descending=True).values
    if not len(ordered):
        return torch.zeros_like(values)
    cum = ordered.cumsum(0) / ordered.sum()
    greater = len(ordered) - torch.searchsorted(ordered.flip(0).contiguous(), values.contiguous(), right=True)
    return torch.where(greater > 0, cum[(greater - 1).clamp(min=0)], torch.zeros_like(values))


def pruning_shares(graph: Graph, pruned: Pruned) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(node_before [n_nodes], targets [m], sources [m], edge_before [m]): each node's influence_before and
    that of each kept edge (between kept nodes; see the module docstring), the edges scored as Graph.prune
    scores them: on the submatrix of the nodes kept at pruned.node_threshold (no n x n work)."""
    w, infl = graph.weights(), graph.node_influence()
    node_before = _share_before(infl, infl)
    nodes = infl >= threshold_for(infl, pruned.node_threshold)
    nodes[graph.token_start:] = True
    idx = nodes.nonzero().flatten()
    scores = edge_influence(graph.adjacency[idx][:, idx].double(), w[idx])          # [k, k]
    at = torch.full((graph.n_nodes,), -1, dtype=torch.long)
    at[idx] = torch.arange(len(idx))
    t, s = (pruned.edge_mask & pruned.node_mask[:, None] & pruned.node_mask[None, :]).nonzero(as_tuple=True)
    return node_before, t, s, _share_before(scores, scores[at[t], at[s]])


def _add_heads(loadings: HeadLoadings, links: list[dict[str, Any]], targets: list[int], sources: list[int],
               k: int = 8) -> None:
    """Each cross-position link's head loadings (the viewer draws them as bars when the link is clicked):
    heads [[layer, head, loading], ...] the strongest k, heads_rest: the rest of the edge (other heads and
    the same-position remainder). Links without loadings get none."""
    row = {(int(t), int(s)): i for i, (t, s) in enumerate(loadings.edges.tolist())}
    for link, t, s in zip(links, targets, sources):
        i = row.get((t, s))
        if i is None:
            continue
        flat = loadings.heads[i].flatten()
        n_heads = loadings.heads.shape[2]
        top = [j for j in flat.abs().argsort(descending=True)[:k].tolist() if flat[j] != 0]
        link["heads"] = [[j // n_heads, j % n_heads, float(flat[j])] for j in top]
        link["heads_rest"] = float(loadings.edge[i]) - sum(float(flat[j]) for j in top)


def neuronpedia_json(graph: Graph, pruned: Pruned, slug: str = "graph", scan: str = "circuitlab") -> dict[str, Any]:
    """The viewer's JSON for the pruned graph (a dict; see write_neuronpedia)."""
    keep = pruned.node_mask.nonzero().flatten().tolist()
    node_before, targets, sources, edge_before = pruning_shares(graph, pruned)
    nodes = {i: _node(graph, i, float(pruned.cumulative[i])) for i in keep}
    # circuit-tracer's error id "0_{layer}_{pos}" is also layer 0's feature {layer} at pos: keep ids unique
    taken = {n["node_id"] for i, n in nodes.items() if i < graph.error_start}
    for i in keep:
        if graph.error_start <= i < graph.token_start and nodes[i]["node_id"] in taken:
            nodes[i]["node_id"] += "_error"
    for i in keep:
        nodes[i]["influence_before"] = float(node_before[i]) if i < graph.token_start else 0.0
    weights = graph.adjacency[targets, sources].tolist()
    befores = edge_before.tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w, "influence_before": b}
             for t, s, w, b in zip(targets.tolist(), sources.tolist(), weights, befores)]
    if graph.loadings is not None:
        _add_heads(graph.loadings, links, targets.tolist(), sources.tolist())
    linked = {x["source"] for x in links} | {x["target"] for x in links}
    used = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    tokens = graph.token_strs or [str(int(t)) for t in graph.tokens]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": tokens,
                "prompt": graph.prompt if graph.prompt is not None else "".join(tokens),
                "node_threshold": pruned.node_threshold, "edge_threshold": pruned.edge_threshold,
                "n_layers": graph.n_layers, "scores": graph.scores(), "schema_version": 1,
                "identity": graph.identity}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def write_neuronpedia(graph: Graph, path: str | Path, pruned: Pruned | None = None, slug: str = "graph",
                      scan: str = "circuitlab") -> Path:
    """Write the viewer's JSON (atomically); pruned defaults to graph.prune() with the default thresholds."""
    pruned = pruned if pruned is not None else graph.prune()
    path = Path(path)
    atomic_write_text(path, json_text(neuronpedia_json(graph, pruned, slug, scan)))
    return path


def reprune(data: dict[str, Any], node_threshold: float, edge_threshold: float) -> tuple[list[str], list[dict]]:
    """The viewer's in-page re-pruning of a written graph (its JavaScript does the same): a feature or error
    node stays when its influence_before < node_threshold, a link when its influence_before < edge_threshold
    and both ends stay, then features and errors without an outgoing link and features without an incoming
    link are dropped until none is left; tokens and logits always stay. At the file's node threshold this is
    Graph.prune(node_threshold, edge_threshold) for any edge_threshold up to the file's; below it, edges keep
    the ranking computed at the file's node threshold. Returns (node ids, links)."""
    fixed = {"embedding", "logit"}
    kinds = {n["node_id"]: n["feature_type"] for n in data["nodes"]}

    def before(x: dict) -> float:   # a file from elsewhere: the cumulative `influence` stands in; links all stay
        return x["influence_before"] if "influence_before" in x else (x.get("influence") or 0.0)

    nodes = {n["node_id"] for n in data["nodes"] if n["feature_type"] in fixed or before(n) < node_threshold}
    links = [x for x in data["links"] if before(x) < edge_threshold]
    while True:
        links = [x for x in links if x["source"] in nodes and x["target"] in nodes]
        has_out = {x["source"] for x in links}
        has_in = {x["target"] for x in links}
        keep = {i for i in nodes if kinds[i] in fixed or (i in has_out and (kinds[i] != "cross layer transcoder"
                                                                            or i in has_in))}
        if keep == nodes:
            return [n["node_id"] for n in data["nodes"] if n["node_id"] in nodes], links
        nodes = keep


# ---------------------------------------------------------------------------- reading a viewer file back

FEATURE, ERROR, TOKEN, LOGIT = "cross layer transcoder", "mlp reconstruction error", "embedding", "logit"


def check_viewer_json(data: Any, where: str) -> dict[str, Any]:
    """Refuse, in one line naming the first fault, a viewer file that is not what neuronpedia_json writes in
    the parts a reader relies on (the explorer: listing, re-pruning, qParams, interventions, feature cards):
    metadata, qParams, nodes and links of the right types; unique string node ids; a feature node's id
    "{layer}_{feature}_{pos}" agreeing with its layer and ctx_idx; token nodes "E_{token}_{pos}" covering
    positions 0..n-1 once each; logit nodes with a whole-number feature (their token) and finite token_prob;
    links between listed nodes with finite weights. Returns data (unchanged)."""
    def bad(what: str) -> InputError:
        return InputError(f"{where} is not a graph file circuitlab can read: {what}; write it again with "
                          "`circuitlab graph`")

    def whole(x: Any) -> TypeGuard[int]:
        return isinstance(x, int) and not isinstance(x, bool)

    def finite(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if not isinstance(data, dict):
        raise bad(f"the file holds a {type(data).__name__}, not an object")
    for key, want in (("metadata", dict), ("nodes", list), ("links", list)):
        if not isinstance(data.get(key), want):
            raise bad(f"`{key}` is missing" if key not in data else f"`{key}` is not a{'' if want is list else 'n'} "
                      f"{'list' if want is list else 'object'}")
    q = data.get("qParams", {})
    if not isinstance(q, dict) or not isinstance(q.get("pinnedIds", []), list) \
            or not all(isinstance(i, str) for i in q.get("pinnedIds", [])) \
            or not isinstance(q.get("supernodes", []), list) \
            or not all(isinstance(s, list) and all(isinstance(i, str) for i in s) for s in q.get("supernodes", [])):
        raise bad("`qParams` is not {pinnedIds: [id], supernodes: [[name, id, ...]]}")
    identity = data["metadata"].get("identity")
    if identity is not None and not isinstance(identity, dict):
        raise bad("`metadata.identity` is not an object")
    ids: set[str] = set()
    positions: list[int] = []
    for k, n in enumerate(data["nodes"]):
        if not isinstance(n, dict):
            raise bad(f"node {k} is not an object")
        node_id, kind, pos = n.get("node_id"), n.get("feature_type"), n.get("ctx_idx")
        if not isinstance(node_id, str) or not node_id or node_id in ids:
            raise bad(f"node {k} has {'a repeated' if node_id in ids else 'no'} node_id")
        ids.add(node_id)
        if not isinstance(kind, str) or not whole(pos) or pos < 0:
            raise bad(f"node {node_id[:60]!r} lacks a feature_type or a whole-number ctx_idx >= 0")
        parts = node_id.split("_")
        if kind == FEATURE:
            nums = [int(p) if p.isdigit() else None for p in parts]
            if len(parts) != 3 or None in nums or str(n.get("layer")) != parts[0] or nums[2] != pos:
                raise bad(f"feature node {node_id[:60]!r} is not {{layer}}_{{feature}}_{{pos}} agreeing with its "
                          "layer and ctx_idx")
        elif kind == TOKEN:
            if len(parts) != 3 or parts[0] != "E" or not parts[1].isdigit() or parts[2] != str(pos):
                raise bad(f"token node {node_id[:60]!r} is not E_{{token}}_{{pos}} agreeing with its ctx_idx")
            positions.append(pos)
        elif kind == LOGIT:
            if not whole(n.get("feature")) or not finite(n.get("token_prob", 0.0)) \
                    or not isinstance(n.get("clerp", ""), str):
                raise bad(f"logit node {node_id[:60]!r} lacks a whole-number feature or a finite token_prob")
    if sorted(positions) != list(range(len(positions))):
        raise bad("the token nodes do not cover positions 0..n-1 once each")
    for k, link in enumerate(data["links"]):
        if not isinstance(link, dict) or link.get("source") not in ids or link.get("target") not in ids \
                or not finite(link.get("weight")):
            raise bad(f"link {k} is not {{source, target: node ids of the file, weight: a finite number}}")
    return data
