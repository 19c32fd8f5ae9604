"""circuitlab train: train a model from a YAML run config."""
from __future__ import annotations

import argparse
import os

HELP = "train a model from a run config (configs/*.yaml), with checkpoints and tracked metrics"
EXAMPLE = "circuitlab train --config demo --set train.steps=300 --out runs/mine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a YAML run config, or the name of one in configs/")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. train.lr=3e-4 or model.n_layers=1 (repeatable); "
                        "train.log=tensorboard (or wandb, or tensorboard,wandb) also logs there besides metrics.jsonl")
    p.add_argument("--out", help="run directory (default runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from circuitlab.analysis.heads.induction import training_probes
    from circuitlab.training import RunConfig, train
    from circuitlab.training.configs import resolve_config

    cfg = RunConfig.load(resolve_config(args.config), args.overrides)
    out = args.out or f"runs/{cfg.name}"
    # tracked every train.track_every steps: induction / previous-token scores, induction by period, ICL score
    result = train(cfg, out, resume=args.resume, progress=not args.no_progress, track=training_probes())
    print(f"trained {result.steps} step{'' if result.steps == 1 else 's'} ({result.tokens_seen:,} tokens) in {result.seconds:.0f}s: "
          f"loss {result.final_loss:.3f}, best val loss {result.best_val_loss:.3f} -> {out}")
    if os.environ.get("RANK", "0") == "0":  # one report per run, also under torchrun
        from circuitlab.report import report_for_run

        print(f"report: {report_for_run(out, model=result.model, tokenizer=result.tokenizer)}")
    return 0
