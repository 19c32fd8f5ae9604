"""The batched patching engine: many patches in one forward pass, skipping work whose result is known
(see circuitlab.analysis.patching's docstring for the shortcuts)."""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.analysis.patching.metrics import Metric, metric_value, read_positions
from circuitlab.model.components import LayerKV
from circuitlab.model.hooks import act_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

# Float elements one chunk may hold in its largest activations (about 256 MB in fp32): a size for speed (larger
# chunks are no faster); a pass's share of the memory budget bounds it where that is less (chunk_size).
CHUNK_BUDGET = 2 ** 26
# The share of the machine's matmul speed a batched patching pass reaches on a CPU: turns flops into seconds.
# Measured with benchmarks/bench_scale.py (resid_pre sweeps at 64 tokens, load ~10): ~1.0 on GPT-2 small's shape,
# ~0.26 on Llama-3.2-1B's at 4 layers; between them, the estimate is within ~2x of either.
PATCH_EFFICIENCY = 0.45


@dataclass
class BaseRun:
    """What patched runs reuse from the unpatched run they modify.

    resid[l]: the residual stream entering layer l [batch, pos, d_model]; keys[l], values[l]: layer l's
    keys and values as the KV cache holds them (after rotary) [batch, pos, kv_head, d_head];
    logits [batch, pos, d_vocab].
    """

    resid: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor

    @classmethod
    def of(cls, model: Transformer, tokens: torch.Tensor, names: Sequence[str] = ()):
        """Run `tokens` [batch, pos] once; returns (BaseRun, ActivationCache of the extra hook `names`)."""
        L = range(model.cfg.n_layers)
        k = "rot_k" if model.cfg.positional == "rotary" else "k"
        own = [act_name(n, l) for n in ("resid_pre", k, "v") for l in L]
        logits, cache = model.run_with_cache(tokens, names_filter=sorted(set(own) | set(names)))
        base = cls([cache["resid_pre", l] for l in L], [cache[k, l] for l in L], [cache["v", l] for l in L], logits)
        return base, cache


@dataclass
class Site:
    """One hook of a batched sweep: patch n sets act[:, index[n]] (over `dims`) to the source.

    source: [batch, ...] shared by all patches, or [n_patch, batch, ...] when per_patch (each
    broadcastable to the activation); dims: the activation dims (batch excluded) the columns of
    index [n_patch, len(dims)] address; empty dims patch the whole activation. pos_dim: the
    activation dim (batch excluded) holding the (query) position, needed to run from a later position.
    active: [n_patch] bool, the patches this site takes part in (None: all); a sweep over several layers
    (grid.grid_sweep) gives each layer's site the patches of that layer.
    """

    hook: str
    source: torch.Tensor
    dims: tuple[int, ...]
    index: torch.Tensor
    per_patch: bool = False
    pos_dim: int | None = None
    active: torch.Tensor | None = None

    def reordered(self, order: torch.Tensor) -> "Site":
        """The same site with its patches in `order` [n_patch] (a permutation)."""
        return dataclasses.replace(self, index=self.index[order], source=self.source[order] if self.per_patch
                                   else self.source, active=None if self.active is None else self.active[order])

    def apply(self, act: torch.Tensor, rows: slice, start: int = 0) -> torch.Tensor:
        """act [chunk * batch, ...] with patch c of the chunk applied to rows c*batch .. c*batch + batch - 1.

        start: the first position the run computes (act holds positions start .. start + n - 1 only); a
        patch at a position outside them changes nothing in this run.
        """
        idx = self.index[rows]
        src = self.source[rows] if self.per_patch else self.source
        inside = None
        if self.pos_dim is not None:  # the run may compute only some positions: take the same ones
            lead, n = (2 if self.per_patch else 1), act.shape[1 + self.pos_dim]
            src = src.narrow(lead + self.pos_dim, start, n)
            if self.hook.endswith(("hook_pattern", "hook_attn_scores")):  # and only the keys it has
                src = src[..., : act.shape[-1]]
            if self.pos_dim in self.dims:
                k = self.dims.index(self.pos_dim)
                idx = idx.clone()
                idx[:, k] -= start
                inside = (idx[:, k] >= 0) & (idx[:, k] < n)
        C = len(idx)
        grouped = act.view(C, -1, *act.shape[1:])  # [chunk, batch, ...]
        shape = [act.shape[1 + d] if d in self.dims else 1 for d in range(act.dim() - 1)]
        mask = torch.zeros(C, *shape, dtype=torch.bool, device=act.device)
        where = [torch.arange(C)]
        for d in range(act.dim() - 1):
            where.append(idx[:, self.dims.index(d)] if d in self.dims else torch.zeros(C, dtype=torch.long))
        if self.active is not None:
            inside = self.active[rows] if inside is None else inside & self.active[rows]
        if inside is not None:
            where = [w[inside] for w in where]
        mask[tuple(w.to(act.device) for w in where)] = True
        return torch.where(mask[:, None], src.to(act.device, act.dtype), grouped).view_as(act)


