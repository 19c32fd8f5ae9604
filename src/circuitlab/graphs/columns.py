"""Adjacency columns from a backward pass's gradients: every source (features, errors, tokens), in node order.

    cols = Columns(rm, features, values, dtype)                 # features [n, 3] (layer, pos, feature)
    rows = cols.rows(grads_out, grad_embed)                     # [rows, n_cols]

A feature's column is its activation times its decoder vector into each layer it writes, dotted with the
gradient there. A source layer's features are laid out per position, padded to the most any position has
([pos, m]), so that one batched product per (source layer, layer written) gives every row's edges from all of
them: [pos, rows, d_model] @ [pos, d_model, m]. The decoder vectors are gathered from the transcoders (in their
storage dtype) a block of positions at a time (BLOCK_FLOATS) and dropped after it: memory holds one block,
never a compute-dtype copy per active feature (a 1,024-token prompt has ~786,000 of them on GPT-2 small: 2.4 GB
of float32), and a long prompt's block is a short one's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitlab.graphs.options import DEFAULTS
from circuitlab.graphs.replacement import ReplacementModel

# Decoder vectors made at once (float32 values, 16 MiB): a block of positions of one source layer's features, so
# that a long prompt's pass holds the same block as a short one's.
BLOCK_FLOATS = 2 ** 22


@dataclass
class _Block:
    """One source layer's features as they write into one layer: cols [n] (their columns), slot [n] (their place
    in the padded [pos * m] layout), feats / vals [pos * m] (feature and activation at each place; 0 where
    padded), i: the written layer's index in writes(source)."""

    source: int
    i: int
    cols: torch.Tensor
    slot: torch.Tensor
    feats: torch.Tensor
    vals: torch.Tensor
    m: int


class Columns:
    """Turns gradients at the sources' places into adjacency columns (see the module docstring)."""

    @torch.no_grad()
    def __init__(self, rm: ReplacementModel, features: torch.Tensor, values: torch.Tensor, dtype: torch.dtype,
                 token_nodes: str = DEFAULTS.token_nodes) -> None:
        tc, T = rm.tc, rm.n_pos
        self.tc, self.dtype = tc, dtype
        self.n_feat, self.T, self.L = len(features), T, tc.n_layers
        self.n_cols = self.n_feat + (self.L + 1) * T
        # Features are sorted by (layer, pos, feature): one layer's are adjacent columns.
        self.blocks: dict[int, list[_Block]] = {}      # by written layer
        for layer in tc.layers:
            mine = (features[:, 0] == layer).nonzero().flatten()
            if not len(mine):
                continue
            pos = features[mine, 1]
            counts = torch.bincount(pos, minlength=T)
            m = int(counts.max())
            first = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
            slot = pos * m + (torch.arange(len(mine), device=pos.device) - first[pos])   # [n] place in [T * m]
            feats = features.new_zeros(T * m)
            feats[slot] = features[mine, 2]
            vals = torch.zeros(T * m, dtype=dtype, device=values.device)
            vals[slot] = values[mine].to(dtype)
            for i, k in enumerate(tc.writes(layer)):
                self.blocks.setdefault(k, []).append(_Block(layer, i, mine, slot, feats, vals, m))
        errs = torch.stack([rm.errors[k] for k in range(self.L)]).to(dtype).clone()   # [L, T, d]
        if rm.bos:
            errs[:, 0] = 0  # position 0's MLP output is a constant, not a node
        self.errors = errs
        self.embeds = rm.token_vectors(token_nodes).to(dtype)

    def decoder_block(self, b: _Block, target: int, p0: int, p1: int) -> torch.Tensor:
        """act * decoder vector into `target` of block b's places at positions p0..p1-1: [p1 - p0, m, d_model]."""
        dec = self.tc.decoder_rows(b.source, target, b.feats[p0 * b.m:p1 * b.m]).to(self.dtype)
        return (dec * b.vals[p0 * b.m:p1 * b.m, None]).view(p1 - p0, b.m, -1)

    @torch.no_grad()
    def rows(self, grads_out: dict[int, torch.Tensor], grad_embed: torch.Tensor) -> torch.Tensor:
        """grads_out {layer: [rows, pos, d_model]}, grad_embed [rows, pos, d_model] -> [rows, n_cols]."""
        R, P = grad_embed.shape[:2]  # a pass over the first P positions: later sources get no gradient
        rows = grad_embed.new_zeros(R, self.n_cols)
        for k, g in grads_out.items():
            gt = g.transpose(0, 1)                                                   # [P, R, d]
            for b in self.blocks.get(k, ()):
                step = max(1, BLOCK_FLOATS // (b.m * gt.shape[-1]))               # positions per decoder block
                for p0 in range(0, P, step):
                    p1 = min(P, p0 + step)
                    dec = self.decoder_block(b, k, p0, p1)
                    edges = torch.bmm(gt[p0:p1], dec.transpose(1, 2)).transpose(0, 1)   # [R, p1 - p0, m]
                    del dec
                    here = (b.slot >= p0 * b.m) & (b.slot < p1 * b.m)             # sources at these positions
                    rows[:, b.cols[here]] += edges.reshape(R, -1)[:, b.slot[here] - p0 * b.m]
            start = self.n_feat + k * self.T
            rows[:, start:start + P] = (g * self.errors[k][:P]).sum(-1)
        start = self.n_feat + self.L * self.T
        rows[:, start:start + P] = (grad_embed * self.embeds[:P]).sum(-1)
        return rows
