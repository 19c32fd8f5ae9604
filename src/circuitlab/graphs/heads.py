"""Computing head loadings (graphs/loadings.py says what they are).

    loadings = head_loadings(model, transcoders, graph, pruned)     # the pruned graph's cross-position edges
    graph.loadings = loadings                                        # saved with the graph; graph.head_loadings()

For a target at position pt (a feature's pre-activation, a logit), one backward row gives g = d target / d z
for every head's output z at pt (every path from z at pt to the target stays at pt: attention is causal).
For a source, one forward copy of the prompt through the frozen linear system, with only the source's
contribution in it, gives every head's values v; mixed by the head's pattern with the diagonal left out,
    y[q] = sum over k != q of pattern[q, k] v[k],
they are what the head carried to query q from other positions: the paths whose last change of position is
that head. The head's loading on the edge is g . y[pt]. Targets and sources are batched within the
attribution's memory bound (rows_per_pass); the forward's copy 0 holds no source and is taken away (biases).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from circuitlab.errors import InputError
from circuitlab.graphs.attribution import rows_per_pass
from circuitlab.graphs.attribution_graph import Graph, Pruned
from circuitlab.graphs.loadings import HeadLoadings
from circuitlab.graphs.replacement import ReplacementModel, _mlps_stood_in, _Stop
from circuitlab.graphs.transcoders import Transcoders
from circuitlab.model import model_dtype
from circuitlab.model.hooks import HookFn, HookPoint

if TYPE_CHECKING:
    from circuitlab.model import Transformer

MAX_EDGES = 200_000   # loadings are [edges, layers, heads] float64: a whole unpruned graph's edges are refused


def cross_position_edges(graph: Graph, pruned: Pruned | None = None) -> torch.Tensor:
    """[n, 2] (target, source) of the non-zero edges whose source sits at an earlier position than its target
    (the kept ones when pruned is given), strongest first."""
    a = graph.adjacency
    mask = a != 0
    if pruned is not None:
        mask &= pruned.edge_mask
    t, s = mask.nonzero(as_tuple=True)
    pos = node_positions(graph)
    keep = pos[s] < pos[t]
    t, s = t[keep], s[keep]
    order = a[t, s].abs().argsort(descending=True)
    return torch.stack([t[order], s[order]], 1)


def node_positions(graph: Graph) -> torch.Tensor:
    """Each node's position [n_nodes] (logits: the last), in the graph's node order."""
    T = graph.n_pos
    return torch.cat([graph.features[:, 1], torch.arange(graph.n_layers * T) % T, torch.arange(T),
                      torch.full((graph.n_logits,), T - 1)])


def loading_cost(model: Transformer, graph: Graph, edges: torch.Tensor) -> dict[str, Any]:
    """Said before the work: one backward row per target, one forward copy of the prompt per source, and
    the loadings' size."""
    cfg = model.cfg
    return {"edges": len(edges), "targets": len(edges[:, 0].unique()), "sources": len(edges[:, 1].unique()),
            "loadings_mb": len(edges) * cfg.n_layers * cfg.n_heads * 8 / 2**20}


def head_loadings(model: Transformer, transcoders: Transcoders, graph: Graph, pruned: Pruned | None = None,
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
    L, H = cfg.n_layers, cfg.n_heads
    rm = ReplacementModel(model, transcoders, graph.tokens, bos=graph.bos)
    if not torch.equal(rm.active_features, graph.active_features):
        raise InputError("this graph was not made with this model and these transcoders (its active features differ)")
    dtype = graph.adjacency.dtype
    T = graph.n_pos
    directions = _logit_directions(graph, logit_directions, model.cfg.d_vocab)
    targets = edges[:, 0].unique().tolist()
    sources = edges[:, 1].unique().tolist()
    for t in targets:
        kind = graph.node(t)["kind"]
        if kind not in ("feature", "logit"):
            raise InputError(f"node {t} ({graph.label(t)}) has no incoming edges to split")
    cost = loading_cost(model, graph, edges)
    if verbose:
        print(f"head loadings: {cost['edges']} cross-position edges from {cost['sources']} sources into "
              f"{cost['targets']} targets: {cost['targets']} backward rows, {cost['sources']} forward copies, "
              f"{cost['loadings_mb']:.2f} MB")
    heads = torch.zeros(len(edges), L, H, dtype=torch.float64)
    positions = node_positions(graph).tolist()
    patterns = [rm.frozen[f"blocks.{layer}.attn.hook_pattern"][0].to(dtype) for layer in range(L)]  # [H, T, T]
    B = max(1, min(batch_size, rows_per_pass(model, graph.n_nodes, T)))
    bar = tqdm(total=len(targets) + len(sources), desc="head loadings", unit="node", disable=not progress)
    # 1. each target's gradient at every head's output z at its position: one backward row per target
    z: dict[int, torch.Tensor] = {}

    def keep_z(t: torch.Tensor, hook: HookPoint) -> None:
        z[int(hook.name.split(".")[1])] = t

    with model.hooks([(f"blocks.{layer}.attn.hook_z", keep_z) for layer in range(L)]):
        lp = rm.linear_pass(T, logits=True)
    grads = torch.zeros(len(targets), L, H, cfg.head_dim, dtype=dtype)               # [targets, L, H, d_head]
    for i in range(0, len(targets), B):
        chunk = targets[i:i + B]
        for layer, g in _target_gradients(graph, lp, z, chunk, positions, directions, transcoders).items():
            grads[i:i + len(chunk), layer] = g.to(dtype)
        bar.update(len(chunk))
    del lp, z
    # 2. each source's part of every head's values, mixed by the pattern off the diagonal (forward, batched):
    # what the head carried to each query from other positions; dotted with the target's gradient there
    row = {t: i for i, t in enumerate(targets)}
    t_row = torch.tensor([row[int(t)] for t in edges[:, 0]])
    t_pos = torch.tensor([positions[int(t)] for t in edges[:, 0]])
    for i in range(0, len(sources), B):
        chunk = sources[i:i + B]
        carried = _carried(model, rm, transcoders, graph, chunk, patterns)            # {layer: [n, H, T, d_head]}
        slot = {s_: b for b, s_ in enumerate(chunk)}
        mine = torch.tensor([j for j, s_ in enumerate(edges[:, 1].tolist()) if s_ in slot], dtype=torch.long)
        if len(mine):
            b = torch.tensor([slot[int(s_)] for s_ in edges[mine, 1]])
            for layer, y in carried.items():
                heads[mine, layer] = (grads[t_row[mine], layer] * y[b, :, t_pos[mine]]).sum(-1).double()
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


def _target_gradients(graph: Graph, lp: Any, z: dict[int, torch.Tensor], chunk: list[int], positions: list[int],
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
        for (a, p, _), vec in zip(items, vecs):
            g[a, 0, p] = vec
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
    out: dict[int, torch.Tensor] = {}
    pos = torch.tensor([positions[t] for t in chunk])
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
    positions = node_positions(graph).tolist()
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, int, int, int]] = set()
    for flat in score.flatten().argsort(descending=True).tolist():
        e, j = divmod(flat, score.shape[1] * n_heads)
        if score.flatten()[flat] <= 0:
            break
        layer, head = divmod(j, n_heads)
        target, source = loadings.edges[e].tolist()
        key = (layer, head, positions[target], positions[source])
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


