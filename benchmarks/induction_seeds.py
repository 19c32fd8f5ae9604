#!/usr/bin/env python
"""The demo's 2-layer recipe over seeds: phase-change step and the [r, r] period sweep per seed.

For each seed, trains configs/demo.yaml (with --set overrides) with the demo's tracked metrics,
then prints one JSON line: the phase-change step (where the best induction score first passes
halfway from its start to its end), the worst period's best-head induction score and second-copy
loss over every period 4..n_ctx/2, whether the issue's target (>= 0.6, <= 2.0 nats) is met, and
the training time with this process's fp32 matmul GFLOP/s measured before and after.

    PYTHONPATH=src python benchmarks/induction_seeds.py --seeds 0 1 2 3 4
    PYTHONPATH=src python benchmarks/induction_seeds.py --seeds 0 --set train.steps=600 --set data.segment_len=[4,32]
    PYTHONPATH=src python benchmarks/induction_seeds.py --seeds 0 1 --jobs 2 --threads 1   # seeds in parallel
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor


def one_seed(seed: int, overrides: list[str], threads: int, device: str, config: str) -> dict:
    import torch

    from circuitlab.analysis.heads import induction_by_period
    from circuitlab.analysis.heads.induction import training_probes
    from circuitlab.experiments.demo import phase_change
    from circuitlab.perf import matmul_gflops
    from circuitlab.training import RunConfig, read_metrics, train
    from circuitlab.training.config_files import resolve_config

    if threads:
        torch.set_num_threads(threads)
    cfg = RunConfig.load(resolve_config(config), [*overrides, f"train.seed={seed}", f"train.device={device}"])
    cfg.train.ckpt_every = cfg.train.steps
    gflops_before = matmul_gflops()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = train(cfg, tmp, progress=False, track=training_probes())
        seconds = time.perf_counter() - t0
        records = read_metrics(tmp)
    gflops_after = matmul_gflops()
    eos = result.tokenizer.eos_id
    sweep = induction_by_period(result.model, batch=32, seed=99, exclude=[eos])
    worst = int(sweep.best.argmin())
    pc = phase_change(records)
    last = records[-1]
    return {"seed": seed, "phase_change_step": pc and pc["step"], "steps": result.steps,
            "min_best_score": round(float(sweep.best.min()), 3), "at_period": sweep.periods[worst],
            "max_second_copy_loss": round(float(sweep.loss_second.max()), 3),
            "passes": sweep.passes(), "val_loss": round(result.best_val_loss, 3), "icl": last.get("icl"),
            "train_seconds": round(seconds, 1), "gflops": [round(gflops_before), round(gflops_after)],
            "best_by_period": dict(zip(sweep.periods, [round(float(x), 2) for x in sweep.best])),
            "loss_by_period": dict(zip(sweep.periods, [round(float(x), 2) for x in sweep.loss_second])),
            "curve": [(r["step"], round(max(s for layer in r["induction"] for s in layer), 3),
                       r.get("induction_by_period"), r.get("icl")) for r in records if "induction" in r]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--config", default="demo")
    p.add_argument("--jobs", type=int, default=1, help="seeds trained in parallel processes")
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--curve", action="store_true", help="also print the tracked curve per seed")
    a = p.parse_args()
    args = [(s, a.overrides, a.threads, a.device, a.config) for s in a.seeds]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            found = list(pool.map(one_seed, *zip(*args)))
    else:
        found = [one_seed(*x) for x in args]
    for f in found:
        if not a.curve:
            f.pop("curve")
        print(json.dumps({"overrides": a.overrides, **f}), flush=True)
    return 0 if all(f["passes"] for f in found) else 1


if __name__ == "__main__":
    sys.exit(main())
