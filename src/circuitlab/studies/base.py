"""What every study declares and returns: its record (Study), its findings (StudyResult) and the claims it tests
(Claim: the paper's claim, the verdict in words and whether it holds, each from the numbers it states).

A study reproduces one published finding on a checkpoint with the registered methods and the analysis functions
(circuitlab.methods, circuitlab.analysis); it writes results.json and report.md into its own folder and one
section of the run's report.html (studies/runner.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import circuitlab.memory as memory
from circuitlab.spec import Options

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.viz.figure import FigureSpec


@dataclass
class Claim:
    """One claim of the paper as tested here: `claim` the paper's sentence, `verdict` what the numbers say (one
    sentence stating them), `holds` True / False, or None when the numbers cannot decide it."""

    claim: str
    verdict: str
    holds: bool | None

    def mark(self) -> str:
        return {True: "holds", False: "does not hold", None: "undecided"}[self.holds]

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "verdict": self.verdict, "holds": self.holds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Claim":
        return cls(d["claim"], d["verdict"], d["holds"])


@dataclass
class StudyResult:
    """A study's findings: numbers (everything measured, JSON), claims (each with its verdict), figures (name ->
    PNG file in the study's folder), what was run on (setup: prompts, sizes, seeds) and the wall time."""

    study: str
    setup: dict[str, Any]
    numbers: dict[str, Any]
    claims: list[Claim]
    figures: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "setup": self.setup, "claims": [c.to_dict() for c in self.claims],
                "numbers": self.numbers, "figures": dict(self.figures), "seconds": dict(self.seconds)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StudyResult":
        return cls(d["study"], d["setup"], d["numbers"], [Claim.from_dict(c) for c in d["claims"]],
                   dict(d.get("figures", {})), dict(d.get("seconds", {})))


@dataclass(frozen=True)
class Study:
    """One study in the registry (circuitlab.studies.STUDIES).

    name: `circuitlab study NAME` and its folder; title, paper: the report's heading and citation; options: its
    Options class (sizes of the prompt sets, seeds); run(model, tokenizer, options, progress) -> StudyResult;
    markdown(result) -> report.md lines after the claims; figures(result) -> {name: FigureSpec} (the PNGs and
    the HTML section draw the same specs, from results.json alone); estimate(model, options) -> memory.Estimate.
    """

    name: str
    title: str
    paper: str
    options: type[Options]
    run: Callable[..., StudyResult]
    markdown: Callable[[StudyResult], list[str]]
    figures: Callable[[StudyResult], dict[str, "FigureSpec"]]
    estimate: Callable[["Transformer", Any], memory.Estimate]


def forward_flops(model: "Transformer", tokens: int) -> float:
    """The arithmetic of a forward pass over `tokens` tokens (the blocks and the unembedding)."""
    from circuitlab.perf import transformer_step_flops

    return transformer_step_flops(model.cfg, tokens, 1, backward=False)


def claims_markdown(claims: list[Claim]) -> list[str]:
    """The claims as a Markdown table: claim, verdict, whether it holds."""
    lines = ["| claim | what the numbers say | verdict |", "|---|---|---|"]
    lines += [f"| {c.claim} | {c.verdict} | **{c.mark()}** |" for c in claims]
    return lines
