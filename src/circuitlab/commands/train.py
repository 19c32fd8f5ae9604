"""circuitlab train: train a model from a YAML run config."""
from __future__ import annotations

import argparse
import os

HELP = "train a model from a run config (configs/*.yaml), with checkpoints and tracked metrics"
EXAMPLE = "circuitlab train --config demo --set train.steps=300 --out runs/mine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.spec import add_arguments as add_options
    from circuitlab.training.trainer import TrainOptions

    add_options(p, TrainOptions)   # every flag declared once beside train() (training/trainer.py)


def run(args: argparse.Namespace) -> int:
    from circuitlab.analysis.heads.induction import training_probes
    from circuitlab.training import train
    from circuitlab.training.trainer import TrainOptions

    opts = TrainOptions.from_args(args)
    cfg = opts.load_config()
    out = opts.out_folder(cfg)
    # tracked every train.track_every steps: induction / previous-token scores, induction by period, ICL score
    result = train(cfg, out, resume=opts.resume, progress=opts.progress, track=training_probes())
    print(f"trained {result.steps} step{'' if result.steps == 1 else 's'} ({result.tokens_seen:,} tokens) in {result.seconds:.0f}s: "
          f"loss {result.final_loss:.3f}, best val loss {result.best_val_loss:.3f} -> {out}")
    if os.environ.get("RANK", "0") == "0":  # one report per run, also under torchrun
        from circuitlab.report import report_for_run

        print(f"report: {report_for_run(out, model=result.model, tokenizer=result.tokenizer)}")
    return 0
