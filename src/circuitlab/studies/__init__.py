"""The field's findings reproduced on a checkpoint, one study per paper, in one command:

    circuitlab study induction --checkpoint models/smollm2      # or ioi, facts, lens, or all
    from circuitlab.studies import STUDIES, StudyRunOptions, run_studies
    results = run_studies(StudyRunOptions("all", "models/smollm2"))
    results["induction"].claims          # each claim of the paper with its verdict, from the numbers

Each study (a module here: its options, run, claims, report lines, figures, estimate; base.py says what it
declares) is built from the analysis functions the registered methods stand on (circuitlab.analysis: head
detectors, direct logit attribution, ablation, activation and path patching, causal tracing, the lenses), not a
pipeline beside them. This
floor sits beside the experiments, above the methods and the report.
"""
from __future__ import annotations

from circuitlab.studies.base import Claim, Study, StudyResult
from circuitlab.studies.registry import STUDIES
from circuitlab.studies.runner import StudyRunOptions, run_studies

__all__ = ["STUDIES", "Claim", "Study", "StudyResult", "StudyRunOptions", "run_studies"]
