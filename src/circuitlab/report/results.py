"""The typed forms report/ reads a results file through: each JSON object is parsed once, here, by from_dict,
and the sections read attributes (tests/test_report_keys.py keeps string-keyed reads of results out of report/).

    Findings.from_dict(results["logit_lens"]).summary     any method's entry, read loosely (an older or partial
                                                           results.json; interpret's report.md loop)
    InterpretResults.from_dict(results)                   `circuitlab interpret`'s results.json
    SteeringFindings.from_dict(json.load(steering.json))  a `circuitlab steer` sweep as steering.json holds it
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from circuitlab.spec import Result


@dataclass
class Findings(Result):
    """What every method's results.json entry may hold (unknown keys ignored, absent ones empty): summary (one
    sentence per finding, or one string), figures (file names, or {"file": name}), tables (title -> Markdown
    lines)."""

    summary: list[str] | str = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    tables: dict[str, list[str]] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Findings":
        found = super().from_dict(d)
        found.figures = [f if isinstance(f, str) else f.get("file", "") for f in found.figures]
        return found

    @classmethod
    def of(cls, found: Any) -> "Findings":
        """The entry read back; anything but a JSON object reads as empty findings."""
        return cls.from_dict(dict(found)) if isinstance(found, Mapping) else cls()


@dataclass
class InterpretResults(Result):
    """`circuitlab interpret`'s results.json: the checkpoint, the experiments run (in order), each one's entry
    (name -> its to_dict(), read back by its method), the model's config and the methods skipped (name -> why)."""

    checkpoint: str = ""
    experiments: list[str] = field(default_factory=list)
    entries: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    skipped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InterpretResults":
        found = super().from_dict(d)
        found.checkpoint, found.skipped = str(found.checkpoint), dict(found.skipped or {})
        found.entries = {k: d[k] for k in found.experiments if k in d}
        return found

    @classmethod
    def of(cls, results: "InterpretResults | Mapping[str, Any]") -> "InterpretResults":
        return results if isinstance(results, InterpretResults) else cls.from_dict(dict(results))


@dataclass
class SteeringVectorInfo(Result):
    """SteeringVector.to_dict(): where the direction is added, how it was made, its norm, its prompt counts."""

    hook_name: str | None = None
    source: str | None = None
    norm: float | None = None
    n_positive: int | None = None
    n_negative: int | None = None


@dataclass
class SteeringFindings(Result):
    """A coefficient sweep in its JSON form (SteerResult.to_dict(), steering.json): per-coefficient lists
    [coef] as written (rounded), the direction's facts, and the generations ({str(coef): [text, ...]})."""

    coefs: list[float]
    preference: list[float]
    neutral_loss: list[float]
    neutral_cost: list[float]
    vector: SteeringVectorInfo = field(default_factory=SteeringVectorInfo)
    metric: list[float] | None = None
    metric_name: str | None = None
    prompt: str = ""
    generations: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SteeringFindings":
        found = super().from_dict(d)
        found.vector = SteeringVectorInfo.from_dict(dict(d.get("vector") or {}))
        return found

    @classmethod
    def of(cls, found: "SteeringFindings | Mapping[str, Any]") -> "SteeringFindings":
        return found if isinstance(found, SteeringFindings) else cls.from_dict(dict(found))
