"""The studies, by name, in the order `study all` runs them (and report.html shows them)."""
from __future__ import annotations

from circuitlab.studies.base import Study
from circuitlab.studies.facts import STUDY as FACTS
from circuitlab.studies.induction import STUDY as INDUCTION
from circuitlab.studies.ioi import STUDY as IOI
from circuitlab.studies.lens import STUDY as LENS

STUDIES: dict[str, Study] = {s.name: s for s in (INDUCTION, IOI, FACTS, LENS)}
