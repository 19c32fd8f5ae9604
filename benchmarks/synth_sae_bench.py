#!/usr/bin/env python
"""Matryoshka BatchTopK against BatchTopK on a reduced SynthSAEBench, scored by SAELens's own evaluator.

SynthSAEBench-16k (Chanin & Garriga-Alonso 2026; SAELens's docs/synth_sae_bench.md) is a synthetic model with
16,384 known features in 768 dimensions (Zipfian firing, a hierarchy of mutually exclusive children scaled by
their parent, low-rank correlations, orthogonalised directions, magnitudes 5 -> 4); SAEs of width 4,096 are
trained on 200M samples and scored by sae_lens.synthetic.eval_sae_on_synthetic_data (MCC, F1 / precision /
recall, uniqueness, explained variance, L0, dead latents, shrinkage). It needs a download and a GPU. The
reduced one here is the same recipe (SAELens's SyntheticModelConfig, every setting as the 16k's) at 1/8 of its
features, hidden width and SAE width: 2,048 features in 96 dimensions, SAEs of 512 latents at k = the true L0 of
the 512 most frequent features (rounded), Matryoshka widths [16, 64, 256, 512] (x4 nesting). SAELens's sampler
is slow on a CPU (~0.3 ms a row here), so a pool of rows is drawn once and cycled (--pool rows; the evaluation
draws its own fresh rows).

Both dictionaries train in one circuitlab run (the same batches, steps, lr, seed), are written in the SAELens
layout (the JumpReLU they are at inference), loaded by sae_lens.SAE.load_from_disk and scored by SAELens's
evaluator, so nothing of ours grades itself.

    PYTHONPATH=src python benchmarks/synth_sae_bench.py                    # ~6 min on 2 busy cores
    PYTHONPATH=src python benchmarks/synth_sae_bench.py --steps 4000 --json out.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from typing import Any

import torch

SCALE = 8  # features, hidden width and SAE width are the 16k benchmark's / SCALE


def synthetic_model(seed: int) -> Any:
    """SynthSAEBench-16k's recipe (SAELens's docs, every setting) at 1/SCALE of its features and width."""
    from sae_lens.synthetic import (FoldedNormalMagnitudeConfig, HierarchyConfig, LinearMagnitudeConfig,
                                    LowRankCorrelationConfig, OrthogonalizationConfig, SyntheticModel,
                                    SyntheticModelConfig, ZipfianFiringProbabilityConfig)

    cfg = SyntheticModelConfig(
        num_features=16_384 // SCALE, hidden_dim=768 // SCALE,
        firing_probability=ZipfianFiringProbabilityConfig(exponent=0.5, max_prob=0.4, min_prob=5e-4),
        hierarchy=HierarchyConfig(total_root_nodes=128 // SCALE, branching_factor=4, max_depth=3,
                                  mutually_exclusive_portion=1.0, mutually_exclusive_min_depth=0,
                                  compensate_probabilities=True, scale_children_by_parent=True),
        orthogonalization=OrthogonalizationConfig(num_steps=100, lr=3e-4),
        correlation=LowRankCorrelationConfig(rank=25, correlation_scale=0.1),
        mean_firing_magnitudes=LinearMagnitudeConfig(start=5.0, end=4.0),
        std_firing_magnitudes=FoldedNormalMagnitudeConfig(mean=0.5, std=0.5), bias=0.5, seed=seed)
    with contextlib.redirect_stderr(io.StringIO()):  # its orthogonalisation's progress bar
        return SyntheticModel(cfg)


class PoolSource:
    """An activation source (dictionaries.store) cycling over rows drawn once from the synthetic model."""

    def __init__(self, rows: torch.Tensor, val: torch.Tensor, rows_per_chunk: int = 8192) -> None:
        self.rows, self.val, self.rows_per_chunk = rows, val, rows_per_chunk
        self.widths = {"synth": rows.shape[1]}

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        pool = self.rows if split == "train" else self.val
        start = (index * self.rows_per_chunk) % (len(pool) - self.rows_per_chunk + 1)
        return {"synth": pool[start:start + self.rows_per_chunk]}

    def describe(self) -> dict[str, Any]:
        return {"kind": "synth-sae-bench-reduced", "rows": len(self.rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--pool", type=int, default=262_144, help="training rows drawn from the synthetic model")
    ap.add_argument("--eval-samples", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=42, help="the synthetic model's (the 16k benchmark's is 42)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the metrics here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sae_lens import SAE
    from sae_lens.synthetic import eval_sae_on_synthetic_data

    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.saelens import save_saelens
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
    from circuitlab.perf import matmul_gflops

    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {matmul_gflops():.0f} GFLOP/s matmul here")
    t0 = time.time()
    model = synthetic_model(args.seed)
    torch.manual_seed(args.seed)
    rows, feats = model.sample_with_features(args.pool)
    val = model.sample(16_384)
    d_sae = 4096 // SCALE
    k = round(float((feats[:, :d_sae] > 0).sum(1).float().mean()))   # the true L0 of the SAE-width top features
    print(f"synthetic model and {args.pool:,} rows in {time.time() - t0:.0f}s: {model.cfg.num_features} features "
          f"in {model.cfg.hidden_dim} dims, true L0 {float((feats > 0).sum(1).float().mean()):.1f} "
          f"({k} among the {d_sae} most frequent)")

    source = PoolSource(rows, val)
    widths = [d_sae // 32, d_sae // 8, d_sae // 2, d_sae]
    configs = [DictionaryConfig("batchtopk", d_in=model.cfg.hidden_dim, d_sae=d_sae, k=k, hook_name="synth"),
               DictionaryConfig("matryoshka_batchtopk", d_in=model.cfg.hidden_dim, d_sae=d_sae, k=k,
                                hook_name="synth", matryoshka_widths=widths)]
    train = DictTrainConfig(steps=args.steps, batch_size=args.batch, lr=args.lr, log_every=500)
    t0 = time.time()
    result = DictionaryTrainer(configs, train, ActivationStore(source, args.batch),
                               ActivationStore(source, 4096, split="val")).fit(progress=False)
    print(f"trained both ({args.steps} steps of {args.batch}, lr {args.lr}) in {time.time() - t0:.0f}s")

    out: dict[str, Any] = {"k": k, "widths": widths, "steps": args.steps, "batch": args.batch, "pool": args.pool}
    with tempfile.TemporaryDirectory() as tmp:
        for cfg, sae in zip(configs, result.dictionaries):
            theirs = SAE.load_from_disk(str(save_saelens(sae, f"{tmp}/{cfg.architecture}")))
            torch.manual_seed(args.seed + 1)   # the same fresh evaluation rows for both
            scores = eval_sae_on_synthetic_data(theirs, model.feature_dict, model.activation_generator,
                                                num_samples=args.eval_samples, batch_size=10_000)
            out[cfg.architecture] = scores.to_dict()
    cols = ("mcc", "uniqueness", "explained_variance", "sae_l0", "dead_latents", "shrinkage")
    print(f"{'':22}" + "".join(f"{c:>14}" for c in ("f1", "precision", "recall", *cols)))
    for arch in ("batchtopk", "matryoshka_batchtopk"):
        s, c = out[arch], out[arch]["classification"]
        print(f"{arch:22}" + "".join(f"{v:>14.4f}" for v in (c["f1_score"], c["precision"], c["recall"],
                                                              *(s[n] for n in cols))))
    print(f"true L0 {out['batchtopk']['true_l0']:.2f}; load {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
