"""Computing head loadings (graphs/loadings.py says what they are) by batched backward passes.

    loadings = head_loadings(model, transcoders, graph, pruned)     # the pruned graph's cross-position edges
    graph.loadings = loadings                                        # saved with the graph; graph.head_loadings()

For a target at position pt (a feature's pre-activation, a logit), one backward pass gives g = d target / d z
for every head's output z at pt (every path from z at pt to the target stays at pt: attention is causal).
The paths whose last change of position is head (L, h) reading key k != pt carry
    pattern[L, h, pt, k] * g[L, h] . v[L, h, k],
so a second backward pass, from each layer's values v with that gradient put on every k != pt, gives the
head's share of every edge into the target at once, in the graph's own columns (attribution._Columns).
Rows: one per (target, layer, head), grouped by layer, batched within the attribution's memory bound.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from circuitlab.errors import InputError
from circuitlab.graphs.attribution import _Columns, rows_per_pass
from circuitlab.graphs.graph import Graph, Pruned
from circuitlab.graphs.loadings import HeadLoadings
from circuitlab.graphs.replacement import ReplacementModel
from circuitlab.graphs.transcoders import Transcoders
from circuitlab.model.hooks import HookPoint

MAX_EDGES = 200_000   # loadings are [edges, layers, heads] float64: a whole unpruned graph's edges are refused


def cross_position_edges(graph: Graph, pruned: Pruned | None = None) -> torch.Tensor:
    """[n, 2] (target, source) of the non-zero edges whose source sits at an earlier position than its target
    (the kept ones when pruned is given), strongest first."""
    a = graph.adjacency
    mask = a != 0
    if pruned is not None:
        mask &= pruned.edge_mask
    t, s = mask.nonzero(as_tuple=True)
    pos = torch.tensor([graph.node(i)["pos"] for i in range(graph.n_nodes)])
    keep = pos[s] < pos[t]
    t, s = t[keep], s[keep]
    order = a[t, s].abs().argsort(descending=True)
    return torch.stack([t[order], s[order]], 1)


def loading_cost(model: Any, graph: Graph, edges: torch.Tensor) -> dict[str, Any]:
    """Said before the work: backward rows (one per target, layer and head), and the loadings' size."""
    cfg = model.cfg
    targets = edges[:, 0].unique()
    rows = len(targets) * cfg.n_layers * cfg.n_heads
    return {"edges": len(edges), "targets": len(targets), "rows": rows,
            "loadings_mb": len(edges) * cfg.n_layers * cfg.n_heads * 8 / 2**20}


