"""The capped graph's visited rows, in memory or in a file, and the greedy choice's influence over them.

    store = RowStore(cap, n_cols, torch.float32, offload=True)   # a file in plan.offload_folder(), deleted at once
    store.write(start, rows)                                    # rows [n, n_cols] at rows start..start+n
    for i, chunk in store.chunks(stop, size): ...               # rows [0, stop) a chunk at a time
    store.take(index)                                           # rows [len(index), n_cols]
    partial_influence(store, V, order, n_feat, logit_rows, weights)   # [n_feat]

The file is written and read with pwrite / preadv, never memory-mapped: its pages are the kernel's page cache,
not this process's resident memory (a mapped file's touched pages count as resident until the kernel needs
them), so a long prompt's rows (24 GB at 1,024 tokens on GPT-2 small) cost the process one chunk at a time.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import torch

from circuitlab.graphs.attribution_graph import normalized
from circuitlab.graphs.plan import offload_folder, row_chunk


def _bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, shared (no copy): any dtype, bfloat16 included."""
    return memoryview(t.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


class RowStore:
    """Rows [n, m] of one dtype, in memory (offload=False) or in an unlinked file (offload=True)."""

    def __init__(self, n: int, m: int, dtype: torch.dtype, offload: bool = False) -> None:
        self.n, self.m, self.dtype, self.offload = n, m, dtype, offload
        self.row_bytes = m * dtype.itemsize
        self.fd = -1                              # offloaded: the file's descriptor
        self.rows: torch.Tensor | None = None
        if offload:
            fd, path = tempfile.mkstemp(prefix="circuitlab-rows-", suffix=".bin", dir=offload_folder())
            os.unlink(path)       # the descriptor keeps the file until close(): nothing left behind on a crash
            self.fd = fd
            os.ftruncate(fd, max(1, n * self.row_bytes))
        else:
            self.rows = torch.zeros(n, m, dtype=dtype)

    def write(self, start: int, rows: torch.Tensor) -> None:
        """rows [k, m] into rows start..start+k."""
        if self.rows is not None:
            self.rows[start:start + len(rows)] = rows
            return
        view, offset = _bytes(rows.to("cpu", self.dtype).contiguous()), start * self.row_bytes   # from any device
        while len(view):
            done = os.pwrite(self.fd, view, offset)
            view, offset = view[done:], offset + done

    def _read(self, start: int, stop: int) -> torch.Tensor:
        out = torch.empty(stop - start, self.m, dtype=self.dtype)
        view, offset = _bytes(out), start * self.row_bytes
        while len(view):
            done = os.preadv(self.fd, [view], offset)
            if done <= 0:
                raise OSError(f"the offloaded rows' file ended early at byte {offset}")
            view, offset = view[done:], offset + done
        return out

    def chunks(self, stop: int, size: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, rows [<= size, m]) over rows [0, stop): views in memory, read from the file otherwise."""
        for i in range(0, stop, size):
            j = min(i + size, stop)
            yield i, self.rows[i:j] if self.rows is not None else self._read(i, j)

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """Rows at index [k] -> [k, m]."""
        if self.rows is not None:
            return self.rows[index]
        return torch.cat([self._read(i, i + 1) for i in index.tolist()]) if len(index) \
            else torch.zeros(0, self.m, dtype=self.dtype)

    def close(self) -> None:
        self.rows = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "RowStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@torch.no_grad()
def partial_influence(store: RowStore, V: int, order: torch.Tensor, n_feat: int, logit_rows: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """Each feature's influence on the weighted logits [n_feat] through the rows computed so far (the logit
    rows [n_logit, n_cols] and the first V rows of the store, row j that of feature order[j]):
    w (Â + Â² + ...) without building the square matrix (a feature not yet visited has no row: nothing passes
    through it yet).

    Influence reaches an unvisited feature only through a visited row, so the walk runs on the visited
    features' own columns ([V, V], in the rows' dtype); one product with all the rows at the end (a chunk of rows made
    absolute at a time) carries it to every feature: memory is V² plus a chunk, never a copy of the rows."""
    a_logit = normalized(logit_rows)[:, :n_feat]
    start = weights.to(a_logit.dtype) @ a_logit                           # [n_feat]: straight into the logits
    if not V:
        return start
    size, order = row_chunk(store.m), order[:V]
    a_vv = torch.empty(V, V, dtype=start.dtype)                         # visited -> visited (start's: the rows')
    inv_parts = []
    for i, rows in store.chunks(V, size):
        inv_parts.append(1 / rows.abs().sum(1).clamp(min=1e-10))
        a_vv[i:i + len(rows)] = rows[:, order].abs()
    inv = torch.cat(inv_parts).to(start.dtype)
    u, through = start[order], torch.zeros(V, dtype=start.dtype)
    for _ in range(V + 1):  # edges run from earlier layers to later ones: reaches zero
        if not bool(u.any()):
            break
        through += u
        u = (u * inv) @ a_vv
    else:
        raise RuntimeError("influence did not converge (the rows have a cycle)")
    del a_vv
    factor = through * inv                                               # [V]
    total = start.clone()
    for i, rows in store.chunks(V, size):
        total += factor[i:i + len(rows)] @ rows[:, :n_feat].abs().to(start.dtype)
    return total
