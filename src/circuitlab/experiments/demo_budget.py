"""What the stand-alone demos (`circuitlab demo`, `circuitlab sae demo`, `circuitlab graph demo`) share around their
stages: a fresh out folder (an earlier demo kept renamed) or, with --resume, the earlier one checked and continued
(a model stage's finished run reused, an interrupted one resumed), the wall time of each stage, the machine's
matmul speed measured before and after, and the total scaled to the 150 GFLOP/s reference machine — the budget.

    out = fresh_out(opts.out, is_output, "graphs demo")
    clock = StageClock()            # measures GFLOP/s, starts the clock
    ...; clock.lap("model")         # seconds since the previous lap
    wall, gflops, scaled = clock.finish()   # {"model": ..., "total": ...}, GFLOP/s, scaled seconds
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitlab.atomic import set_aside
from circuitlab.errors import InputError
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


def resume_out(out: Path, is_output: Callable[[Path], bool], what: str) -> Path:
    """The out folder of a --resume: it must hold a `what` (is_output says so)."""
    out = Path(out)
    if not out.is_dir() or not is_output(out):
        raise InputError(f"--resume: {out} holds no {what} to continue; drop --resume")
    return out


def check_model_plan(folder: Path, steps: int, flag: str, out: Path) -> None:
    """Before any training of a --resume: the model run in `folder`, if it has a checkpoint, was started for
    `steps` steps (its checkpoint's run config); else a one-line refusal naming `flag` — training it on or reusing
    it under another step count would leave results that no command describes."""
    from circuitlab.errors import CircuitlabError
    from circuitlab.training.checkpoint import read_checkpoint_meta

    if not (Path(folder) / "checkpoint").is_dir():
        return
    try:
        planned = int(read_checkpoint_meta(Path(folder) / "checkpoint")["run"]["train"]["steps"])
    except (CircuitlabError, KeyError, TypeError, ValueError):
        return   # no plan recorded: train() checks what it can
    if planned != steps:
        raise InputError(f"cannot resume {out} with other settings: {flag} ({planned} -> {steps}) for its model in "
                         f"{folder}; resume with {flag} {planned}, or drop --resume to start a new demo")


@dataclass
class FinishedRun:
    """A model run finished earlier, with what train() returns (read from its checkpoint and metrics.jsonl)."""

    out_dir: Path
    model: Any
    tokenizer: Any
    state: dict[str, Any]

    @property
    def steps(self) -> int:
        return int(self.state["step"])

    @property
    def tokens_seen(self) -> int:
        return int(self.state["tokens_seen"])

    @property
    def best_val_loss(self) -> float:
        return float(self.state["best_val_loss"])

    def _last(self, key: str) -> float:
        from circuitlab.training import read_metrics

        return next((float(r[key]) for r in reversed(read_metrics(self.out_dir)) if key in r), float("nan"))

    @property
    def final_loss(self) -> float:
        return self._last("loss")

    @property
    def seconds(self) -> float:
        return self._last("elapsed")


def train_or_reuse(cfg, folder: Path, resume: bool, progress: bool, what: str, track: Sequence = ()):
    """A demo's model stage: train cfg into folder, saying "training {what} for N steps"; with resume, a finished
    run there is reused as it is (said) and an interrupted one continues from its checkpoint. Returns train()'s
    TrainResult or a FinishedRun."""
    from circuitlab.training import load_checkpoint, train
    from circuitlab.training.checkpoint import read_trainer_state

    folder = Path(folder)
    saved = resume and (folder / "checkpoint").is_dir()
    if saved:
        state = read_trainer_state(folder / "checkpoint") or {}
        if state.get("step", 0) >= cfg.train.steps:
            print(f"the model in {folder} already finished {cfg.train.steps} steps; reusing it")
            model, tokenizer, _ = load_checkpoint(folder / "checkpoint")
            return FinishedRun(folder, model, tokenizer, state)
    print(f"training {what} for {cfg.train.steps} steps" + (" (resuming)" if saved else ""))
    return train(cfg, folder, resume=saved, progress=progress, track=track)


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
