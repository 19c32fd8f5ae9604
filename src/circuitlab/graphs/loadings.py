"""Head loadings: each cross-position edge of a graph split over the attention heads that carried it.

An edge from a source at position ps to a target at position pt != ps only exists because heads moved the
source's contribution across positions. Every path of the frozen linear system from ps to pt has a last
step that changes position: a head (layer, head) reading a key k != pt from query pt. Grouping the paths by
that step splits the edge exactly: heads [n_edges, n_layers, n_heads] sum to the edge, and the remainder
(edge - the heads' sum) is what stayed at one position (zero for a cross-position edge, up to rounding).
This module is the container (stored in the graph file); graphs/heads.py computes it.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import torch

from circuitlab.display import Displayed
from circuitlab.errors import InputError


@dataclass
class HeadLoadings(Displayed):
    """edges [n, 2] (target node, source node) of the graph; heads [n, n_layers, n_heads] float64, each
    head's share of the edge; edge [n] float64, the graph's edge weight; remainder [n] = edge - heads' sum."""

    edges: torch.Tensor
    heads: torch.Tensor
    edge: torch.Tensor

    @property
    def remainder(self) -> torch.Tensor:
        return self.edge - self.heads.sum((1, 2))

    def __len__(self) -> int:
        return len(self.edges)

    def find(self, target: int, source: int) -> int:
        """The row of the edge (target node, source node), or an InputError."""
        hit = ((self.edges[:, 0] == target) & (self.edges[:, 1] == source)).nonzero()
        if not len(hit):
            raise InputError(f"no head loadings for the edge {source} -> {target}: it is not a cross-position edge "
                             "of those the loadings were computed for (the pruned graph's, by default)")
        return int(hit[0, 0])

    def for_edge(self, target: int, source: int, k: int | None = None) -> dict[str, Any]:
        """{"edge", "remainder", "heads": [{"layer", "head", "loading", "share"}, ...] by |loading|, the
        strongest k (all non-zero when None)}."""
        i = self.find(target, source)
        row = self.heads[i]
        flat = row.flatten()
        order = flat.abs().argsort(descending=True)
        n_heads = row.shape[1]
        edge = float(self.edge[i])
        heads = [{"layer": int(j) // n_heads, "head": int(j) % n_heads, "loading": float(flat[j]),
                  "share": float(flat[j]) / edge if edge else 0.0} for j in order.tolist() if flat[j] != 0]
        return {"target": target, "source": source, "edge": edge, "remainder": float(self.remainder[i]),
                "heads": heads if k is None else heads[:k]}

    def head_totals(self) -> torch.Tensor:
        """[n_layers, n_heads]: each head's summed |loading| over the edges (which heads carry the graph)."""
        return self.heads.abs().sum(0)

    # ------------------------------------------------------------------ files
    def tensors(self) -> dict[str, torch.Tensor]:
        return {"loading_edges": self.edges, "loading_heads": self.heads, "loading_edge": self.edge}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor]) -> "HeadLoadings | None":
        """From a graph file's tensors; None for a file written before loadings existed (or without them)."""
        if "loading_heads" not in t:
            return None
        return cls(t["loading_edges"], t["loading_heads"], t["loading_edge"])

    # ------------------------------------------------------------------ results
    def to_dict(self, k: int = 10) -> dict[str, Any]:
        totals = self.head_totals()
        order = totals.flatten().argsort(descending=True)[:k].tolist()
        n_heads = totals.shape[1]
        return {"n_edges": len(self), "max_abs_remainder": float(self.remainder.abs().max()) if len(self) else 0.0,
                "heads": [{"layer": j // n_heads, "head": j % n_heads, "total_abs_loading": float(totals.flatten()[j])}
                          for j in order if totals.flatten()[j] > 0]}

    def __repr__(self) -> str:
        return f"HeadLoadings({len(self)} cross-position edges over {tuple(self.heads.shape[1:])} layers x heads)"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>L{h['layer']}H{h['head']}</td><td>{h['total_abs_loading']:.3g}</td></tr>"
                       for h in self.to_dict()["heads"])
        return (f"<div><b>Head loadings</b> of {len(self)} cross-position edges<table><tr><th>head</th>"
                f"<th>sum of |loading|</th></tr>{rows}</table></div>")


def loadings_html(loadings: HeadLoadings, labels: list[str], k: int = 5) -> str:
    """The strongest edges' heads as text (the report): labels[i] is node i's label."""
    order = loadings.edge.abs().argsort(descending=True)[:k].tolist()
    items = []
    for i in order:
        t, s = loadings.edges[i].tolist()
        e = loadings.for_edge(t, s, 3)
        heads = ", ".join(f"L{h['layer']}H{h['head']} {h['loading']:+.3g}" for h in e["heads"])
        items.append(f"<li>{html.escape(labels[s])} → {html.escape(labels[t])} ({e['edge']:+.3g}): {heads}</li>")
    return f"<ul>{''.join(items)}</ul>"
