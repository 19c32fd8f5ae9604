"""Circuits from edge scores: top-n, threshold or greedy selection, pruning, and evaluation by running.

    circuit = select_circuit(scores, n=20)                 # top 20 by |score|, pruned to input -> logits
    circuit = select_circuit(scores, threshold=0.05)       # every edge with |score| >= 0.05
    circuit = select_circuit(scores, n=20, greedy=True)    # grown from the logits, best connected edge first
    values = circuit_metric(model, clean, corrupt, metric, [circuit.edges])   # the metric with only C kept

Running a circuit C: the clean prompt goes through the graph with every edge outside C patched (to
the corrupted run's output, zero or a mean, as the scores were made), so only C carries clean signal.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.edges.forward import graph_forward
from circuitlab.analysis.edges.edge_graph import EdgeGraph
from circuitlab.analysis.edges.scoring import (DEFAULT_INTERVENTION, EdgeScores, _copies_per_run, check_edge_request,
                                               per_copy, reference)
from circuitlab.analysis.patching import Metric, read_positions
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class Circuit:
    """A set of edges of a graph. edges [n_edges] bool (graph.edges order); how: the rule that chose them."""

    graph: EdgeGraph
    edges: torch.Tensor
    how: str = ""
    scores: torch.Tensor | None = None  # [n_edges], when chosen from scores

    @property
    def n_edges(self) -> int:
        return int(self.edges.sum())

    def edge_list(self) -> list[tuple[str, str]]:
        all_edges = self.graph.edges
        return [all_edges[i] for i in self.edges.nonzero().flatten().tolist()]

    def nodes(self) -> list[str]:
        """The nodes the circuit's edges touch, in graph order."""
        pairs = self.graph.edge_pairs[self.edges]
        used = {self.graph.sources[s] for s in pairs[:, 0].tolist()}
        used |= {self.graph.reader_node[r] for r in pairs[:, 1].tolist()}
        return [n for n in self.graph.nodes if n in used]

    def contains(self, source: str, reader: str) -> bool:
        return bool(self.edges[self.graph.edge_index(source, reader)])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"how": self.how, "n_edges": self.n_edges, "of": self.graph.n_edges,
                               "nodes": self.nodes()}
        idx = self.edges.nonzero().flatten().tolist()
        edges = self.graph.edges
        out["edges"] = [[*edges[i], None if self.scores is None else round(float(self.scores[i]), 8)] for i in idx]
        return out

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{s}</td><td>{r}</td><td>{'' if v is None else f'{v:+.4g}'}</td></tr>"
                       for s, r, v in self.to_dict()["edges"][:30])
        return (f"<b>Circuit</b> ({self.how}): {self.n_edges} of {self.graph.n_edges} edges, nodes "
                f"{', '.join(self.nodes())}<table><tr><th>from</th><th>to</th><th>score</th></tr>{rows}</table>")


def prune(graph: EdgeGraph, edges: torch.Tensor) -> torch.Tensor:
    """Keep only edges on a path input -> ... -> logits inside the set. edges [n_edges] bool -> same."""
    keep = edges.clone().bool()
    src, rdr = graph.edge_pairs.T
    feeds = graph.feeds[rdr]  # [n_edges, n_nodes]: the nodes each edge's reader feeds
    S = len(graph.sources)
    reached = torch.zeros(S + 1, dtype=torch.bool)
    reached[0] = True
    for s in range(1, S):  # sources are in forward order: everything feeding s is decided before s
        reached[s] = bool((keep & feeds[:, s] & reached[src]).any())
    useful = torch.zeros(S + 1, dtype=torch.bool)
    useful[S] = True
    for s in reversed(range(S)):
        useful[s] = bool((keep & (src == s) & (feeds & useful).any(1)).any())
    return keep & reached[src] & useful[src] & (feeds & useful & torch.cat([reached[:S], torch.ones(1, dtype=torch.bool)])).any(1)


