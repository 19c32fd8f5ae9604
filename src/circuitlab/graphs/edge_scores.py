"""Pruning's edge scores without an n x n float64 matrix, and the edge cut found in their own memory.

    block = KeptEdgeScores(adjacency, idx, weights)     # idx [k]: the kept nodes; block.scores [r, k] float64
    thr = threshold_in_place(block.scores, 0.98, k * k)   # graph.threshold_for's answer, bit for bit
    block.recompute(slice(0, 1024)) >= thr          # a chunk of rows' scores again, the same values

The edge influence among the kept nodes is Â[t, s] * (influence of t + weight of t) on that block of the
adjacency (graph.edge_influence). Only the rows with an edge among the kept nodes are held (features and logits:
error and token rows are zero), built a chunk of rows at a time from the adjacency in its own dtype; the cut
(threshold_for: the smallest of the top scores holding a share of their total) moves the non-zero scores to the
front of the block, sorts them there and sums them a chunk at a time, instead of sorted, indexed and summed copies
of the whole block.
"""
from __future__ import annotations

import numpy as np
import torch

from circuitlab.errors import CircuitlabError

ROW_CHUNK = 1024  # rows made float64 at a time


class KeptEdgeScores:
    """The edge influence among the kept nodes idx [k] (edge_influence of that block of the adjacency), held as rows
    [r, k] float64 for the r kept nodes whose rows have an edge among them (features and logits: error and
    token rows are zero, and a zero row adds nothing to influence's walk), built and scored a chunk of rows at a
    time from the adjacency. recompute(rows) makes a chunk again with the same operations (the same values)."""

    def __init__(self, adjacency: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> None:
        self.adjacency, self.idx = adjacency, idx
        nonzero = torch.cat([adjacency[idx[i:i + 256, None], idx[None, :]].ne(0).any(1)
                             for i in range(0, len(idx), 256)]) if len(idx) else idx.bool()
        self.rows = nonzero.nonzero().flatten()                            # [r] places in idx
        a = torch.empty(len(self.rows), len(idx), dtype=torch.float64)
        for i in range(0, len(self.rows), ROW_CHUNK):
            a[i:i + ROW_CHUNK] = adjacency[idx[self.rows[i:i + ROW_CHUNK], None], idx[None, :]]
        a.abs_()
        self.sums = a.sum(dim=1, keepdim=True).clamp(min=1e-10)            # [r, 1]
        a /= self.sums                                                     # Â's rows
        step = weights[self.rows].to(a.dtype) @ a                           # influence(Â, w), on the rows alone
        total = step.clone()
        for _ in range(10_000):
            if not bool(step.any()):
                break
            step = step[self.rows] @ a
            total += step
        else:
            raise CircuitlabError("influence did not converge: the adjacency has a cycle (not an attribution graph)")
        self.factor = (total + weights.to(a.dtype))[self.rows, None]         # [r, 1]
        a *= self.factor
        self.scores = a

    def recompute(self, rows: slice) -> torch.Tensor:
        """The scores of rows [rows] again: [len, k] float64."""
        a = self.adjacency[self.idx[self.rows[rows], None], self.idx[None, :]].double().abs_()
        a /= self.sums[rows]
        a *= self.factor[rows]
        return a


def threshold_in_place(values: torch.Tensor, fraction: float, n_all: int) -> torch.Tensor:
    """threshold_for(values, fraction) for scores among n_all (values holds the non-zero ones, and maybe zeros),
    in values' own memory, which it overwrites: the non-zero scores moved to its front and sorted there (no
    copy, no sort indices, a chunk of the running sum at a time). The same threshold, bit for bit."""
    flat, n = values.view(-1), 0
    for i in range(0, len(flat), 2 ** 22):
        part = flat[i:i + 2 ** 22]
        nz = part[part != 0]
        flat[n:n + len(nz)] = nz
        n += len(nz)
    if not n:
        return flat.new_zeros(())
    ordered = flat[:n]
    arr = ordered.numpy()
    np.negative(arr, out=arr)
    arr.sort()                                  # ascending of the negated: descending, in place
    np.negative(arr, out=arr)
    total, carry = float(ordered.sum()), np.zeros(1)
    for start in range(0, n, 2 ** 22):          # torch's cumsum is sequential: carried over, the same sums
        cum = np.cumsum(np.concatenate([carry, arr[start:start + 2 ** 22]]))[1:]
        j = int(np.searchsorted(cum / total, fraction, side="left"))
        if j < len(cum):
            return ordered[start + j].clone()
        carry = cum[-1:]
    return flat.new_zeros(()) if n < n_all else ordered[-1].clone()   # past the last: a zero, if any
