"""circuitlab demo: train 2-layer and 1-layer attention-only models and find the induction heads."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = "train a 2-layer (and a 1-layer) attention-only model and find its induction heads (~1.5 min on 2 CPU cores; prints the time scaled to 150 GFLOP/s)"
EXAMPLE = "circuitlab demo --out runs/demo   (continue an interrupted one: add --resume)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import positive_int

    p.add_argument("--out", default="runs/demo", help="output directory (an existing one is kept, renamed)")
    p.add_argument("--steps", type=positive_int, default=None, help="training steps of the 2-layer model (default: configs/demo.yaml)")
    p.add_argument("--steps-1l", type=positive_int, default=300, help="training steps of the 1-layer model")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted demo in --out: finished models are reused, the rest resumes")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from circuitlab.experiments.demo import DemoOptions, run_induction_demo
    from circuitlab.perf import REFERENCE_GFLOPS

    out = Path(args.out)
    result = run_induction_demo(DemoOptions(out=out, steps_2l=args.steps, steps_1l=args.steps_1l,
                                            progress=not args.no_progress, resume=args.resume))
    print()
    print((out / "report.md").read_text())
    wall = result.wall_seconds
    scaled = next(v for k, v in wall.items() if k.startswith("total_at_"))
    print(f"wrote {out}/: report.html, report.md, results.json, figures, checkpoints (2l/, 1l/)")
    print(f"wall time {wall['total']:.1f} s at {wall['gflops']:.0f} GFLOP/s (fp32 matmul, measured before and after); "
          f"{scaled:.1f} s scaled to a {REFERENCE_GFLOPS:.0f} GFLOP/s machine")
    return 0
