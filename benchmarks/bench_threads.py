"""One thread or torch's default, by the size of a step: the measurement behind circuitlab.perf.SMALL_STEP_FLOPS.

    .venv/bin/python benchmarks/bench_threads.py            # ~1 min; --busy 0 to leave the other cores alone

For steps of growing size (a sparse-dictionary training step, a Transformer training step), the median
time per step with 1 thread and with N threads (N = torch's default, the machine's cores), while `--busy`
processes spin on other cores (a laptop running something else, or parallel test workers). Prints
flops/step, both times and N-thread time / 1-thread time (> 1: one thread is faster), and what
circuitlab.perf.threads_for picks. Exits 0 whatever it measures.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.perf import threads_for, transformer_step_flops


def sae_case(batch: int, d_in: int, d_sae: int):
    """A ReLU sparse-dictionary step: encode, decode, MSE + L1, backward, Adam."""
    gen = torch.Generator().manual_seed(0)
    w_enc = torch.nn.Parameter(torch.randn(d_in, d_sae, generator=gen) / d_in ** 0.5)
    w_dec = torch.nn.Parameter(torch.randn(d_sae, d_in, generator=gen) / d_sae ** 0.5)
    b = torch.nn.Parameter(torch.zeros(d_sae))
    opt = torch.optim.Adam([w_enc, w_dec, b], lr=1e-3)
    x = torch.randn(batch, d_in, generator=gen)

    def step():
        acts = torch.relu(x @ w_enc + b)
        loss = ((acts @ w_dec - x) ** 2).mean() + 1e-3 * acts.abs().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return f"dictionary {batch}x{d_in}->{d_sae}", 6.0 * batch * d_in * d_sae * 2, step


def model_case(preset: str, d_model: int, batch: int, seq: int, **fields):
    """A Transformer training step: loss, backward, AdamW."""
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset(preset, d_model=d_model, n_ctx=seq, **fields)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.d_vocab, (batch, seq))

    def step():
        loss = model.loss(tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return f"{preset} d{d_model} {batch}x{seq}", transformer_step_flops(cfg, batch * seq, seq), step


def seconds_per_step(step, threads: int, budget: float) -> float:
    torch.set_num_threads(threads)
    step()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=1, help="processes spinning on other cores meanwhile (default 1)")
    p.add_argument("--seconds", type=float, default=1.0, help="time per case and thread count")
    args = p.parse_args()
    many = torch.get_num_threads()
    cases = [sae_case(256, 16, 64), sae_case(1024, 32, 256), sae_case(1024, 64, 512), sae_case(1024, 128, 1024),
             sae_case(4096, 128, 2048),
             model_case("attn-only-2l", 32, 8, 16, n_heads=2, d_vocab=64),
             model_case("attn-only-2l", 64, 16, 64, d_vocab=512),
             model_case("attn-only-2l", 128, 64, 64, d_vocab=512)]
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"torch default threads: {many}; busy processes: {args.busy}")
        print(f"{'case':32} {'flops/step':>11} {'1 thread':>10} {f'{many} threads':>10} {'ratio':>6}  picks")
        for name, flops, step in cases:
            one = seconds_per_step(step, 1, args.seconds)
            all_ = seconds_per_step(step, many, args.seconds)
            torch.set_num_threads(many)
            print(f"{name:32} {flops:11.2e} {one * 1e3:8.2f}ms {all_ * 1e3:8.2f}ms {all_ / one:6.2f}  "
                  f"{threads_for(flops)}")
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
