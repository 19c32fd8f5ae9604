"""What the benchmarks share: timing functions in turn (round robin, median) and a process's peak RSS.

    from _timing import peak_rss_kib, round_robin     # benchmarks/ is on sys.path when a benchmark runs
"""
from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


def round_robin(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in turn after one warm-up call each, so that load on
    the machine hits every side alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB. /proc's VmHWM starts afresh at exec; ru_maxrss does not on Linux
    (it keeps the forking parent's RSS), which would hide the child's own peak under the parent's."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
