"""What the stand-alone demos (`circuitlab sae demo`, `circuitlab graph demo`) share around their stages: a
fresh out folder (an earlier demo kept renamed), the wall time of each stage, the machine's matmul speed
measured before and after, and the total scaled to the 150 GFLOP/s reference machine — the budget.

    out = fresh_out(opts.out, is_output, "graphs demo")
    clock = StageClock()            # measures GFLOP/s, starts the clock
    ...; clock.lap("model")         # seconds since the previous lap
    wall, gflops, scaled = clock.finish()   # {"model": ..., "total": ...}, GFLOP/s, scaled seconds
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from circuitlab.atomic import set_aside
from circuitlab.training.outputs import check_writable


def fresh_out(out: Path, is_output: Callable[[Path], bool], what: str) -> Path:
    """An empty out folder: an earlier `what` there (is_output says so) is kept renamed; other files are refused."""
    out = Path(out)
    check_writable(out, f"the {what}")
    kept = set_aside(out, is_output, what)
    if kept is not None:
        print(f"moved the previous {what} to {kept}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def work_gflops() -> float:
    """fp32 matmul GFLOP/s at the thread count the demos' training gets right now (perf.threads_for of a large
    step: both cores when free, one when another process holds the other), so that a run the machine's load
    cut to one thread is scaled by one thread's speed, not two."""
    from circuitlab.perf import matmul_gflops, threads_for

    return matmul_gflops(threads=threads_for(math.inf))


class StageClock:
    """Wall time by stage, with the machine's fp32 matmul GFLOP/s (work_gflops) measured before the first stage
    and after the last (their mean: the speed the machine gave around the run, load included)."""

    def __init__(self) -> None:
        self.gflops_before = work_gflops()
        self.start = self.last = time.time()
        self.laps: dict[str, float] = {}

    def lap(self, stage: str) -> float:
        """Seconds since the previous lap (or the start), recorded under `stage`."""
        now = time.time()
        seconds, self.last = now - self.last, now
        self.laps[stage] = round(seconds, 1)
        return seconds

    def finish(self) -> tuple[dict[str, float], float, float]:
        """({stage: seconds, ..., "total": seconds}, GFLOP/s, total seconds scaled to the reference machine)."""
        from circuitlab.perf import scaled_seconds

        wall = time.time() - self.start
        gflops = (self.gflops_before + work_gflops()) / 2
        return {**self.laps, "total": round(wall, 1)}, gflops, scaled_seconds(wall, gflops)


def budget_sentence(result: Any) -> str:
    """The summary's last line, from a demo result's wall_seconds, gflops and scaled_seconds."""
    return (f"The whole demo took {result.wall_seconds['total']:.0f} s here at {result.gflops:.0f} GFLOP/s, "
            f"{result.scaled_seconds:.0f} s scaled to a 150 GFLOP/s machine.")


def budget_dict(result: Any) -> dict[str, Any]:
    """The budget's entries of a demo's results.json."""
    return {"wall_seconds": result.wall_seconds, "gflops": round(result.gflops, 1),
            "scaled_seconds": round(result.scaled_seconds, 1)}
