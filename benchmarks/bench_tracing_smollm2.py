#!/usr/bin/env python
"""Causal tracing's time on SmolLM2-135M's shape: 30 layers, d_model 576, 9 heads, 3 key/value heads, vocab
49152 (random weights: the time does not depend on them), one prompt of --seq tokens with the subject at
positions 1-2, 10 noise samples, the kinds hidden, mlp, attn and hidden_no_mlp, one thread. Prints one JSON
line: seconds, the single-thread matmul GFLOP/s before and after (perf.matmul_gflops, to scale to 150 GFLOP/s),
the load average before and after, and the flops as a share of the naive sweep.

Before / after on the same machine, alternating fresh processes (the base commit checked out apart):

    git worktree add ../before <commit>      # the base commit checked out beside this one
    for i in 1 2; do PYTHONPATH=../before/src python benchmarks/bench_tracing_smollm2.py --label before
                     PYTHONPATH=src python benchmarks/bench_tracing_smollm2.py --label after; done
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.analysis.patching.causal_tracing import causal_trace
from circuitlab.perf import matmul_gflops

KINDS = ["hidden", "mlp", "attn", "hidden_no_mlp"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="run")
    ap.add_argument("--seq", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ModelConfig(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_mlp=1536, d_vocab=49152, n_ctx=2048,
                      norm="rmsnorm", norm_eps=1e-5, positional="rotary", mlp="swiglu", bias=False,
                      tied_embeddings=True, rotary_base=100000.0)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, cfg.d_vocab, (a.seq,), generator=torch.Generator().manual_seed(1))
    load0, g0 = os.getloadavg()[0], matmul_gflops(threads=1)
    start = time.perf_counter()
    causal_trace(model, tokens, (1, 3), kinds=KINDS, progress=False)
    seconds = time.perf_counter() - start
    g1, load1 = matmul_gflops(threads=1), os.getloadavg()[0]
    line = {"label": a.label, "seconds": round(seconds, 1), "gflops": [round(g0, 1), round(g1, 1)],
            "load": [round(load0, 1), round(load1, 1)],
            "scaled_150": round(seconds * (g0 + g1) / 2 / 150, 1)}
    try:  # the flops share exists only where the staggered sweep does
        from circuitlab.analysis.patching.causal_tracing import trace_flops
        flops, naive = trace_flops(cfg, a.seq, 10, KINDS, first=1)
        line["share_of_naive_flops"] = round(flops / naive, 3)
    except ImportError:
        pass
    print(json.dumps(line))


if __name__ == "__main__":
    main()
