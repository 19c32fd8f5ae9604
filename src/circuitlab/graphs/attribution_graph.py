"""The attribution graph: a plain container with a documented node order, its scores and its pruning.

Nodes, in this order (circuit-tracer's, so adjacency matrices compare index for index):

    [selected features (sorted by layer, pos, feature) | errors (layer-major: layer 0 pos 0..T-1, layer 1 ...)
     | tokens (pos 0..T-1) | logits (targets in order)]

adjacency [n_nodes, n_nodes]: rows are targets, columns sources; error and token rows are zero.

Scores and pruning as the field defines them (Ameisen et al. 2025): Â = |A| with each row divided by
its sum; the influence of every node on the logits is I = w (Â + Â² + ...) for the logit weights w
(each target's probability); the replacement score is the tokens' influence over the tokens' and
errors' together; the completeness score is the share of every node's input that does not come from
errors, weighted by the node's influence (+ its own logit weight). Pruning keeps the nodes holding
node_threshold of the influence, then the edges holding edge_threshold of the edge influence
(Â[t, s] * (influence of t + its weight)), and drops, until none is left, features and errors with no
kept outgoing edge and features with no kept incoming edge. Tokens and logits are always kept.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_dir, json_text
from circuitlab.checks import SHARE
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.graphs.edge_scores import KeptEdgeScores, threshold_in_place
from circuitlab.graphs.loadings import HeadLoadings
from circuitlab.graphs.options import DEFAULTS, TOKEN_NODES
from circuitlab.textfile import read_text

FORMAT = "circuitlab-graph-1"
_INDEX_NEEDS = {"error": "layer= and pos=", "token": "pos=", "logit": "logit= (its index among the targets)"}
TENSORS, META = "graph.safetensors", "graph.json"


# ---------------------------------------------------------------------------- influence

def normalized(adjacency: torch.Tensor) -> torch.Tensor:
    """Â = |A| with every row divided by its sum (rows summing to 0 stay 0). [n, n] -> [n, n]."""
    a = adjacency.abs()
    return a / a.sum(dim=1, keepdim=True).clamp(min=1e-10)


def _inverse_row_sums(a: torch.Tensor) -> torch.Tensor:
    """1 / (row sums of |A|), a [n, n] already absolute -> [n] (a zero row gives a finite factor: it stays 0)."""
    return 1 / a.sum(dim=1).clamp(min=1e-10)


def _influence(a: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor, max_iter: int = 10_000) -> torch.Tensor:
    """w (Â + Â² + ...) with Â = diag(inv) |A| never built: each step divides the vector instead of the matrix
    (a: |A| [n, n], inv [n] from _inverse_row_sums). [n]."""
    step = (weights.to(a.dtype) * inv) @ a
    total = step.clone()
    for _ in range(max_iter):
        if not bool(step.any()):
            return total
        step = (step * inv) @ a
        total += step
    raise CircuitlabError("influence did not converge: the adjacency has a cycle (not an attribution graph)")


ROW_CHUNK = 1024  # rows of the adjacency made absolute float64 at a time


def _abs_rows(adjacency: torch.Tensor, start: int) -> tuple[torch.Tensor, slice]:
    """|A| of ROW_CHUNK rows from `start`, float64: ([rows, n], the rows' slice)."""
    rows = slice(start, min(start + ROW_CHUNK, len(adjacency)))
    return adjacency[rows].to(torch.float64, copy=True).abs_(), rows   # a copy made absolute in place


def _chunked_influence(adjacency: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor,
                       max_iter: int = 10_000) -> torch.Tensor:
    """_influence(|A|, inv, weights) from the adjacency in its own dtype, a chunk of rows made float64 at a
    time (only the rows the walk has reached): the same sum without an n x n float64 copy. [n]."""
    n = len(adjacency)

    def times(vec: torch.Tensor) -> torch.Tensor:       # (vec * inv) @ |A|
        out = torch.zeros(n, dtype=torch.float64)
        scaled = vec * inv
        for start in range(0, n, ROW_CHUNK):
            part = scaled[start:start + ROW_CHUNK]
            if bool(part.any()):
                a, _ = _abs_rows(adjacency, start)
                out += part @ a
        return out

    step = times(weights.double())
    total = step.clone()
    for _ in range(max_iter):
        if not bool(step.any()):
            return total
        step = times(step)
        total += step
    raise CircuitlabError("influence did not converge: the adjacency has a cycle (not an attribution graph)")


def influence(a_hat: torch.Tensor, weights: torch.Tensor, max_iter: int = 10_000) -> torch.Tensor:
    """w (Â + Â² + ...) for weights w [n] on the rows: a graph's edges run from earlier layers to later
    ones, so the powers of Â reach zero after at most depth steps. [n]."""
    return _influence(a_hat, torch.ones(len(a_hat), dtype=a_hat.dtype), weights, max_iter)


def node_influence(adjacency: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each node's influence on the weighted logits [n] (float64)."""
    a = adjacency.double().abs()
    return _influence(a, _inverse_row_sums(a), weights)


def edge_influence(adjacency: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each edge's influence [n, n]: Â[t, s] * (influence of t + weight of t)."""
    a_hat = normalized(adjacency)
    return a_hat * (influence(a_hat, weights) + weights.to(a_hat.dtype))[:, None]


def threshold_for(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """The smallest score among the top scores (>= 0) holding `fraction` of their total. Only the non-zero
    scores are sorted (an adjacency's are mostly zero); the answer is the one a sort of all would give."""
    flat = scores.flatten()
    ordered = flat[flat != 0].sort(descending=True).values
    if not len(ordered):
        return flat.new_zeros(())
    cum = ordered.cumsum(0) / ordered.sum()
    i = int(torch.searchsorted(cum, torch.tensor(fraction, dtype=cum.dtype)))
    if i < len(ordered):
        return ordered[i]
    return flat.new_zeros(()) if len(ordered) < len(flat) else ordered[-1]  # past the last: a zero, if any


def check_token_nodes(value: Any, name: str = "token_nodes") -> str:
    """One of TOKEN_NODES, else a one-line InputError."""
    if value not in TOKEN_NODES:
        raise InputError(f"{name} must be one of {', '.join(TOKEN_NODES)} (got {value!r}): 'embedding' makes a token "
                         "node the whole embedding at its position, 'W_E' the token's row alone (circuit-tracer's)")
    return value


def check_threshold(value: Any, name: str) -> float:
    """A pruning threshold: a share of the influence kept, in (0, 1] (checks.SHARE, as the CLI and explorer)."""
    return SHARE.check(value, name)


@dataclass
class Pruned:
    """node_mask [n_nodes], edge_mask [n_nodes, n_nodes] (target, source), cumulative [n_nodes]: the share
    of all influence held by the nodes at least as influential as each node."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative: torch.Tensor
    node_threshold: float
    edge_threshold: float


# ---------------------------------------------------------------------------- the graph

@dataclass
class Graph(Displayed):
    """An attribution graph (see the module docstring for the node order).

    tokens [pos]; active_features [n_active, 3] (layer, pos, feature) with activations [n_active];
    selected [n_feat]: the active features that are nodes (all unless capped); adjacency [n, n];
    logit_tokens [n_logit] (-1 for a direction), logit_weights [n_logit]; info: timings, memory;
    token_nodes: what a token node adds (TOKEN_NODES: "embedding", the default, or circuit-tracer's "W_E").
    loadings: the cross-position edges split over heads (graphs.heads.head_loadings), when computed."""

    tokens: torch.Tensor
    active_features: torch.Tensor
    activations: torch.Tensor
    selected: torch.Tensor
    adjacency: torch.Tensor
    logit_labels: list[str]
    logit_tokens: torch.Tensor
    logit_weights: torch.Tensor
    n_layers: int
    bos: bool = False
    token_strs: list[str] | None = None
    prompt: str | None = None
    transcoders: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    token_nodes: str = DEFAULTS.token_nodes
    identity: dict[str, Any] | None = None   # the model and transcoders it was made with (transcoders.made_with)
    loadings: HeadLoadings | None = None
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ node bookkeeping
    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        return len(self.selected)

    @property
    def n_logits(self) -> int:
        return len(self.logit_labels)

    @property
    def n_nodes(self) -> int:
        return self.adjacency.shape[0]

    @property
    def error_start(self) -> int:
        return self.n_features

    @property
    def token_start(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_start(self) -> int:
        return self.token_start + self.n_pos

    @property
    def features(self) -> torch.Tensor:
        """[n_feat, 3] (layer, pos, feature) of the feature nodes."""
        return self.active_features[self.selected]

    @property
    def feature_activations(self) -> torch.Tensor:
        return self.activations[self.selected]

    def weights(self) -> torch.Tensor:
        """[n_nodes] the logit weights on the logit rows, 0 elsewhere."""
        w = torch.zeros(self.n_nodes, dtype=torch.float64)
        w[self.logit_start:] = self.logit_weights.double()
        return w

    def node(self, i: int) -> dict[str, Any]:
        """What node i is: {"kind": "feature"|"error"|"token"|"logit", "layer", "pos", ...}."""
        if i < self.error_start:
            layer, pos, feat = self.features[i].tolist()
            return {"kind": "feature", "layer": layer, "pos": pos, "feature": feat,
                    "activation": float(self.feature_activations[i])}
        if i < self.token_start:
            layer, pos = divmod(i - self.error_start, self.n_pos)
            return {"kind": "error", "layer": layer, "pos": pos}
        if i < self.logit_start:
            pos = i - self.token_start
            return {"kind": "token", "pos": pos, "token": int(self.tokens[pos])}
        j = i - self.logit_start
        return {"kind": "logit", "pos": self.n_pos - 1, "token": int(self.logit_tokens[j]),
                "label": self.logit_labels[j], "weight": float(self.logit_weights[j])}

    def index(self, kind: str, layer: int | None = None, pos: int | None = None, feature: int | None = None,
              logit: int | None = None) -> int:
        """The node index of a feature (layer, pos, feature), error (layer, pos), token (pos) or logit
        (its index among the targets)."""
        if kind == "feature":
            hit = ((self.features == torch.tensor([layer, pos, feature])).all(1)).nonzero()
            if not len(hit):
                raise InputError(f"feature {feature} of layer {layer} at position {pos} is not a node")
            return int(hit[0, 0])
        if kind == "error" and layer is not None and pos is not None:
            return self.error_start + layer * self.n_pos + pos
        if kind == "token" and pos is not None:
            return self.token_start + pos
        if kind == "logit" and logit is not None:
            return self.logit_start + logit
        if kind in ("error", "token", "logit"):
            raise InputError(f"an {kind} node is named by {_INDEX_NEEDS[kind]}")
        raise InputError(f"unknown node kind {kind!r}; use feature, error, token or logit")

    def label(self, i: int) -> str:
        n = self.node(i)
        tok = (lambda p: repr(self.token_strs[p]) if self.token_strs else str(int(self.tokens[p])))
        if n["kind"] == "feature":
            return f"L{n['layer']} F{n['feature']} @{n['pos']} {tok(n['pos'])}"
        if n["kind"] == "error":
            return f"error L{n['layer']} @{n['pos']}"
        if n["kind"] == "token":
            return f"token {tok(n['pos'])} @{n['pos']}"
        return f"logit {n['label']!r}"

    # ------------------------------------------------------------------ scores and pruning
    def _influence_stats(self) -> dict[str, torch.Tensor]:
        """Computed once per adjacency and weights, in float64 a chunk of rows at a time (never an n x n float64
        copy of the adjacency): inv [n] (1 / row sums of |A|), influence [n], error_share [n] (each row's share
        of |A| coming from error nodes)."""
        key = tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in (self.adjacency, self.logit_weights))
        if self._cache.get("key") != key:
            adj = self.adjacency
            rows = torch.cat([_abs_rows(adj, i)[0].sum(1) for i in range(0, len(adj), ROW_CHUNK)]) if len(adj) \
                else torch.zeros(0, dtype=torch.float64)
            inv = 1 / rows.clamp(min=1e-10)
            errors = torch.cat([_abs_rows(adj, i)[0][:, self.error_start:self.token_start].sum(1)
                                for i in range(0, len(adj), ROW_CHUNK)]) if len(adj) else rows
            self._cache.clear()
            self._cache.update(key=key, inv=inv, influence=_chunked_influence(adj, inv, self.weights()),
                               error_share=errors * inv)
        return self._cache

    def node_influence(self) -> torch.Tensor:
        return self._influence_stats()["influence"].clone()

    def logit_effects(self, logit: int = 0) -> torch.Tensor:
        """Each feature node's signed effect on logit node `logit` [n_features] (float64): its direct edge plus
        its effect through every later feature node, in the frozen linear system the edges are measured in
        (an active feature's activation moves one-for-one with its pre-activation). Unlike influence, which
        ranks |edges|, this says whether the feature raises the logit or lowers it: what removing the
        feature would do to it, to first order, with attention frozen."""
        a = self.adjacency.double()
        n = self.n_features
        row = a[self.logit_start + logit, :n]
        layers, acts = self.features[:, 0], self.feature_activations.double()
        effects = row.clone()
        per_unit = torch.zeros(n, dtype=torch.float64)     # effect per unit of activation, of the layers done
        for layer in sorted(set(layers.tolist()), reverse=True):
            src = (layers == layer).nonzero().flatten()
            later = (layers > layer).nonzero().flatten()
            if len(later):
                effects[src] = row[src] + a[later][:, src].T @ per_unit[later]
            per_unit[src] = torch.where(acts[src] != 0, effects[src] / acts[src].where(acts[src] != 0, 1.0), 0.0)
        return effects

    def scores(self) -> dict[str, float]:
        """{"replacement": ..., "completeness": ...} (both 1.0 when the errors carry nothing)."""
        stats, w = self._influence_stats(), self.weights()
        infl = stats["influence"]
        errors = infl[self.error_start:self.token_start].sum()
        tokens = infl[self.token_start:self.logit_start].sum()
        replacement = tokens / (tokens + errors) if float(tokens + errors) > 0 else torch.tensor(1.0)
        out_infl = infl + w
        completeness = ((1 - stats["error_share"]) * out_infl).sum() / out_infl.sum()
        return {"replacement": float(replacement), "completeness": float(completeness)}

    def prune(self, node_threshold: float = DEFAULTS.node_threshold,
              edge_threshold: float = DEFAULTS.edge_threshold) -> Pruned:
        """Keep the nodes holding node_threshold of the influence and the edges holding edge_threshold
        of the edge influence, then drop dangling features and errors until none is left.

        The edge scores live among the kept nodes only: they are computed on that submatrix (what
        zeroing every other row and column of the n x n matrix would give, without the n x n work)."""
        node_threshold = check_threshold(node_threshold, "the node threshold")
        edge_threshold = check_threshold(edge_threshold, "the edge threshold")
        w = self.weights()
        infl = self._influence_stats()["influence"]
        nodes = infl >= threshold_for(infl, node_threshold)
        nodes[self.token_start:] = True  # tokens and logits always stay
        idx = nodes.nonzero().flatten()
        block = KeptEdgeScores(self.adjacency, idx, w[idx])
        thr = threshold_in_place(block.scores, edge_threshold, len(idx) ** 2)   # the cut on the n x n scores:
        del block.scores                # their non-zero ones are these, and both have zeros (token rows)
        rows = block.rows                                 # [r] places in idx of the rows with edges
        sub = torch.cat([block.recompute(slice(i, i + ROW_CHUNK)) >= thr for i in range(0, len(rows), ROW_CHUNK)]) \
            if len(rows) else torch.zeros(0, len(idx), dtype=torch.bool)
        kept = nodes[idx]
        inner = idx < self.token_start               # features and errors: need an outgoing edge
        feats = idx < self.n_features                # features: need an incoming edge too
        incoming = torch.zeros(len(idx), dtype=torch.bool)
        while True:
            before = kept.clone()
            kept[inner] &= sub[:, inner].any(0)
            incoming[rows] = sub.any(1)
            kept[feats] &= incoming[feats]
            if torch.equal(kept, before):
                break
            sub[~kept[rows]] = False
            sub[:, ~kept] = False
        nodes[idx] = kept
        edges = torch.from_numpy(np.zeros((self.n_nodes, self.n_nodes), dtype=np.bool_))  # untouched rows: no memory
        edges[idx[rows][:, None], idx[None, :]] = sub
        order = infl.sort(descending=True)
        cumulative = torch.zeros_like(infl)
        cumulative[order.indices] = order.values.cumsum(0) / order.values.sum()
        return Pruned(nodes, edges, cumulative, node_threshold, edge_threshold)

    def top_paths(self, k: int = 5, pruned: Pruned | None = None, beam: int = 64) -> list[dict[str, Any]]:
        """The k strongest token -> ... -> logit paths: strength = logit weight x the product of Â along
        the path (each step's share of its target's input), searched backward from the logits."""
        inv = self._influence_stats()["inv"]

        def row(t: int) -> torch.Tensor:  # Â[t], only the rows a search visits
            r = self.adjacency[t].double().abs() * inv[t]
            return r * pruned.edge_mask[t] if pruned is not None else r

        w = self.weights()
        frontier = [(float(w[i]), [i]) for i in range(self.logit_start, self.n_nodes) if w[i] > 0]
        done: list[tuple[float, list[int]]] = []
        while frontier:
            grown: list[tuple[float, list[int]]] = []
            for score, path in frontier:
                r = row(path[-1])
                nz = r.nonzero().flatten()
                for s in nz[r[nz].argsort(descending=True)[:beam]].tolist():
                    item = (score * float(r[s]), path + [s])
                    (done if self.token_start <= s < self.logit_start else grown).append(item)
            frontier = sorted(grown, key=lambda t: -t[0])[:beam]
        done.sort(key=lambda t: -t[0])
        return [{"strength": s, "nodes": list(reversed(p)), "words": " -> ".join(self.label(i) for i in reversed(p))}
                for s, p in done[:k]]

    def head_loadings(self, target: int | None = None, source: int | None = None, k: int | None = None) -> Any:
        """The head loadings (HeadLoadings), or one edge's split {"edge", "remainder", "heads": [{"layer",
        "head", "loading", "share"}, ...]} (target and source are node indices; k: the strongest k heads)."""
        if self.loadings is None:
            raise InputError("this graph has no head loadings: compute them with graphs.heads.head_loadings(model, "
                             "transcoders, graph, pruned) and set graph.loadings (`circuitlab graph` does)")
        if target is None and source is None:
            return self.loadings
        if target is None or source is None:
            raise InputError("give both the target and the source node of the edge")
        return self.loadings.for_edge(target, source, k)

    # ------------------------------------------------------------------ results
    def summary(self, pruned: Pruned | None = None) -> dict[str, Any]:
        s = self.scores()
        out = {"n_nodes": self.n_nodes, "n_feature_nodes": self.n_features,
               "n_active_features": len(self.active_features), "n_logits": self.n_logits,
               "logits": [{"label": l_, "token": int(t), "weight": float(w)}
                          for l_, t, w in zip(self.logit_labels, self.logit_tokens, self.logit_weights)],
               "replacement_score": s["replacement"], "completeness_score": s["completeness"]}
        if pruned is not None:
            out["pruned"] = {"node_threshold": pruned.node_threshold, "edge_threshold": pruned.edge_threshold,
                             "nodes": int(pruned.node_mask.sum()), "edges": int(pruned.edge_mask.sum()),
                             "features": int(pruned.node_mask[:self.n_features].sum())}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "n_layers": self.n_layers, "bos": self.bos, "token_nodes": self.token_nodes,
                "prompt": self.prompt,
                "token_strs": self.token_strs, "logit_labels": self.logit_labels, "transcoders": self.transcoders,
                "identity": self.identity, "info": self.info, "summary": self.summary()}

    def __repr__(self) -> str:
        return (f"Graph({self.n_pos} positions, {self.n_features} feature nodes of {len(self.active_features)} "
                f"active, {self.n_logits} logits, {self.n_nodes} nodes)")

    # ------------------------------------------------------------------ files
    def save(self, folder: str | Path) -> Path:
        """graph.safetensors (every tensor, exact) + graph.json (the rest), written as one folder atomically."""
        tensors = {"tokens": self.tokens, "active_features": self.active_features, "activations": self.activations,
                   "selected": self.selected, "adjacency": self.adjacency, "logit_tokens": self.logit_tokens,
                   "logit_weights": self.logit_weights}
        if self.loadings is not None:
            tensors.update(self.loadings.tensors())
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        meta = self.to_dict()
        with atomic_dir(Path(folder)) as tmp:
            save_file(tensors, str(tmp / TENSORS), metadata={"format": FORMAT})
            (tmp / META).write_text(json_text(meta, indent=1))
        return Path(folder)

    @classmethod
    def load(cls, folder: str | Path) -> "Graph":
        folder = Path(folder)
        if not (folder / TENSORS).is_file() or not (folder / META).is_file():
            raise CircuitlabError(f"{folder} holds no graph (expected {TENSORS} and {META})")
        text = read_text(folder / META, "graph metadata")   # names the byte if not UTF-8
        try:
            meta = json.loads(text)
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise CircuitlabError(f"{folder / META} is not a {FORMAT} file")
            t = load_file(str(folder / TENSORS))
            return cls(tokens=t["tokens"], active_features=t["active_features"], activations=t["activations"],
                       selected=t["selected"], adjacency=t["adjacency"], logit_labels=meta["logit_labels"],
                       logit_tokens=t["logit_tokens"], logit_weights=t["logit_weights"], n_layers=meta["n_layers"],
                       bos=meta["bos"], token_strs=meta["token_strs"], prompt=meta["prompt"],
                       transcoders=meta["transcoders"], info=meta["info"],
                       token_nodes=check_token_nodes(meta.get("token_nodes", TOKEN_NODES[0]),   # older files: embedding
                                                     f"{folder / META}'s token_nodes"),
                       identity=meta.get("identity"), loadings=HeadLoadings.from_tensors(t))
        except CircuitlabError:
            raise
        except Exception as e:  # noqa: BLE001 - a truncated or corrupt file is the user's to write again
            raise CircuitlabError(f"the graph in {folder} is corrupt or truncated ({type(e).__name__}: {e}); "
                                  "write it again with `circuitlab graph`") from None

