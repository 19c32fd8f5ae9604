"""The work of a patching sweep, from the shapes: flops of the staggered sweep (grid.py) and of the naive one
(a full forward per patch), so that estimates and reports can say one as a share of the other.

    grid_flops(cfg, n_pos, *full_grid(n_layers, n_pos)) / (n_layers * n_pos * naive_flops(cfg, n_pos))   # ~1/4
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from circuitlab.perf import block_weights


def block_flops(cfg, n_new: int, start: int = 0) -> float:
    """Flops of one block on positions start .. start + n_new - 1 with the keys of every earlier position
    cached: 2 per weight per position, plus attention's scores and mixing (4 n_heads d_head per query and key)."""
    keys = n_new * start + n_new * (n_new + 1) // 2  # query start + i sees start + i + 1 keys
    return 2.0 * block_weights(cfg) * n_new + 4.0 * keys * cfg.n_heads * cfg.head_dim


def naive_flops(cfg, n_pos: int) -> float:
    """One patch the naive way: a full forward over n_pos positions, unembedded at every position."""
    return cfg.n_layers * block_flops(cfg, n_pos) + 2.0 * cfg.d_model * cfg.d_vocab * n_pos


def patch_flops(cfg, n_pos: int, layer: int, start: int = 0, local: bool = False, reads: int | None = None
                ) -> float:
    """One patch as staggered_run computes it: blocks layer .. n_layers - 1 at positions start .. n_pos - 1
    (the entry block at `start` alone when local), unembedded at `reads` positions (None: the computed ones)."""
    L, n = cfg.n_layers, n_pos - start
    total = sum(block_flops(cfg, 1 if local and l == layer and l < L - 1 else n, start) for l in range(layer, L))
    return total + 2.0 * cfg.d_model * cfg.d_vocab * (n if reads is None else reads)


def grid_flops(cfg, n_pos: int, layers: Sequence[int], positions: Sequence[int] | None = None, local: bool = False,
               reads: int | None = 1) -> float:
    """The flops of grid_sweep over patches entering at `layers` and starting at `positions` (None: 0)."""
    starts = [0] * len(layers) if positions is None else positions
    counts = Counter((int(l), int(t)) for l, t in zip(layers, starts))
    return sum(k * patch_flops(cfg, n_pos, l, t, local, reads) for (l, t), k in counts.items())


def full_grid(n_layers: int, n_pos: int, first: int = 0) -> tuple[list[int], list[int]]:
    """(layers, positions) of every (layer, position) patch with position >= first, layer-major."""
    return [l for l in range(n_layers) for _ in range(first, n_pos)], [t for _ in range(n_layers)
                                                                     for t in range(first, n_pos)]