def chunk_floats(model: Transformer, pos: int, eager: bool = False) -> int:
    """Floats one patch's copy of a row of `pos` tokens holds in a patched run: the residual stream and a block's
    working set, the MLP's hidden, its logits (the metric's buffer); with eager attention its scores and pattern."""
    cfg = model.cfg
    per_row = pos * (4 * cfg.d_model + cfg.d_vocab + (0 if cfg.attn_only else 2 * cfg.mlp_dim))
    if eager:  # scores and pattern are materialised
        per_row += 2 * cfg.n_heads * pos * pos
    return per_row


def chunk_size(model: Transformer, batch: int, pos: int, eager: bool = False) -> int:
    """Patches per forward pass so that a chunk's largest activations stay within CHUNK_BUDGET floats (a size
    for speed: larger chunks are no faster), or a pass's share of the memory budget where that is less."""
    return max(1, min(CHUNK_BUDGET, memory.floats(memory.PASS_SHARE)) // (chunk_floats(model, pos, eager) * batch))


def base_run_floats(model: Transformer, batch: int, pos: int) -> int:
    """Floats BaseRun.of holds for tokens [batch, pos]: every layer's residual stream, keys and values, and the
    logits."""
    cfg = model.cfg
    return batch * pos * (cfg.n_layers * (cfg.d_model + 2 * cfg.kv_heads * cfg.head_dim) + cfg.d_vocab)


def hook_floats(model: Transformer, hook: str, batch: int, pos: int) -> int:
    """Floats of one layer's activation at a patching target's hook (short name: resid_pre, z, k, pattern, ...)
    for tokens [batch, pos]."""
    cfg = model.cfg
    per_pos = {"z": cfg.n_heads * cfg.head_dim, "q": cfg.n_heads * cfg.head_dim, "k": cfg.kv_heads * cfg.head_dim,
               "v": cfg.kv_heads * cfg.head_dim, "pattern": cfg.n_heads * pos}.get(hook, cfg.d_model)
    return batch * pos * per_pos


def sweep_estimate(model: Transformer, batch: int, pos: int, targets: Sequence[str] | None = None,
                   n_layers: int | None = None, layers: Sequence[int] | None = None) -> memory.Estimate:
    """What patching_sweep over `targets` (names; default: default_targets) on prompts [batch, pos] holds at its
    peak and computes: the base run (BaseRun.of), the source run's cache of every target's hook at every swept
    layer (n_layers; default all), and the largest chunk of patched copies (chunk_size, or the
    patches a chunk of one position holds). The flops: each patch from its layer (and position) on, unembedded at
    one read position (work.grid_flops), the swept layers taken from the bottom (the most work), or `layers`: those
    swept."""
    from circuitlab.analysis.patching.work import full_grid, grid_flops
    from circuitlab.analysis.patching.targets import default_targets, get_target
    from circuitlab.model import model_dtype

    chosen = [get_target(model, t) for t in (default_targets(model) if targets is None else
                                             [targets] if isinstance(targets, str) else targets)]
    cfg = model.cfg
    swept = list(layers) if layers is not None else list(range(cfg.n_layers if n_layers is None else n_layers))
    L = len(swept)
    size = model_dtype(model).itemsize
    source = sum(L * hook_floats(model, t.hook, batch, pos) for t in chosen)   # its logits are freed before the sweep
    chunk, flops, n_all = 0, 0.0, 0
    for t in chosen:
        eager = t.hook == "pattern"
        sizes = {"pos": pos, "dest_pos": pos, "head": cfg.kv_heads if t.hook in ("k", "v") else cfg.n_heads}
        n = math.prod(sizes[a] for a in t.axes)
        together = L * (max(1, pos // 8) * n // pos if t.pos_axis is not None else n)  # grid.grid_sweep's chunks
        c = max(1, min(chunk_size(model, batch, pos, eager), together))
        chunk = max(chunk, c * batch * chunk_floats(model, pos, eager))
        if t.pos_axis is not None:  # n // pos patches (heads) at each (layer, position)
            grid, starts = full_grid(L, pos)
            flops += batch * (n // pos) * grid_flops(cfg, pos, [swept[i] for i in grid], starts, t.local)
        else:
            flops += batch * n * grid_flops(cfg, pos, swept)
        n_all += L * n
    parts = {"base run": base_run_floats(model, batch, pos) * size, "source activations": source * size,
             "a chunk of patched runs": chunk * size}
    return memory.Estimate(f"activation patching ({n_all:,} patches of {batch} x {pos} tokens, "
                           f"{len(chosen)} target{'s' if len(chosen) != 1 else ''})", parts,
                           held=memory.tensor_bytes(model), flops=flops, efficiency=PATCH_EFFICIENCY)


def patched_run(model: Transformer, base: BaseRun, layer: int, sites: Sequence[Site], rows: slice, start: int = 0,
                width: int | None = None, reads: Sequence[int] | None = None, stop: int | None = None,
                extra_hooks: Sequence = ()) -> tuple[torch.Tensor, list[int]]:
    """One chunk of patches in one forward pass, from the base run's residual stream entering `layer`.

    rows: which patches (of every site's index) form the chunk. The shortcuts skip work whose
    result is the base run's, or that nothing reads:
    start: patches at position >= start change nothing before it (attention is causal), so those
        positions are not recomputed; their keys and values come from the base run, as in
        incremental decoding.
    width: patches of activations computed per position after attention has mixed positions (z,
        attn_out, mlp_out, ...) change block `layer`'s output only at their own position, so that
        block runs on positions start .. start + width - 1 only, and the next block takes the base
        run's residual stream beyond them.
    reads: the only positions whose final output is used (the metric's, see read_positions). If
        the last block's input changed on that window only, it runs there (for the window's new
        keys and values) and at each read position after it, not at every position.
    Returns the residual stream leaving block stop - 1 (default: the last block) at the positions
    computed, [chunk, batch, n, d_model], and those n positions.
    """
    B, T = base.logits.shape[:2]
    C = rows.stop - rows.start
    end = model.cfg.n_layers if stop is None else stop
    first = [start]  # the first position the running block computes (a read position in the runs below)
    hooks = [(s.hook, lambda act, hook, s=s: s.apply(act, rows, first[0])) for s in sites] + list(extra_hooks)
    x = base.resid[layer][:, start:T if width is None else start + width].repeat(C, 1, 1)
    positions = list(range(start, start + x.shape[1]))
    with model.hooks(fwd_hooks=hooks):
        for l in range(layer, end):
            kv = LayerKV()
            if start:
                kv.append(base.keys[l][:, :start].repeat(C, 1, 1, 1), base.values[l][:, :start].repeat(C, 1, 1, 1))
            done = start + x.shape[1]
            if (l > layer and done < T and l == end - 1 and reads is not None and stop is None
                    and not _patches_keys_beyond(sites, l, rows, done)):
                outputs = [model.blocks[l](x, kv)]
                for r in (p for p in reads if p >= done):  # unchanged keys and values up to r, then r itself
                    gap = slice(kv.length, r)
                    kv.append(base.keys[l][:, gap].repeat(C, 1, 1, 1), base.values[l][:, gap].repeat(C, 1, 1, 1))
                    first[0] = r  # the block's hooks now see position r alone
                    outputs.append(model.blocks[l](base.resid[l][:, r:r + 1].repeat(C, 1, 1), kv))
                    positions.append(r)
                x = torch.cat(outputs, dim=1)
                break
            if l > layer and done < T:  # beyond the window the previous block's output is the base run's
                x = torch.cat([x, base.resid[l][:, done:].repeat(C, 1, 1)], dim=1)
                positions = list(range(start, T))
            x = model.blocks[l](x, kv)
    return x.view(C, B, *x.shape[1:]), positions


# The hooks of a block that its keys and values are computed from (after "blocks.{l}.").
_KEY_INPUTS = ("hook_resid_pre", "ln1.", "attn.hook_k", "attn.hook_v", "attn.hook_rot_k", "attn.k_norm.")


def _patches_keys_beyond(sites: Sequence[Site], layer: int, rows: slice, done: int) -> bool:
    """Whether a site changes block `layer`'s keys or values at a position >= done (all positions, when it
    does not address positions): patched_run's read-position shortcut takes those from the base run."""
    prefix = f"blocks.{layer}."
    for s in sites:
        if not (s.hook.startswith(prefix) and s.hook[len(prefix):].startswith(_KEY_INPUTS)):
            continue
        if s.pos_dim is None or s.pos_dim not in s.dims:
            return True
        if bool((s.index[rows][:, s.dims.index(s.pos_dim)] >= done).any()):
            return True
    return False


def patched_logits(model: Transformer, base: BaseRun, resid: torch.Tensor, positions: Sequence[int],
                   reads: Sequence[int] | None = None, buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [chunk, batch, pos, d_vocab] of a chunk, for the metric.

    resid [chunk, batch, n, d_model]: the final residual stream at `positions` (from patched_run);
    every other position is the base run's. reads: the only positions the metric reads
    (read_positions); then only those are filled, in `buffer` [>= chunk, batch, pos, d_vocab],
    which must hold NaN elsewhere (so a metric reading more than it declares gives NaN), and a view
    of it is returned.
    """
    C = resid.shape[0]
    base_logits = base.logits[None].expand(C, -1, -1, -1)
    if reads is None:  # positions are then one run, start .. done - 1
        start, done = positions[0], positions[-1] + 1
        logits = model.readout(resid)
        return torch.cat([base_logits[:, :, :start], logits, base_logits[:, :, done:]], dim=2)
    assert buffer is not None  # given with reads (read_positions), as the docstring says
    out = buffer[:C]
    where = {p: i for i, p in enumerate(positions)}
    inside = [p for p in reads if p in where]
    outside = [p for p in reads if p not in where]
    if inside:
        out[:, :, inside] = model.readout(resid[:, :, [where[p] for p in inside]]).to(out.dtype)
    if outside:
        out[:, :, outside] = base_logits[:, :, outside]
    return out


def logits_buffer(base: BaseRun, chunk: int, reads: Sequence[int] | None) -> torch.Tensor | None:
    """The NaN-filled buffer patched_logits needs when the metric declares its positions, else None."""
    return None if reads is None else torch.full((chunk, *base.logits.shape), float("nan"),
                                                 dtype=base.logits.dtype, device=base.logits.device)


def position_chunks(positions: torch.Tensor | None, n: int, per_chunk: int, span: int) -> list[tuple[int, int, int]]:
    """(first, end, start position) of each chunk of patches, which are sorted by position.

    A chunk holds patches within `span` positions of its first one and runs from that position.
    """
    if positions is None:
        return [(lo, min(n, lo + per_chunk), 0) for lo in range(0, n, per_chunk)]
    out, lo = [], 0
    while lo < n:
        first = int(positions[lo])
        hi = lo + 1
        while hi < n and hi - lo < per_chunk and int(positions[hi]) < first + span:
            hi += 1
        out.append((lo, hi, first))
        lo = hi
    return out


@torch.no_grad()
def sweep(model: Transformer, base: BaseRun, layer: int, sites: Sequence[Site], metric: Metric,
          batch_size: int | None = None, progress: bool = True, desc: str = "patching",
          positions: torch.Tensor | None = None, local: bool = False) -> torch.Tensor:
    """The metric after each of n_patch patches; patch n applies every site's n-th index at once.

    layer: the earliest layer any site touches. batch_size: patches per forward pass (default:
    chunk_size()). positions [n_patch]: the (query) position each patch touches, if it has one;
    patches are then grouped by position and run from there. local: the patches change block
    `layer`'s output at their own position only (see patched_run's `width`). Returns [n_patch].
    """
    B, T = base.logits.shape[:2]
    n = len(sites[0].index)
    eager = any(s.hook.endswith(("hook_pattern", "hook_attn_scores")) for s in sites)
    per_chunk = batch_size or chunk_size(model, B, T, eager)
    # Chunks spanning T/8 positions recompute about 1/8 more than one-position chunks, in 8x fewer passes.
    span = max(1, T // 8)
    order = torch.arange(n) if positions is None else positions.argsort(stable=True)
    if positions is not None:  # sort the patches by position, and the results back at the end
        sites = [s.reordered(order) for s in sites]
        positions = positions[order]
    chunks = position_chunks(positions, n, per_chunk, span)
    reads = read_positions(metric, T)
    buffer = logits_buffer(base, max(hi - lo for lo, hi, _ in chunks), reads)
    out = torch.empty(n, dtype=torch.float64)  # metric values are Python floats; keep their precision
    with tqdm(total=n, desc=desc, unit="patch", delay=2.0, disable=not progress) as bar:
        for lo, hi, start in chunks:
            width = span if local and positions is not None else None
            resid, computed = patched_run(model, base, layer, sites, slice(lo, hi), start, width, reads)
            logits = patched_logits(model, base, resid, computed, reads, buffer)
            out[lo:hi] = torch.tensor([metric_value(metric, chunk) for chunk in logits], dtype=torch.float64)
            bar.update(hi - lo)
    return out[order.argsort()]


def grid_index(sizes: Sequence[int]) -> torch.Tensor:
    """Every combination of indices, last axis fastest: [prod(sizes), len(sizes)]."""
    return torch.tensor(list(itertools.product(*(range(s) for s in sizes))), dtype=torch.long).view(-1, len(sizes))
