#!/usr/bin/env python
"""Speed benchmark: circuitlab's Transformer vs HF GPT2LMHeadModel vs TransformerLens 3.x HookedTransformer.

One run, one machine, one equal GPT-2-style config (pre-LayerNorm, learned positions, gelu_new,
biases, tied embeddings where the library has them):

  1. training step (forward, next-token loss, backward, AdamW step; fp32): tokens/s for each
     library, ratios ours/HF (target >= 1.0x) and ours/TL (target >= 1.5x);
  2. run-with-cache of every hook: ours `run_with_cache(tokens)` vs TL `run_with_cache(tokens)`
     (target >= 2x TL), on the training batch and on one short prompt (batch 1 x --prompt-seq);
     TL is timed both as called (grad enabled: TL does not turn it off) and inside torch.no_grad();
     each library's plain forward is timed too, so the caching overhead (cache - forward) is shown;
  3. --training-configs (on by default): training tokens/s of our `demo` model (attn-only-2l,
     configs/demo.yaml's batch, context and vocab) and `quick` (batch 8 x seq 256).

The three libraries are timed round-robin (one repeat of each in turn) so that a change in
machine load hits all of them alike; the figure is the median over repeats.

    .venv/bin/python benchmarks/bench_model.py                    # default run (~1 min on 2 idle cores)
    .venv/bin/python benchmarks/bench_model.py --layers 6 --d-model 512 --heads 8 --batch 4 --seq 512
    .venv/bin/python benchmarks/bench_model.py --json bench.json --no-training-configs
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from circuitlab.config import ModelConfig
from circuitlab.model import Transformer
from circuitlab.perf import REFERENCE_GFLOPS, matmul_gflops

TARGETS = {"train_vs_hf": 1.0, "train_vs_tl": 1.5, "cache_vs_tl": 2.0}


# ---------------------------------------------------------------------------- models
def build_ours(a: argparse.Namespace) -> Transformer:
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=a.layers, d_model=a.d_model, n_heads=a.heads,
                                  d_mlp=a.d_mlp, n_ctx=a.n_ctx, d_vocab=a.vocab)
    return Transformer(cfg)


def build_hf(a: argparse.Namespace):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.n_ctx, n_embd=a.d_model, n_layer=a.layers,
                     n_head=a.heads, n_inner=a.d_mlp, activation_function="gelu_new",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                     tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, use_cache=False,
                     attn_implementation="sdpa")
    model = GPT2LMHeadModel(cfg)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model


def build_tl(a: argparse.Namespace):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=a.layers, d_model=a.d_model, n_ctx=a.n_ctx,
                                  d_head=a.d_model // a.heads, n_heads=a.heads, d_mlp=a.d_mlp,
                                  d_vocab=a.vocab, act_fn="gelu_new", normalization_type="LN",
                                  positional_embedding_type="standard", eps=1e-5, device=a.device, seed=0)
    return HookedTransformer(cfg, move_to_device=True)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ---------------------------------------------------------------------------- steps
def ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_step_fn(kind: str, model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A closure doing one fp32 training step on tokens [batch, seq+1]; returns the loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    model.train()

    if kind == "ours":
        def loss_of(tokens):  # what the trainer calls: lm_loss(model(inputs), targets)
            return model.loss(tokens)
    elif kind == "hf":
        def loss_of(tokens):
            return ce(model(input_ids=tokens[:, :-1]).logits, tokens[:, 1:])
    else:
        def loss_of(tokens):
            return ce(model(tokens[:, :-1], return_type="logits"), tokens[:, 1:])

    def step(tokens: torch.Tensor) -> torch.Tensor:
        loss = loss_of(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_round_robin(fns: dict[str, Callable[[], object]], warmup: int, repeats: int, iters: int,
                      device: str) -> dict[str, list[float]]:
    """Seconds per call of each fn; repeats alternate between fns so load changes hit all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            sync(device)
            times[name].append((time.perf_counter() - t0) / iters)
    return times


def summary(seconds: list[float], tokens: int) -> dict[str, float]:
    med = statistics.median(seconds)
    return {"ms": med * 1e3, "tok_s": tokens / med, "ms_min": min(seconds) * 1e3, "ms_max": max(seconds) * 1e3}


