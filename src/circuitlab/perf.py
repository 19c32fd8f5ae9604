"""This machine's speed, so that wall times can be compared across machines.

    gflops = matmul_gflops()                      # fp32 matmul GFLOP/s in this process, now
    scaled_seconds(wall, gflops)                  # what `wall` would be on a 150 GFLOP/s machine

The demo's time budget and `make bench` are stated for a reference machine doing 150 GFLOP/s of fp32
matmul (about two cores of a 2020s laptop or cloud VM). Measure in the same process, right before and
after the timed work, so that other load on the machine shows in both.
"""
from __future__ import annotations

import statistics
import time

import torch

REFERENCE_GFLOPS = 150.0


def matmul_gflops(n: int = 512, seconds: float = 0.5, threads: int | None = None) -> float:
    """fp32 GFLOP/s of [n, n] @ [n, n] matmuls on the CPU with torch's current thread count (or
    `threads`): the median over repeated products (2 n^3 flops each) for about `seconds`, after one
    warm-up. The median, not the best, so that it reflects the speed the machine gives right now."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        out = torch.empty(n, n)
        torch.mm(a, b, out=out)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 5 or time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def scaled_seconds(seconds: float, gflops: float, reference: float = REFERENCE_GFLOPS) -> float:
    """A wall time measured at `gflops` expressed on a machine doing `reference` GFLOP/s (compute-bound
    work scales with the matmul speed)."""
    return seconds * gflops / reference
