"""The induction phase change, read from tracked metrics (metrics.jsonl records whose "induction" and
"prev_token" hold a [layer][head] score grid): one home for the demo, report.html and the figures."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from circuitlab.spec import Result


def best_head_score(per_layer: Sequence[Sequence[float | None]] | None) -> float:
    """The largest score of a [layer][head] grid (0.0 when empty; None entries skipped)."""
    return max((s for layer in per_layer or [] for s in layer if s is not None), default=0.0)


@dataclass
class PhaseChange(Result):
    """phase_change()'s dict read back (results.json, the report): the step and tokens where the best head's
    induction score passed halfway, that score two tracked points before and at the end, and the repeated-token
    loss and in-context-learning score at the same two points (None when not tracked)."""

    step: int
    tokens: int
    induction_before: float
    induction_after: float
    repeat_loss_before: float | None = None
    repeat_loss_after: float | None = None
    icl_before: float | None = None
    icl_after: float | None = None


def phase_change(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Where the best head's induction score first passes halfway from its start to its end value;
    None without three tracked points or a rise of at least 0.2."""
    tracked = [r for r in records if "induction" in r]
    if len(tracked) < 3:
        return None
    scores = [best_head_score(r["induction"]) for r in tracked]
    start, end = scores[0], scores[-1]
    if end - start < 0.2:
        return None
    half = start + (end - start) / 2
    at = next(i for i, s in enumerate(scores) if s >= half)
    before = tracked[max(0, at - 2)]
    return {"step": tracked[at]["step"], "tokens": tracked[at]["tokens"],
            "induction_before": round(scores[max(0, at - 2)], 3), "induction_after": round(scores[-1], 3),
            "repeat_loss_before": before.get("repeat_loss"), "repeat_loss_after": tracked[-1].get("repeat_loss"),
            "icl_before": before.get("icl"), "icl_after": tracked[-1].get("icl")}


def phase_band(records: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """The best induction score's rise, in tokens: from the last point below 20% of it to the first
    point at 80% or more."""
    tracked = [r for r in records if "induction" in r]
    if len(tracked) < 3:
        return None
    scores = [best_head_score(r["induction"]) for r in tracked]
    lo, hi = scores[0], max(scores)
    if hi - lo <= 0:
        return None
    i20 = next(i for i, s in enumerate(scores) if s >= lo + 0.2 * (hi - lo))
    i80 = next(i for i, s in enumerate(scores) if s >= lo + 0.8 * (hi - lo))
    return tracked[max(0, i20 - 1)]["tokens"], tracked[i80]["tokens"]
