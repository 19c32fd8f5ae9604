"""circuitlab interpret: run analyses on a checkpoint and write figures, results.json and a report."""
from __future__ import annotations

import argparse

HELP = ("analyse a checkpoint: circuits, heads, logit lens, attribution, patching, ablation, probing, input "
        "attribution, tuned lens")
EXAMPLE = ('circuitlab interpret --checkpoint runs/demo/2l --experiments heads logit_lens '
           '--prompt "Once upon a time" --out runs/demo/interpret')


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--experiments", nargs="+", default=None,
                   help="which analyses to run (default: all available); see the list in the error for names")
    p.add_argument("--prompt", default=None, help="text for the logit lens and attribution")
    p.add_argument("--clean", default=None, help="clean prompt for patching")
    p.add_argument("--corrupt", default=None, help="corrupted prompt for patching (same token length as --clean)")
    p.add_argument("--lens", default=None, help="a tuned-lens folder for the tuned_lens experiment (default: "
                                                "<checkpoint>/tuned_lens if saved, else a quick one is trained)")
    p.add_argument("--out", default=None, help="output directory (default: <checkpoint>/interpret)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.interpret import run_interpret

    out = Path(args.out) if args.out else Path(args.checkpoint) / "interpret"
    results = run_interpret(args.checkpoint, out, args.experiments, prompt=args.prompt, clean=args.clean,
                            corrupt=args.corrupt, lens=args.lens)
    print(f"ran {', '.join(results.experiments)} -> {out}/results.json, {out}/report.md, {out}/report.html")
    return 0
