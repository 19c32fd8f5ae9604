"""circuitlab interpret: run analyses on a checkpoint and write figures, results.json and a report."""
from __future__ import annotations

import argparse

from circuitlab.methods import REGISTRY
from circuitlab.spec import add_arguments as add_options, options_of

HELP = ("analyse a checkpoint: circuits, heads, logit lens, attribution, patching, ablation, probing, input "
        "attribution, tuned lens, causal tracing")
EXAMPLE = ('circuitlab interpret --checkpoint runs/demo/2l --experiments heads logit_lens causal_tracing '
           '--prompt "One day, Lily saw a big" --subject Lily --out runs/demo/interpret')


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--experiments", nargs="+", default=None,
                   help="which analyses to run (default: all available); see the list in the error for names")
    p.add_argument("--prompt", default=None, help="text for the logit lens and attribution")
    p.add_argument("--clean", default=None, help="clean prompt for patching")
    p.add_argument("--corrupt", default=None, help="corrupted prompt for patching (same token length as --clean)")
    p.add_argument("--lens", default=None, help="a tuned-lens folder for the tuned_lens experiment (default: "
                                                "<checkpoint>/tuned_lens if saved, else a quick one is trained)")
    for m in REGISTRY.values():   # each registered method's options, as its options class declares them
        add_options(p, m.options)
    p.add_argument("--out", default=None, help="output directory (default: <checkpoint>/interpret)")
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.interpret import run_interpret
    from circuitlab.training.outputs import check_writable

    if args.estimate:
        for line in interpret_estimates(args):
            print(line)
        return 0
    out = Path(args.out) if args.out else Path(args.checkpoint) / "interpret"
    check_writable(out, "the interpret results")   # before the model is read
    results = run_interpret(args.checkpoint, out, args.experiments, prompt=args.prompt, clean=args.clean,
                            corrupt=args.corrupt, lens=args.lens, **method_options(args))
    print(f"ran {', '.join(results.experiments)} -> {out}/results.json, {out}/report.md, {out}/report.html")
    return 0


def method_options(args: argparse.Namespace) -> dict:
    """Every registered method's options as the command line gave them (keyword arguments of run_interpret)."""
    return {f.name: getattr(args, f.name) for m in REGISTRY.values() for f, _ in options_of(m.options)}


def interpret_estimates(args: argparse.Namespace) -> list[str]:
    """What each experiment `interpret` would run holds and takes (every registered method's estimate, on --prompt
    or the default prompt, --clean/--corrupt or the default induction rows), one line each, without running them."""
    from circuitlab.experiments.interpret import experiments_for, no_text
    from circuitlab.perf import matmul_gflops
    from circuitlab.training import load_checkpoint

    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    from circuitlab.analysis.lens.tuned import default_lens_dir

    given = {**method_options(args), "prompt": args.prompt, "clean": args.clean, "corrupt": args.corrupt,
             "lens": args.lens or default_lens_dir(args.checkpoint)}   # as run_interpret reads the lens
    names, _ = experiments_for(model, args.experiments, by_name=args.experiments is not None)
    if tokenizer is None:
        names = [n for n in names if n in no_text()]
    methods = [REGISTRY[n] for n in names]
    if args.experiments is None:   # as the run leaves out what its inputs cannot run (causal tracing without a subject)
        methods = [m for m in methods if not (m.missing and m.missing(m.options_from(given), **m.inputs_from(given)))]
    gflops = matmul_gflops(seconds=0.2)   # measured once: every line at the same speed
    return [m.estimate(model, tokenizer, m.options_from(given), **m.inputs_from(given)).timed(gflops).line()
            for m in methods if m.estimate is not None]