# ---------------------------------------------------------------------------- sections
def bench_training(a: argparse.Namespace, models: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(a.device)
    steps = {k: train_step_fn(k, m) for k, m in models.items()}
    first = {k: float(fn(tokens)) for k, fn in steps.items()}  # also a sanity check: ~ln(vocab) for all
    times = timed_round_robin({k: (lambda fn=fn: fn(tokens)) for k, fn in steps.items()},
                              a.warmup, a.repeats, a.iters, a.device)
    n_tok = a.batch * a.seq
    out = {k: {**summary(v, n_tok), "first_loss": first[k]} for k, v in times.items()}
    return out


def bench_cache(a: argparse.Namespace, ours, tl, batch: int, seq: int, repeats: int, iters: int) -> dict:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, a.vocab, (batch, seq), generator=g).to(a.device)
    ours.eval()
    tl.eval()
    n_ours = len(ours.run_with_cache(tokens)[1])
    n_tl = len(tl.run_with_cache(tokens)[1])

    def tl_no_grad():
        with torch.no_grad():
            return tl.run_with_cache(tokens)

    @torch.no_grad()
    def forward(model):
        return model(tokens)

    # The plain forwards show how much of each run_with_cache is the model itself (mostly matmuls,
    # the same for both) and how much is hooking and caching (the overhead lines).
    fns = {"ours": lambda: ours.run_with_cache(tokens), "tl": lambda: tl.run_with_cache(tokens),
           "tl_no_grad": tl_no_grad, "ours_forward": lambda: forward(ours), "tl_forward": lambda: forward(tl)}
    times = timed_round_robin(fns, a.warmup, repeats, iters, a.device)
    out = {k: summary(v, batch * seq) for k, v in times.items()}
    out["ours"]["n_cached"] = n_ours
    out["tl"]["n_cached"] = out["tl_no_grad"]["n_cached"] = n_tl
    out["ours_forward"]["n_cached"] = out["tl_forward"]["n_cached"] = 0
    return out


