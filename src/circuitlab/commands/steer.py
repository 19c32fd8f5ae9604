"""circuitlab steer: a direction from two prompt sets, added to the residual stream, measured
(the pipeline: experiments/steer.py)."""
from __future__ import annotations

import argparse

HELP = "steer a model with the difference of two prompt sets' mean activations; measure effect and cost"
EXAMPLE = ("circuitlab steer --checkpoint runs/demo/2l --positive dragon.txt --negative cat.txt --layer 1 "
           "--coef 0 2 4 8 --count dragon --out runs/steer   (--estimate: what it will hold and take, then stop)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_memory_arguments
    from circuitlab.experiments.steer import SteerOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, SteerOptions)   # every flag but --memory / --estimate, declared in experiments/steer.py
    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from circuitlab.experiments.steer import SteerOptions, estimate_steer, run_steer

    opts = SteerOptions.from_args(args)   # --temperature and --coef's count in the command's spellings first
    if args.estimate:   # the model and the prompts read; nothing generated or written
        print(estimate_steer(opts).line())
        return 0
    result = run_steer(opts)
    print("\n".join(result.summary()))
    if result.kept:
        print(f"kept the earlier steer output as {result.kept}")
    if result.out is not None:
        out = result.out
        print(f"wrote {out / 'steering.json'}, {out / 'steering.png'} and {out / 'report.html'}")
    return 0