def head_loadings(model: Any, transcoders: Transcoders, graph: Graph, pruned: Pruned | None = None,
                  edges: torch.Tensor | None = None, logit_directions: Sequence[torch.Tensor] | None = None,
                  batch_size: int = 64, progress: bool = False, verbose: bool = False) -> HeadLoadings:
    """Each cross-position edge of `graph` (default: the pruned graph's, else every non-zero one) split over
    the heads that carried it. edges: [n, 2] (target node, source node) to split instead. logit_directions:
    the logit targets' directions [d_vocab] when some are not single tokens (a --foil graph)."""
    if edges is None:
        edges = cross_position_edges(graph, pruned)
    edges = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)
    if len(edges) > MAX_EDGES:
        raise InputError(f"{len(edges):,} edges to split over heads (at most {MAX_EDGES:,}): prune the graph first "
                         "(pass its Pruned) or give fewer edges")
    cfg = model.cfg
    L, H, K = cfg.n_layers, cfg.n_heads, cfg.kv_heads
    rm = ReplacementModel(model, transcoders, graph.tokens, bos=graph.bos)
    if not torch.equal(rm.active_features, graph.active_features):
        raise InputError("this graph was not made with this model and these transcoders (its active features differ)")
    dtype = graph.adjacency.dtype
    T, n_all = graph.n_pos, len(graph.active_features)
    cols = _Columns(rm, graph.active_features, graph.activations, dtype)

    def column(node: int) -> int:
        if node < graph.error_start:
            return int(graph.selected[node])
        if node < graph.token_start:
            return n_all + node - graph.error_start
        return n_all + L * T + node - graph.token_start

    directions = _logit_directions(graph, logit_directions, model.cfg.d_vocab)
    targets = edges[:, 0].unique().tolist()
    for t in targets:
        kind = graph.node(t)["kind"]
        if kind not in ("feature", "logit"):
            raise InputError(f"node {t} ({graph.label(t)}) has no incoming edges to split")
    cost = loading_cost(model, graph, edges)
    if verbose:
        print(f"head loadings: {cost['edges']} cross-position edges into {cost['targets']} targets, "
              f"{cost['rows']} backward rows, {cost['loadings_mb']:.2f} MB")
    heads = torch.zeros(len(edges), L, H, dtype=torch.float64)
    patterns = [rm.frozen[f"blocks.{layer}.attn.hook_pattern"][0].to(dtype) for layer in range(L)]  # [H, T, T]
    z: dict[int, torch.Tensor] = {}
    v: dict[int, torch.Tensor] = {}

    def keep(store: dict[int, torch.Tensor]) -> Any:
        def fn(t: torch.Tensor, hook: HookPoint) -> None:
            store[int(hook.name.split(".")[1])] = t
        return fn

    fns = [(f"blocks.{layer}.attn.hook_z", keep(z)) for layer in range(L)]
    fns += [(f"blocks.{layer}.attn.hook_v", keep(v)) for layer in range(L)]
    with model.hooks(fns):
        lp = rm.linear_pass(T, logits=True)
    B = max(1, min(batch_size, rows_per_pass(model, cols.n_cols, T)))
    bar = tqdm(total=len(targets), desc="head loadings", unit="target", disable=not progress)
    for i in range(0, len(targets), B):
        chunk = targets[i:i + B]
        g = _target_gradients(graph, rm, lp, z, chunk, directions, transcoders)       # {layer: [n, H, d_head]}
        where = {t: (edges[:, 0] == t).nonzero().flatten() for t in chunk}
        for layer, gl in g.items():
            # rows (target, head) of this layer: the gradient put on v at every key k != pt
            n = len(chunk)
            grad_v = v[layer].new_zeros(n * H, *v[layer].shape)                         # [rows, 1, T, K, D]
            for a, t in enumerate(chunk):
                pt = graph.node(t)["pos"]
                p = patterns[layer][:, pt, :pt]                                         # [H, pt] keys before pt
                for h in range(H):
                    grad_v[a * H + h, 0, :pt, h // (H // K)] = p[h, :, None] * gl[a, h]
            below = [k for k in sorted(lp.out) if k < layer]
            found = torch.autograd.grad([v[layer]], [lp.out[k] for k in below] + [lp.embed], [grad_v],
                                        retain_graph=True, allow_unused=True, is_grads_batched=True)
            g_out = {k: f[:, 0].to(dtype) for k, f in zip(below, found[:-1]) if f is not None}
            g_emb = found[-1][:, 0] if found[-1] is not None else grad_v.new_zeros(n * H, *lp.embed.shape[1:])
            rows = cols.rows(g_out, g_emb.to(dtype)).view(n, H, -1)
            for a, t in enumerate(chunk):
                idx = where[t]
                src = torch.tensor([column(int(s)) for s in edges[idx, 1]], dtype=torch.long)
                heads[idx, layer] = rows[a][:, src].T.double()
        bar.update(len(chunk))
    bar.close()
    edge = graph.adjacency[edges[:, 0], edges[:, 1]].double()
    return HeadLoadings(edges, heads, edge)


def _logit_directions(graph: Graph, given: Sequence[torch.Tensor] | None, d_vocab: int) -> list[torch.Tensor | None]:
    """Each logit target's direction over the vocabulary (a one-hot for a token; given ones for the rest)."""
    if given is not None:
        if len(given) != graph.n_logits:
            raise InputError(f"{len(given)} logit directions for {graph.n_logits} logit nodes")
        return [torch.as_tensor(d) for d in given]
    out: list[torch.Tensor | None] = []
    for tok in graph.logit_tokens.tolist():
        if tok < 0:
            out.append(None)
            continue
        d = torch.zeros(d_vocab, dtype=torch.float64)
        d[tok] = 1
        out.append(d)
    return out


def _target_gradients(graph: Graph, rm: ReplacementModel, lp: Any, z: dict[int, torch.Tensor], chunk: list[int],
                      directions: list[torch.Tensor | None], transcoders: Transcoders) -> dict[int, torch.Tensor]:
    """d target / d z at the target's position, for every head: {layer: [n, n_heads, d_head]} (layers the
    targets read; as attribution injects them: a feature's encoder vector at its input, a demeaned logit)."""
    n = len(chunk)
    outputs, grads = [], []
    by_layer: dict[int, list[tuple[int, int, int]]] = {}
    logit_rows: list[tuple[int, torch.Tensor]] = []
    for a, t in enumerate(chunk):
        node = graph.node(t)
        if node["kind"] == "feature":
            by_layer.setdefault(node["layer"], []).append((a, node["pos"], node["feature"]))
        else:
            d = directions[t - graph.logit_start]
            if d is None:
                raise InputError(f"logit node {graph.label(t)!r} is a direction the graph file does not hold: pass "
                                 "logit_directions to split its edges")
            logit_rows.append((a, d))
    for layer, items in by_layer.items():
        x = lp.x[layer]
        g = torch.zeros(n, *x.shape, dtype=x.dtype)
        feats = torch.tensor([f for _, _, f in items])
        vecs = transcoders.encoder_vectors(layer, feats).detach().to(x.dtype)
        for (a, pos, _), vec in zip(items, vecs):
            g[a, 0, pos] = vec
        outputs.append(x)
        grads.append(g)
    if logit_rows:
        g = torch.zeros(n, *lp.logits.shape, dtype=lp.logits.dtype)
        for a, d in logit_rows:
            g[a, 0] = (d.double() - d.double().mean()).to(g.dtype)
        outputs.append(lp.logits)
        grads.append(g)
    layers = sorted(z)
    found = torch.autograd.grad(outputs, [z[k] for k in layers], grads, retain_graph=True, allow_unused=True,
                                is_grads_batched=True)
    out = {}
    pos = torch.tensor([graph.node(t)["pos"] for t in chunk])
    for k, f in zip(layers, found):
        if f is not None:
            out[k] = f[torch.arange(n), 0, pos]                                        # [n, H, D]
    return out


def strongest_heads(graph: Graph, k: int = 10) -> list[dict[str, Any]]:
    """The (layer, head, query_pos, key_pos) that carry the most of the graph's influence across positions,
    from its loadings: each head's share of an edge, as an edge's influence is measured (|loading| over the
    target's total |input|, times the target's influence plus its logit weight); query: the edge's target
    position, key: its source's. The k strongest distinct ones, with the edge that ranked each."""
    loadings = graph.head_loadings()
    stats, w = graph._influence_stats(), graph.weights()
    t = loadings.edges[:, 0]
    weight = stats["inv"][t] * (stats["influence"][t] + w[t])                        # [n_edges]
    score = loadings.heads.abs() * weight[:, None, None]                               # [n_edges, L, H]
    n_heads = score.shape[2]
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, int, int, int]] = set()
    for flat in score.flatten().argsort(descending=True).tolist():
        e, j = divmod(flat, score.shape[1] * n_heads)
        if score.flatten()[flat] <= 0:
            break
        layer, head = divmod(j, n_heads)
        target, source = loadings.edges[e].tolist()
        key = (layer, head, graph.node(target)["pos"], graph.node(source)["pos"])
        if key in seen:
            continue
        seen.add(key)
        out.append({"layer": layer, "head": head, "query_pos": key[2], "key_pos": key[3], "target": target,
                    "source": source, "loading": float(loadings.heads[e, layer, head]),
                    "edge": float(loadings.edge[e]), "score": float(score.flatten()[flat]),
                    "words": f"L{layer}H{head} carries {graph.label(source)} -> {graph.label(target)} "
                             f"({float(loadings.heads[e, layer, head]):+.3g} of {float(loadings.edge[e]):+.3g})"})
        if len(out) == k:
            break
    return out