def select_circuit(scores: EdgeScores, n: int | None = None, threshold: float | None = None, greedy: bool = False,
                   prune_unconnected: bool = True) -> Circuit:
    """Edges chosen by |score|: the top n, those with |score| >= threshold, or (greedy) n edges grown from the
    logits, each time the best edge into a node already connected to the logits. Pruned to edges that
    connect input to logits unless prune_unconnected=False. An empty result is an error."""
    graph, mag = scores.graph, scores.scores.abs()
    if (n is None) == (threshold is None):
        raise CircuitlabError("choose the circuit by exactly one of n (number of edges) or threshold (|score|)")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise CircuitlabError(f"n must be a positive number of edges, got {n!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0 <= threshold < float("inf")):  # NaN fails the comparison too
        raise CircuitlabError(f"threshold must be a finite |score| >= 0, got {threshold!r}")
    if greedy and n is None:
        raise CircuitlabError("greedy selection grows a circuit to n edges; give n, not a threshold")
    if threshold is not None:
        chosen = mag >= threshold
        how = f"|score| >= {threshold:g}"
    elif greedy and n is not None:  # greedy without n was refused above
        chosen = _greedy(graph, mag, n)
        how = f"greedy {n} edges"
    else:
        chosen = torch.zeros(graph.n_edges, dtype=torch.bool)
        chosen[scores.order()[:n]] = True
        how = f"top {n} edges"
    if prune_unconnected:
        chosen = prune(graph, chosen)
        how += ", pruned to input -> logits paths"
    if not bool(chosen.any()):
        best = float(mag.max()) if len(mag) else 0.0
        raise CircuitlabError(f"the selection ({how}) keeps no edge (largest |score| {best:.4g}); lower the "
                              "threshold or raise the number of edges")
    return Circuit(graph, chosen, how, scores.scores)


def _greedy(graph: EdgeGraph, mag: torch.Tensor, n: int) -> torch.Tensor:
    src, rdr = graph.edge_pairs.T
    feeds = graph.feeds[rdr]  # [n_edges, n_nodes]
    chosen = torch.zeros(graph.n_edges, dtype=torch.bool)
    connected = torch.zeros(len(graph.sources) + 1, dtype=torch.bool)
    connected[-1] = True  # the logits
    for _ in range(min(n, graph.n_edges)):
        open_ = ~chosen & (feeds & connected).any(1)
        if not bool(open_.any()):
            break
        best = int(torch.where(open_, mag, torch.tensor(-1.0, dtype=mag.dtype)).argmax())
        chosen[best] = True
        connected[src[best]] = True
    return chosen


def circuit_metric(model: Transformer, clean, corrupt, metric: Metric, circuits: Sequence[torch.Tensor], *,
                   intervention: str = DEFAULT_INTERVENTION, batch_size: int | None = None) -> torch.Tensor:
    """The metric of the clean run with every edge outside each circuit patched.

    clean, corrupt [batch, pos]; circuits: edge sets, each [n_edges] bool. Returns [n_circuits] (float64);
    the circuits run as copies in batched forward passes.
    """
    clean, corrupt = check_edge_request(model, clean, corrupt, metric, "exact", intervention)
    graph = EdgeGraph.of(model)
    with torch.no_grad():
        clean_run = graph_forward(model, graph, clean)
        ref = reference(model, graph, clean, corrupt, intervention, clean_run)
        return _run_circuits(model, graph, clean, metric, ref, circuits, batch_size)


def _run_circuits(model: Transformer, graph, clean, metric, ref, circuits, batch_size=None) -> torch.Tensor:
    chunk = batch_size or _copies_per_run(model, graph, clean)
    reads = read_positions(metric, clean.shape[1])  # logits only where the metric reads them
    out = []
    allowed = graph.allowed.to(ref.device)
    for c in range(0, len(circuits), chunk):
        keep = torch.stack([graph.dense(torch.as_tensor(e, dtype=torch.bool).to(ref.device))
                            for e in circuits[c:c + chunk]])
        mask = (allowed & ~keep).to(ref.dtype)  # patched outside the circuit
        with torch.no_grad():
            run = graph_forward(model, graph, clean, ref=ref, mask=mask, reads=reads)
            out.append(per_copy(metric, run.logits).double().cpu())
    return torch.cat(out)


def refine_circuit(model: Transformer, clean, corrupt, metric: Metric, circuit: Circuit, *,
                   intervention: str = DEFAULT_INTERVENTION,
                   tolerance: float = 0.01, batch_size: int | None = None, sequential: bool = False) -> Circuit:
    """ACDC-style exact refinement of a (pruned) candidate circuit: readers are visited from the logits down;
    an edge is dropped when removing it moves the metric by less than tolerance × |m(model) − m(empty circuit)|.
    Batched (default): every circuit edge into a reader is tried on its own in one batched run and the weak
    ones are dropped together. sequential=True is ACDC itself: the edges into a reader are tried one at a
    time, each against the circuit left by the removals before it (one run per edge).
    Returns the refined Circuit (pruned again)."""
    clean, corrupt = check_edge_request(model, clean, corrupt, metric, "exact", intervention)
    graph = circuit.graph
    with torch.no_grad():
        clean_run = graph_forward(model, graph, clean)
        ref = reference(model, graph, clean, corrupt, intervention, clean_run)
    full = torch.ones(graph.n_edges, dtype=torch.bool)
    ends = _run_circuits(model, graph, clean, metric, ref, [full, ~full], batch_size)
    gap = abs(float(ends[0] - ends[1]))
    edges = circuit.edges.clone()
    readers = graph.edge_pairs[:, 1]
    for r in reversed(range(len(graph.readers))):
        idx = (edges & (readers == r)).nonzero().flatten()
        if len(idx) == 0:
            continue
        current = float(_run_circuits(model, graph, clean, metric, ref, [edges], batch_size)[0])
        if sequential:
            for i in idx.tolist():
                trial = edges.clone()
                trial[i] = False
                value = float(_run_circuits(model, graph, clean, metric, ref, [trial], batch_size)[0])
                if abs(value - current) < tolerance * gap:
                    edges, current = trial, value
            continue
        trials = []
        for i in idx.tolist():
            e = edges.clone()
            e[i] = False
            trials.append(e)
        values = _run_circuits(model, graph, clean, metric, ref, trials, batch_size)
        drop = idx[(values - current).abs() < tolerance * gap]
        edges[drop] = False
    edges = prune(graph, edges)
    if not bool(edges.any()):
        raise CircuitlabError("refinement removed every edge: the metric barely changes without them; "
                              "lower the tolerance")
    how = "one edge at a time (ACDC)" if sequential else "batched per reader"
    return Circuit(graph, edges, f"{circuit.how}, refined by exact patching {how} (tolerance {tolerance:g})",
                   circuit.scores)





def edge_auc(scores: EdgeScores | torch.Tensor, truth: Sequence[tuple[str, str]], graph: EdgeGraph | None = None
             ) -> float:
    """ROC AUC of |score| against a known set of edges: the chance that a true edge outranks a false one
    (ties count half). scores: EdgeScores or [n_edges] with graph; truth: (source, reader) pairs."""
    graph = scores.graph if isinstance(scores, EdgeScores) else graph
    if graph is None:
        raise CircuitlabError("edge_auc: scores given as a tensor need their graph (graph=...)")
    values = (scores.scores if isinstance(scores, EdgeScores) else scores).abs().double()
    is_true = torch.zeros(graph.n_edges, dtype=torch.bool)
    for s, r in truth:
        is_true[graph.edge_index(s, r)] = True
    pos, neg = values[is_true], values[~is_true]
    if len(pos) == 0 or len(neg) == 0:
        raise CircuitlabError("the AUC needs at least one true and one false edge")
    greater = (pos[:, None] > neg[None, :]).double().sum() + 0.5 * (pos[:, None] == neg[None, :]).double().sum()
    return float(greater / (len(pos) * len(neg)))
__all__ = ["Circuit", "circuit_metric", "edge_auc", "prune", "refine_circuit", "select_circuit"]