def bench_training_configs(a: argparse.Namespace) -> dict:
    """Our model only: the training step of configs/demo.yaml and configs/quick.yaml, with their model,
    vocabulary size, batch and context (quick: batch 8 of its 32, to keep the run short)."""
    from circuitlab.training import RunConfig
    from circuitlab.training.config_files import resolve_config

    setups = {}
    for name, batch in (("demo", None), ("quick", 8)):
        run = RunConfig.load(resolve_config(name))
        cfg = run.model_config(run.data.vocab_size)
        setups[f"{name} ({run.model.get('preset', 'custom')})"] = (cfg, batch or run.train.batch_size,
                                                                   run.train.seq_len)
    out = {}
    for name, (cfg, batch, seq) in setups.items():
        torch.manual_seed(0)
        model = Transformer(cfg).to(a.device)
        step = train_step_fn("ours", model)
        tokens = torch.randint(0, cfg.d_vocab, (batch, seq + 1)).to(a.device)
        times = timed_round_robin({name: lambda: step(tokens)}, a.warmup, a.repeats, a.iters, a.device)
        out[name] = {**summary(times[name], batch * seq), "batch": batch, "seq": seq,
                     "params": model.num_params(), "params_non_embed": model.num_params(False)}
        del model, step
    return out


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-mlp", type=int, default=1024)
    p.add_argument("--n-ctx", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256, help="tokens per row fed to the model (<= n_ctx)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls of each function first")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats; the median is reported")
    p.add_argument("--iters", type=int, default=2, help="calls per timed repeat")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores of this machine)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompt-seq", type=int, default=64,
                   help="also time run_with_cache on one short prompt (batch 1 x this many tokens; 0 = skip)")
    p.add_argument("--training-configs", action=argparse.BooleanOptionalAction, default=True,
                   help="also time training of our demo and quick configs")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    a = p.parse_args(argv)
    if a.seq > a.n_ctx:
        p.error(f"--seq ({a.seq}) must be <= --n-ctx ({a.n_ctx})")
    if a.prompt_seq > a.n_ctx:
        p.error(f"--prompt-seq ({a.prompt_seq}) must be <= --n-ctx ({a.n_ctx})")
    if a.d_model % a.heads:
        p.error("--d-model must be divisible by --heads")
    return a


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    threads = a.threads or cores()
    torch.set_num_threads(threads)
    import gc
    from importlib.metadata import version

    import transformer_lens  # noqa: F401  (fail early if the benchmark environment lacks it)
    import transformers

    t_start = time.perf_counter()
    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "transformer_lens": version("transformer_lens"), "device": a.device, "threads": threads,
           "cpu": platform.processor() or platform.machine(), "load_before": load()}
    print(f"# circuitlab speed benchmark  torch {env['torch']}  transformers {env['transformers']}  "
          f"transformer_lens {env['transformer_lens']}  device {a.device}  threads {threads}  "
          f"load avg {env['load_before']:.2f}")
    env["gflops"] = matmul_gflops()
    print(f"# this machine: {env['gflops']:.0f} GFLOP/s fp32 matmul (circuitlab.perf.matmul_gflops, {threads} threads); "
          f"wall times scale to a {REFERENCE_GFLOPS:.0f} GFLOP/s machine by x{env['gflops'] / REFERENCE_GFLOPS:.2f}")
    if env["load_before"] > 0.5 * threads:
        print(f"# WARNING: the machine is busy (1-min load {env['load_before']:.1f} on {threads} cores); "
              "absolute figures will be low, ratios less so (the libraries are timed in turn)")
    print(f"# config: {a.layers} layers, d_model {a.d_model}, {a.heads} heads, d_mlp {a.d_mlp}, n_ctx {a.n_ctx}, "
          f"vocab {a.vocab}; batch {a.batch} x seq {a.seq} = {a.batch * a.seq} tokens; "
          f"median of {a.repeats} repeats x {a.iters} calls after {a.warmup} warmup")

    torch.manual_seed(0)
    models = {"ours": build_ours(a).to(a.device), "hf": build_hf(a).to(a.device), "tl": build_tl(a)}
    label = {"ours": "circuitlab", "hf": "HF GPT2LMHeadModel (sdpa)", "tl": "TransformerLens HookedTransformer"}

    train = bench_training(a, models)
    print("\n## training step (fwd + loss + bwd + AdamW, fp32)")
    print(f"{'model':34s} {'params':>10s} {'ms/step':>9s} {'tokens/s':>10s} {'ours/x':>7s}  first loss")
    for k, r in train.items():
        r["params"] = n_params(models[k])
        ratio = train["ours"]["tok_s"] / r["tok_s"]
        print(f"{label[k]:34s} {r['params']:>10,d} {r['ms']:9.1f} {r['tok_s']:10,.0f} "
              f"{ratio:6.2f}x  {r['first_loss']:.3f}")
    gc.collect()  # the optimizers' state goes with the closures

    workloads = {"batch": (a.batch, a.seq, a.repeats, a.iters)}
    if a.prompt_seq:
        workloads["prompt"] = (1, a.prompt_seq, a.repeats * 3, a.iters * 5)
    cache: dict[str, dict] = {}
    names = {"ours": "circuitlab run_with_cache", "tl": "TL run_with_cache",
             "tl_no_grad": "TL run_with_cache in no_grad", "ours_forward": "circuitlab forward (no hooks)",
             "tl_forward": "TL forward (no hooks)"}
    for w, (batch, seq, repeats, iters) in workloads.items():
        cache[w] = r_w = bench_cache(a, models["ours"], models["tl"], batch, seq, repeats, iters)
        print(f"\n## run_with_cache, every hook, batch {batch} x seq {seq} (forward only)")
        print(f"{'model':34s} {'cached':>10s} {'ms/call':>9s} {'tokens/s':>10s} {'ours/x':>7s}")
        for k, r in r_w.items():
            ratio = r_w["ours"]["tok_s"] / r["tok_s"]
            print(f"{names[k]:34s} {r['n_cached']:>10d} {r['ms']:9.2f} {r['tok_s']:10,.0f} {ratio:6.2f}x")
        over_ours = r_w["ours"]["ms"] - r_w["ours_forward"]["ms"]
        over_tl = r_w["tl_no_grad"]["ms"] - r_w["tl_forward"]["ms"]
        r_w["overhead_ms"] = {"ours": over_ours, "tl_no_grad": over_tl}
        print(f"caching overhead (run_with_cache - forward): ours {over_ours:.2f} ms, TL no_grad {over_tl:.2f} ms"
              + (f" ({over_tl / over_ours:.1f}x)" if over_ours > 0 else ""))
    del models
    gc.collect()

    configs = bench_training_configs(a) if a.training_configs else {}
    if configs:
        print("\n## training configs (circuitlab only, training step)")
        print(f"{'config':34s} {'params':>10s} {'batch x seq':>12s} {'ms/step':>9s} {'tokens/s':>10s}")
        for k, r in configs.items():
            print(f"{k:34s} {r['params']:>10,d} {str(r['batch']) + ' x ' + str(r['seq']):>12s} "
                  f"{r['ms']:9.1f} {r['tok_s']:10,.0f}")

    checks = [("train_vs_hf", "training step, ours / HF", train["ours"]["tok_s"] / train["hf"]["tok_s"],
               TARGETS["train_vs_hf"]),
              ("train_vs_tl", "training step, ours / TL", train["ours"]["tok_s"] / train["tl"]["tok_s"],
               TARGETS["train_vs_tl"])]
    for w, (batch, seq, _, _) in workloads.items():
        r_w = cache[w]
        checks.append((f"cache_vs_tl_{w}", f"run_with_cache {batch}x{seq}, ours / TL",
                       r_w["ours"]["tok_s"] / r_w["tl"]["tok_s"], TARGETS["cache_vs_tl"]))
        checks.append((f"cache_vs_tl_no_grad_{w}", f"run_with_cache {batch}x{seq}, ours / TL no_grad",
                       r_w["ours"]["tok_s"] / r_w["tl_no_grad"]["tok_s"], TARGETS["cache_vs_tl"]))
    print("\n## targets")
    for _, what, ratio, target in checks:
        print(f"{what:44s} {ratio:6.2f}x  (target >= {target:.1f}x)  {'ok' if ratio >= target else 'MISSED'}")
    elapsed = time.perf_counter() - t_start
    env["load_after"] = load()
    print(f"\n# total {elapsed:.0f} s, load avg before/after {env['load_before']:.2f}/{env['load_after']:.2f}")

    if a.json:
        result = {"env": env, "args": vars(a), "training": train, "run_with_cache": cache,
                  "training_configs": configs, "ratios": {k: r for k, _, r, _ in checks},
                  "targets": TARGETS, "seconds": elapsed}
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"# wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
