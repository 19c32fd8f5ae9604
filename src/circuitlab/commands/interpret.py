"""circuitlab interpret: run analyses on a checkpoint and write figures, results.json and a report."""
from __future__ import annotations

import argparse

from circuitlab.methods import REGISTRY
from circuitlab.spec import add_arguments as add_options, only, options_of

HELP = ("analyse a checkpoint: circuits, heads, logit lens, attribution, patching, ablation, probing, input "
        "attribution, tuned lens, causal tracing")
EXAMPLE = ('circuitlab interpret --checkpoint runs/demo/2l --experiments heads logit_lens causal_tracing '
           '--prompt "One day, Lily saw a big" --subject Lily --out runs/demo/interpret')


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.interpret import InterpretInputs

    inputs = [f.name for f, _ in options_of(InterpretInputs)]
    add_options(p, only(InterpretInputs, tuple(n for n in inputs if n not in ("out", "resume")), "InterpretRunInputs"))
    for m in REGISTRY.values():   # each registered method's options, as its options class declares them
        add_options(p, m.options)
    add_options(p, only(InterpretInputs, ("out", "resume"), "InterpretOut"))   # last, where --help has always shown it
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.interpret import InterpretInputs, run_interpret
    from circuitlab.training.outputs import check_writable

    inputs = InterpretInputs.from_args(args)
    assert inputs.checkpoint is not None   # required: check() refuses None
    if args.estimate:
        for line in interpret_estimates(args):
            print(line)
        return 0
    out = Path(inputs.out) if inputs.out else Path(inputs.checkpoint) / "interpret"
    check_writable(out, "the interpret results")   # before the model is read
    experiments = list(inputs.experiments) if inputs.experiments is not None else None
    results = run_interpret(inputs.checkpoint, out, experiments, resume=inputs.resume, **inputs.shared(),
                            **method_options(args))
    print(f"ran {', '.join(results.experiments)} -> {out}/results.json, {out}/report.md, {out}/report.html")
    return 0


def method_options(args: argparse.Namespace) -> dict:
    """Every registered method's options as the command line gave them (keyword arguments of run_interpret)."""
    return {f.name: getattr(args, f.name) for m in REGISTRY.values() for f, _ in options_of(m.options)}


def interpret_estimates(args: argparse.Namespace) -> list[str]:
    """What each experiment `interpret` would run holds and takes (every registered method's estimate, on --prompt
    or the default prompt, --clean/--corrupt or the default induction rows), one line each, without running them."""
    from circuitlab.experiments.interpret import InterpretInputs, experiments_for, no_text
    from circuitlab.perf import matmul_gflops
    from circuitlab.training import load_checkpoint

    inputs = InterpretInputs.from_args(args)
    assert inputs.checkpoint is not None   # required: check() refuses None
    model, tokenizer, _ = load_checkpoint(inputs.checkpoint)
    from circuitlab.analysis.lens.tuned import default_lens_dir

    given = {**method_options(args), **inputs.shared(),
             "lens": inputs.lens or default_lens_dir(inputs.checkpoint)}   # as run_interpret reads the lens
    experiments = list(inputs.experiments) if inputs.experiments is not None else None
    names, _ = experiments_for(model, experiments, by_name=experiments is not None)
    if tokenizer is None:
        names = [n for n in names if n in no_text()]
    methods = [REGISTRY[n] for n in names]
    if experiments is None:   # as the run leaves out what its inputs cannot run (causal tracing without a subject)
        methods = [m for m in methods if not (m.missing and m.missing(m.options_from(given), **m.inputs_from(given)))]
    gflops = matmul_gflops(seconds=0.2)   # measured once: every line at the same speed
    return [m.estimate(model, tokenizer, m.options_from(given), **m.inputs_from(given)).timed(gflops).line()
            for m in methods if m.estimate is not None]
