#!/usr/bin/env python
"""Speed and agreement benchmark: a head x position activation-patching sweep.

circuitlab's activation_patching(target="head_out_by_pos") against TransformerLens 3.x
`patching.get_act_patch_attn_head_out_by_pos` on the same random weights (a GPT-2-style model by
default, attention-only with --attn-only), same prompts, same logit-difference metric:

  - agreement: the largest absolute difference between the two [layer, pos, head] results
    (target: <= 1e-5);
  - speed: wall time of each sweep, median over --repeats, timed round-robin so that changes in
    machine load hit both alike; ratio TL / ours (target: >= 10x). Our one-patch-per-forward time
    (batch_size=1) is shown too, to separate batching from per-call overhead.

    .venv/bin/python benchmarks/bench_patching.py
    .venv/bin/python benchmarks/bench_patching.py --layers 4 --d-model 256 --seq 48 --threads 1
    .venv/bin/python benchmarks/bench_patching.py --attn-only --json bench_patching.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version

import torch

from circuitlab.analysis.patching import activation_patching, logit_diff
from circuitlab.config import ModelConfig
from circuitlab.model import Transformer
from circuitlab.pretrained import to_transformer_lens

TARGETS = {"max_abs_diff": 1e-5, "speedup": 10.0}


def build(a: argparse.Namespace) -> Transformer:
    common = dict(n_layers=a.layers, d_model=a.d_model, n_heads=a.heads, d_vocab=a.vocab, n_ctx=max(a.seq, 16))
    if a.attn_only:
        cfg = ModelConfig.from_preset("attn-only-2l", **common)
    else:
        cfg = ModelConfig.from_preset("gpt2-tiny", d_mlp=4 * a.d_model, tied_embeddings=False, **common)
    torch.manual_seed(a.seed)
    model = Transformer(cfg)
    with torch.no_grad():  # random norm gains and biases too, and weights large enough for sharp attention
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b", ".bias")):
                p.copy_((1.0 if name.endswith(".w") else 0.0) + 0.3 * torch.randn_like(p))
            else:
                p.mul_(4.0)
    return model.eval()


def timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=4, help="prompt pairs per sweep")
    p.add_argument("--seq", type=int, default=32, help="tokens per prompt")
    p.add_argument("--attn-only", action="store_true", help="attention-only model (no norms, no MLPs)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    import transformer_lens.patching as tl_patching

    model = build(a)
    ref = to_transformer_lens(model)
    gen = torch.Generator().manual_seed(a.seed + 1)
    clean = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    corrupt = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    metric = logit_diff(torch.randint(0, a.vocab, (a.batch,), generator=gen),
                        torch.randint(0, a.vocab, (a.batch,), generator=gen))
    n_patches = a.layers * a.seq * a.heads

    def ours() -> torch.Tensor:
        return activation_patching(model, clean, corrupt, metric, "head_out_by_pos", progress=False).values

    def ours_one_at_a_time() -> torch.Tensor:
        return activation_patching(model, clean, corrupt, metric, "head_out_by_pos", batch_size=1,
                                   progress=False).values

    def tl() -> torch.Tensor:
        _, cache = ref.run_with_cache(clean)  # TL's sweep takes the clean cache; its cost is counted
        return tl_patching.get_act_patch_attn_head_out_by_pos(ref, corrupt, cache, metric).detach()

    import tqdm.auto  # silence TL's progress bar, which would otherwise be timed too

    tqdm_cls = tqdm.auto.tqdm
    tl_patching.tqdm = lambda it, *args, **kw: tqdm_cls(it, *args, disable=True, **kw)

    times: dict[str, list[float]] = {"ours": [], "ours_one_at_a_time": [], "tl": []}
    outputs: dict[str, torch.Tensor] = {}
    ours()  # warm-up
    for _ in range(a.repeats):
        for name, fn in (("ours", ours), ("ours_one_at_a_time", ours_one_at_a_time), ("tl", tl)):
            t, out = timed(fn)
            times[name].append(t)
            outputs[name] = out
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = float((outputs["ours"] - outputs["tl"].double()).abs().max())
    diff_single = float((outputs["ours"] - outputs["ours_one_at_a_time"]).abs().max())
    speedup = med["tl"] / med["ours"]

    arch = "attention-only" if a.attn_only else "GPT-2-style (LayerNorm, GELU MLP)"
    print(f"head x position patching sweep: {arch}, {a.layers} layers, d_model {a.d_model}, {a.heads} heads, "
          f"vocab {a.vocab}; batch {a.batch} x seq {a.seq} -> {n_patches} patches")
    print(f"torch {torch.__version__}, TransformerLens {version('transformer-lens')}, {torch.get_num_threads()} "
          f"threads, {platform.processor() or platform.machine()}")
    print(f"  circuitlab activation_patching (batched)   {med['ours'] * 1e3:9.1f} ms")
    print(f"  circuitlab, one patch per forward           {med['ours_one_at_a_time'] * 1e3:9.1f} ms")
    print(f"  TransformerLens get_act_patch_attn_head_out_by_pos {med['tl'] * 1e3:9.1f} ms")
    print(f"  speed-up vs TL: {speedup:.1f}x (target >= {TARGETS['speedup']:.0f}x)")
    print(f"  max |ours - TL| = {diff:.2e} (target <= {TARGETS['max_abs_diff']:.0e}); "
          f"batched vs one at a time: {diff_single:.2e}; result range {float(outputs['ours'].min()):.3f} .. "
          f"{float(outputs['ours'].max()):.3f}")
    ok = diff <= TARGETS["max_abs_diff"] and speedup >= TARGETS["speedup"]
    print("  PASS" if ok else "  BELOW TARGET")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "n_patches": n_patches, "median_s": med, "times_s": times,
                       "speedup": speedup, "max_abs_diff": diff, "max_abs_diff_batched_vs_single": diff_single,
                       "targets": TARGETS, "pass": ok}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
