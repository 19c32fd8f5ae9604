#!/usr/bin/env python
"""Speed and agreement benchmark: causal tracing's restoration sweeps, batched against one at a time.

On random GPT-2-style weights, one prompt with a corrupted subject, for each kind (hidden, mlp, attn,
hidden_no_mlp) every (layer, position) restored:

  - batched: circuitlab's restoration_sweep (noise samples x restorations in the batch dimension, each
    restoration from its own layer and position on);
  - one at a time: the same engine with batch_size=1 (the same shortcuts, one restoration per pass);
  - hook loop: one full forward pass per restoration with plain hooks on the noised run, as the paper's
    code does (the definition);
and the largest difference of batched against the hook loop (target <= 1e-5 in float32). Times are the
median over --repeats, round-robin.

    .venv/bin/python benchmarks/bench_tracing.py --threads 1
    .venv/bin/python benchmarks/bench_tracing.py --threads 1 --layers 12 --d-model 256 --seq 32
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from circuitlab.analysis.patching.causal_tracing import FROZEN, RESTORES, restoration_sweep, trace_run, window_layers
from circuitlab.analysis.patching.metrics import probability
from circuitlab.analysis.patching.noise import Noise, corrupt_positions
from circuitlab.config import ModelConfig
from circuitlab.model import Transformer
from circuitlab.model.hooks import act_name

KINDS = ("hidden", "mlp", "attn", "hidden_no_mlp")


def build(a: argparse.Namespace) -> Transformer:
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=a.layers, d_model=a.d_model, n_heads=a.heads,
                                  d_mlp=4 * a.d_model, d_vocab=a.vocab, n_ctx=max(a.seq, 16), tied_embeddings=False)
    torch.manual_seed(a.seed)
    model = Transformer(cfg)
    with torch.no_grad():  # random norm gains and biases, weights large enough for sharp attention
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b", ".bias")):
                p.copy_((1.0 if name.endswith(".w") else 0.0) + 0.3 * torch.randn_like(p))
            else:
                p.mul_(4.0)
    return model.eval()


@torch.no_grad()
def hook_loop(model, tokens, corrupted, metric, kind: str, window: int) -> torch.Tensor:
    """One full forward per restoration, hooks restoring the clean state (and freezing, when severed)."""
    _, clean = model.run_with_cache(tokens[None])
    with model.hooks(corrupted.hooks()):
        _, corrupt = model.run_with_cache(corrupted.tokens)
    L, T = model.cfg.n_layers, tokens.shape[0]
    out = torch.empty(L, T, dtype=torch.float64)
    for l in range(L):
        layers = window_layers(l, window, L) if kind in ("mlp", "attn") else [l]
        for p in range(T):
            def restore(act, hook, p=p):
                act = act.clone()
                act[:, p] = clean[hook.name][0, p]
                return act
            hooks = [(act_name(RESTORES[kind], j), restore) for j in layers]
            if kind in FROZEN:
                hooks += [(act_name(FROZEN[kind], j), lambda act, hook: corrupt[hook.name])
                          for j in range(l + 1, L)]
            out[l, p] = float(metric(model.run_with_hooks(corrupted.tokens, fwd_hooks=corrupted.hooks() + hooks)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--samples", type=int, default=10, help="noise samples (the paper's 10)")
    p.add_argument("--window", type=int, default=None, help="layers restored together for mlp and attn (default: layers x 10/48, at least 2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = build(a)
    window = a.window or max(2, round(a.layers * 10 / 48))
    gen = torch.Generator().manual_seed(a.seed + 1)
    tokens = torch.randint(0, a.vocab, (a.seq,), generator=gen)
    subject = [a.seq // 3, a.seq // 3 + 1]
    corrupted = corrupt_positions(model, tokens, subject, Noise(samples=a.samples))
    with torch.no_grad():
        metric = probability(int(model(tokens[None])[0, -1].argmax()))
    run = trace_run(model, tokens, corrupted, metric)
    rows = []
    print(f"causal tracing: {a.layers} layers, d_model {a.d_model}, {a.seq} tokens, {a.samples} noise samples, "
          f"window {window}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{'kind':<14} {'restorations':>12} {'batched':>10} {'one at a time':>14} {'hook loop':>10} "
          f"{'vs one':>7} {'vs loop':>8} {'max diff':>9}")
    for kind in KINDS:
        fns = {"batched": lambda: restoration_sweep(model, run, kind, window, progress=False),
               "one": lambda: restoration_sweep(model, run, kind, window, batch_size=1, progress=False),
               "loop": lambda: hook_loop(model, tokens, corrupted, metric, kind, window)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        out = {}
        for _ in range(a.repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                out[name] = fn()
                times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        diff = float((out["batched"] - out["loop"]).abs().max())
        row = {"kind": kind, "restorations": a.layers * a.seq, **{f"{k}_s": round(v, 4) for k, v in med.items()},
               "speedup_vs_one": round(med["one"] / med["batched"], 2),
               "speedup_vs_loop": round(med["loop"] / med["batched"], 2), "max_abs_diff": diff}
        rows.append(row)
        print(f"{kind:<14} {row['restorations']:>12} {med['batched']:>9.3f}s {med['one']:>13.3f}s {med['loop']:>9.3f}s "
              f"{row['speedup_vs_one']:>6.1f}x {row['speedup_vs_loop']:>7.1f}x {diff:>9.1e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=2)
    return 0 if all(r["max_abs_diff"] <= 1e-5 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
