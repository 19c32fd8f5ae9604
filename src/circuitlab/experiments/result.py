"""What a ready-made experiment returns: readable findings, the figures it wrote and the numbers behind
them. results.json holds to_dict(); report/ renders that form, so a report rebuilt from disk and one
written at the end of a run are the same."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ExperimentResult:
    """One experiment's findings.

    name: the experiment ("circuits", "patching", ...); summary: one sentence per finding, every number
    from data; figures: PNG file names in the experiment's output folder; data: JSON-able numbers (the
    analyses' own to_dict() forms, keyed as report/ reads them).
    """

    name: str
    summary: list[str]
    figures: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.data, "summary": list(self.summary), "figures": list(self.figures)}

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.summary)
        return f"<b>{html.escape(self.name)}</b><ul>{items}</ul>"