@torch.no_grad()
def _carried(model: Transformer, rm: ReplacementModel, transcoders: Transcoders, graph: Graph, sources: list[int],
             patterns: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """What each head carries to each query from the other positions, of each source's contribution alone:
    {layer: [n_sources, n_heads, pos, d_head]} = pattern (diagonal zeroed) @ values, through the frozen linear
    system (patterns, norm scales, features fixed; MLP outputs = skip path + the source's own part). One
    forward of len(sources) + 1 copies; copy 0 has no source and is taken away (the biases' share)."""
    cfg = model.cfg
    L, H, K, T, d = cfg.n_layers, cfg.n_heads, cfg.kv_heads, graph.n_pos, cfg.d_model
    dtype = model_dtype(model)
    n = len(sources) + 1
    embed = torch.zeros(n, T, d, dtype=dtype)
    outs = {k: torch.zeros(n, T, d, dtype=dtype) for k in range(L)}
    for b, s in enumerate(sources, 1):
        node = graph.node(s)
        p = node["pos"]
        if node["kind"] == "token":
            embed[b, p] = rm.embeddings[p]
        elif node["kind"] == "error":
            if not (graph.bos and p == 0):   # position 0's MLP output is a constant there, not a node
                outs[node["layer"]][b, p] = rm.errors[node["layer"]][p]
        else:
            dec = transcoders.decoder_vectors(node["layer"], torch.tensor([node["feature"]]))[0]    # [writes, d]
            for i, k in enumerate(transcoders.writes(node["layer"])):
                outs[k][b, p] += node["activation"] * dec[i].to(dtype)
    x: dict[int, torch.Tensor] = {}
    v: dict[int, torch.Tensor] = {}

    def read(t: torch.Tensor, hook: HookPoint) -> None:
        x[int(hook.name.split(".")[1])] = t

    def write(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        layer = int(hook.name.split(".")[1])
        skip = transcoders.skip(layer, x[layer]) if transcoders.has(layer) else None
        return (outs[layer] if skip is None else outs[layer] + skip.to(dtype)).to(y.dtype)

    def keep_v(t: torch.Tensor, hook: HookPoint) -> None:
        v[int(hook.name.split(".")[1])] = t

    def stop(t: torch.Tensor, hook: HookPoint) -> None:
        raise _Stop

    fns: list[tuple[str, HookFn]] = [("hook_embed", lambda t, hook: embed.to(t.dtype))]
    if "hook_pos_embed" in model.hook_points():
        fns.append(("hook_pos_embed", lambda t, hook: torch.zeros_like(t)))
    fns += [(transcoders.input_hook(layer), read) for layer in transcoders.layers]
    fns += [(transcoders.output_hook(layer), write) for layer in range(L)]
    fns += [(f"blocks.{layer}.attn.hook_v", keep_v) for layer in range(L)]
    fns.append((f"blocks.{L - 1}.hook_resid_post", stop))
    with model.frozen(rm.frozen), model.hooks(fns), _mlps_stood_in(model):
        try:
            model(rm.tokens[None].expand(n, T))
        except _Stop:
            pass
    out = {}
    for layer in range(L):
        off = patterns[layer].clone()
        off.diagonal(dim1=-2, dim2=-1).zero_()                                         # [H, T, T], k != q
        vals = v[layer].to(off.dtype).repeat_interleave(H // K, dim=2)                 # [n, T, H, D]
        y = torch.einsum("hqk,nkhd->nhqd", off, vals)
        out[layer] = y[1:] - y[:1]
    return out
