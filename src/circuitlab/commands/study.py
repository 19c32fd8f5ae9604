"""circuitlab study: reproduce a published finding on a checkpoint (induction heads, indirect-object identification,
factual recall's causal trace, the logit and tuned lenses)."""
from __future__ import annotations

import argparse

HELP = ("reproduce the field's findings on a checkpoint: induction heads (Olsson et al. 2022), indirect-object "
        "identification (Wang et al. 2022), causal tracing of facts (Meng et al. 2022), the logit and tuned lenses "
        "(nostalgebraist 2020, Belrose et al. 2023); each claim with its verdict, in results.json, report.md, "
        "report.html")
EXAMPLE = ("circuitlab study induction --checkpoint runs/demo/2l --out runs/studies   (every study on a real model: "
           "study all --checkpoint models/smollm2; --estimate first)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_memory_arguments
    from circuitlab.spec import add_arguments as add_options
    from circuitlab.studies import STUDIES
    from circuitlab.studies.runner import StudyRunOptions

    add_options(p, StudyRunOptions)
    for study in STUDIES.values():   # each study's options, as its options class declares them
        add_options(p, study.options)
    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from circuitlab.studies import STUDIES
    from circuitlab.studies.runner import StudyRunOptions, estimates, run_studies, study_out

    opts = StudyRunOptions.from_args(args)
    chosen = {name: s.options.from_args(args) for name, s in STUDIES.items() if name in opts.names()}
    if args.estimate:
        from circuitlab.training import load_checkpoint

        model, _, _ = load_checkpoint(str(opts.checkpoint))
        for line in estimates(model, opts, chosen):
            print(line)
        return 0
    results = run_studies(opts, chosen)
    out = study_out(opts)
    for name, result in results.items():
        print(f"\n{STUDIES[name].title}:")
        for claim in result.claims:
            print(f"  [{claim.mark()}] {claim.claim} {claim.verdict}")
    print(f"\nwrote {out}/report.html, {out}/report.md and, for each study, {out}/<study>/results.json, report.md")
    return 0
