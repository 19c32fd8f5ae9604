"""Sweeps over (layer, position) that compute only what a patch changes, in one staggered pass per position.

A patch at layer l and position t changes nothing below layer l and, attention being causal, nothing before
position t. So each patched run starts from the base run's residual stream entering layer l, computes positions
>= t only, and reads the keys and values of the earlier positions from the base run (a KV cache, as in
incremental decoding: the model's own blocks with a LayerKV, rotary positions offset by its length). Patches at
one position are run together across layers: each joins the batch at its own layer, so one block call serves
every patch that has started below it (fewer, larger matmuls; the same arithmetic per row).

    values = grid_sweep(model, base, sites, metric, layers, positions)   # [n_patch]
    # the work it does, from the shapes: work.grid_flops (about 1/4 of the naive sweep over a full grid)

Exact: every row computes the same operations on the same inputs as a full forward with the patch applied by a
hook, at the positions and layers it computes; the others hold the base run's values, which are what the full
forward computes there (tests/analysis/patching/test_grid.py checks this against the naive definition in float64).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from circuitlab.analysis.patching.engine import BaseRun, Site, chunk_size, logits_buffer, patched_logits, position_chunks
from circuitlab.analysis.patching.metrics import Metric, metric_value, read_positions
from circuitlab.model.components import LayerKV

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def staggered_run(model: Transformer, base: BaseRun, sites: Sequence[Site], entries: Sequence[int], lo: int,
                  start: int = 0, width: int | None = None) -> torch.Tensor:
    """One chunk of patches, lo .. lo + len(entries) - 1 of every site's index, all at positions >= `start` (or
    addressing no position: start 0), patch c entering at layer entries[c] (sorted ascending).

    Patch c's rows join the batch at block entries[c] with the base run's residual stream entering it at
    positions start .. T - 1; positions before start read the base run's keys and values. width (local
    patches): a patch changes its entry block's output only at its own position, within start .. start +
    width - 1 (it patches an activation computed per position after attention mixed them: attn_out, mlp_out,
    z, ...), so that block runs there alone for it and the next block takes the base run's residual stream at
    the later positions (not at the last block: it runs whole).
    Returns the residual stream leaving the last block [chunk, batch, T - start, d_model].
    """
    B, T = base.logits.shape[:2]
    L = model.cfg.n_layers
    now = {"rows": slice(lo, lo), "first": start}
    hooks = [(s.hook, lambda act, hook, s=s: s.apply(act, now["rows"], now["first"])) for s in sites]

    def block(l: int, x: torch.Tensor, first: int, last: int) -> torch.Tensor:  # patches first .. last - 1
        now["rows"] = slice(lo + first, lo + last)
        kv = LayerKV()
        if start:
            c = last - first
            kv.append(base.keys[l][:, :start].repeat(c, 1, 1, 1), base.values[l][:, :start].repeat(c, 1, 1, 1))
        return model.blocks[l](x, kv)

    x = base.resid[0].new_empty(0, T - start, base.resid[0].shape[-1])
    n_in = 0  # the patches in the batch: the first n_in of the chunk (sorted by entry layer)
    with model.hooks(fwd_hooks=hooks):
        for l in range(entries[0], L):
            new = sum(1 for e in entries[n_in:] if e == l)
            if width is not None and new and l < L - 1:
                if n_in:
                    x = block(l, x, 0, n_in)
                at = block(l, base.resid[l][:, start:start + width].repeat(new, 1, 1), n_in, n_in + new)
                beyond = base.resid[l + 1][:, start + width:].repeat(new, 1, 1)
                x = torch.cat([x, torch.cat([at, beyond], dim=1)])
                n_in += new
                continue
            if new:
                x = torch.cat([x, base.resid[l][:, start:].repeat(new, 1, 1)])
                n_in += new
            x = block(l, x, 0, n_in)
    return x.view(len(entries), B, T - start, -1)


@torch.no_grad()
def grid_sweep(model: Transformer, base: BaseRun, sites: Sequence[Site], metric: Metric, layers: torch.Tensor,
               positions: torch.Tensor | None = None, local: bool = False, batch_size: int | None = None,
               progress: bool = True, desc: str = "patching") -> torch.Tensor:
    """The metric after each of n_patch patches; patch n applies every site's n-th index where the site is
    active for it (Site.active), and changes nothing below layers[n] [n_patch] nor, with positions [n_patch],
    before positions[n] (the query position it touches). local: see staggered_run. batch_size: patches per
    forward pass (default: chunk_size()). A chunk holds patches within T/8 positions of its first (more
    rows per pass on a shallow model, for 1/16 more positions recomputed on average), run from that position,
    its patches sorted by layer. Returns [n_patch] (float64)."""
    B, T = base.logits.shape[:2]
    L, n = model.cfg.n_layers, len(layers)
    pos = positions if positions is not None else torch.zeros(n, dtype=torch.long)
    order = (pos * (L + 1) + layers).argsort(stable=True)  # by position, then by entry layer
    eager = any(s.hook.endswith(("hook_pattern", "hook_attn_scores")) for s in sites)
    chunks = position_chunks(pos[order], n, batch_size or chunk_size(model, B, T, eager), max(1, T // 8))
    for lo, hi, _ in chunks:  # within a chunk, by entry layer: the patches in the batch are always its first ones
        order[lo:hi] = order[lo:hi][layers[order[lo:hi]].argsort(stable=True)]
    sites = [s.reordered(order) for s in sites]
    entries, pos = layers[order].tolist(), pos[order]
    reads = read_positions(metric, T)
    buffer = logits_buffer(base, max(hi - lo for lo, hi, _ in chunks), reads)
    out = torch.empty(n, dtype=torch.float64)  # metric values are Python floats; keep their precision
    with tqdm(total=n, desc=desc, unit="patch", delay=2.0, disable=not progress) as bar:
        for lo, hi, start in chunks:
            width = int(pos[lo:hi].max()) - start + 1 if local and positions is not None else None
            resid = staggered_run(model, base, sites, entries[lo:hi], lo, start, width)
            logits = patched_logits(model, base, resid, list(range(start, T)), reads, buffer)
            out[lo:hi] = torch.tensor([metric_value(metric, chunk) for chunk in logits], dtype=torch.float64)
            bar.update(hi - lo)
    return out[order.argsort()]
