"""circuitlab demo: train 2-layer and 1-layer attention-only models and find the induction heads."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = "train a 2-layer (and a 1-layer) attention-only model and find its induction heads (~1.5 min on 2 CPU cores; prints the time scaled to 150 GFLOP/s)"
EXAMPLE = "circuitlab demo --out runs/demo   (continue an interrupted one: add --resume)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.demo import DemoOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, DemoOptions)   # every flag, declared once in experiments/demo.py


def run(args: argparse.Namespace) -> int:
    from circuitlab.experiments.demo import DemoOptions, run_induction_demo
    from circuitlab.perf import REFERENCE_GFLOPS

    opts = DemoOptions.from_args(args)
    out = Path(opts.out)
    result = run_induction_demo(opts)
    print()
    print((out / "report.md").read_text())
    wall = result.wall_seconds
    scaled = next(v for k, v in wall.items() if k.startswith("total_at_"))
    print(f"wrote {out}/: report.html, report.md, results.json, figures, checkpoints (2l/, 1l/)")
    print(f"wall time {wall['total']:.1f} s at {wall['gflops']:.0f} GFLOP/s (fp32 matmul, measured before and after); "
          f"{scaled:.1f} s scaled to a {REFERENCE_GFLOPS:.0f} GFLOP/s machine")
    return 0
