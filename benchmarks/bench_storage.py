#!/usr/bin/env python
"""Storage apart from compute: resident memory and forward time of half-precision storage, float32 arithmetic.

Random weights at Gemma-2-2B's published shape (config only, no download: d_model 2304, 26 layers, 8 heads of
256 with 4 kv heads, d_mlp 9216, vocabulary 256,000, tied embedding) plus one Gemma Scope-width transcoder per
layer (16,384 latents, ReLU, reading blocks.L.ln2.hook_normalized, writing blocks.L.hook_mlp_out).

    memory: each configuration in a fresh subprocess (this parent never imports torch: a child's ru_maxrss
            starts from its parent's peak at fork): build the model and transcoders in --dtype storage, run
            the model on --tokens tokens and every transcoder on its layer's input (every weight touched), and
            print the peak resident set size (ru_maxrss; VmHWM alongside). --layers N builds N of the 26 layers
            (and N transcoders); two layer counts give the per-layer cost, so the 26-layer figure can be
            extrapolated where the whole would not fit beside other work.
    speed:  a --layers-deep model of the same widths in float32 and the same model held in --dtype with
            float32 arithmetic, forward of --tokens tokens, best of --repeat, interleaved (say the load).

    .venv/bin/python benchmarks/bench_storage.py memory --dtype bfloat16 --layers 26
    .venv/bin/python benchmarks/bench_storage.py memory --dtype float32 --layers 2 4     # extrapolated to 26
    .venv/bin/python benchmarks/bench_storage.py memory --dtype bfloat16 --layers 4 --mmap  # transcoders mapped
    .venv/bin/python benchmarks/bench_storage.py speed --layers 4 --tokens 16 --threads 1
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GEMMA2_2B = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 2304,
             "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
             "query_pre_attn_scalar": 256, "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh",
             "tie_word_embeddings": True}
D_SAE = 16384

CHILD = r"""
import json, resource, sys, time
import torch
sys.path.insert(0, {bench!r})
from bench_storage import build_model, build_transcoders

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def status_mb(field):
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":")][0]

torch.set_num_threads({threads})
start = time.perf_counter()
model = build_model({layers}, {dtype!r})
after_model = peak_mb()
dicts = build_transcoders(model, {dtype!r}) if {transcoders} else []
if {mmap} and dicts:  # saved once in our layout, then mapped back: file-backed pages instead of anonymous memory
    import tempfile
    from circuitlab.graphs import Transcoders
    folder = tempfile.mkdtemp(dir={tmp!r})
    for i, d in enumerate(dicts):
        d.save(f"{{folder}}/layer{{i:02d}}")
    dicts = None
    tc = Transcoders.load(model, folder, mmap=True)
    dicts = [tc.dictionary(i) for i in tc.layers]
built = time.perf_counter() - start
after_build = peak_mb()
tokens = torch.randint(0, model.cfg.d_vocab, (1, {tokens}), generator=torch.Generator().manual_seed(0))
names = [d.cfg.hook_name for d in dicts]
t0 = time.perf_counter()
with torch.no_grad():
    logits, cache = model.run_with_cache(tokens, names_filter=names)
    for d in dicts:
        d(cache[d.cfg.hook_name])
forward = time.perf_counter() - t0
print(json.dumps({{"layers": {layers}, "dtype": {dtype!r}, "transcoders": len(dicts), "model_peak_mb": after_model,
                  "build_peak_mb": after_build, "peak_mb": peak_mb(), "vmhwm_mb": status_mb("VmHWM"),
                  "rss_anon_mb": status_mb("RssAnon"), "rss_file_mb": status_mb("RssFile"), "build_s": built,
                  "forward_s": forward, "params": model.num_params(),
                  "storage": str(model.storage_dtype), "compute": str(model.compute_dtype)}}))
if {mmap} and dicts:
    import shutil
    shutil.rmtree(folder)
"""


def build_model(layers: int, dtype: str):
    """Gemma-2-2B's shape with `layers` layers, random N(0, 0.02) matrices written straight in `dtype` (no
    float32 copy first), norm gains 1; float32 arithmetic (model/storage.py)."""
    import torch

    from circuitlab.model.loading import uninitialised_model
    from circuitlab.pretrained.catalog import model_config_from_hf

    cfg = model_config_from_hf({**GEMMA2_2B, "num_hidden_layers": layers}, n_ctx=512)
    model = uninitialised_model(cfg, dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen) if p.dim() >= 2 else p.zero_()  # Gemma gains are 1 + w: w = 0
    return model.eval()


def build_transcoders(model, dtype: str) -> list:
    """One random ReLU transcoder of D_SAE latents per layer, each cast to `dtype` as soon as it is built (one
    float32 transcoder at a time, as Transcoders.load does)."""
    import torch

    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary

    out = []
    d = model.cfg.d_model
    for layer in range(model.cfg.n_layers):
        cfg = DictionaryConfig("relu", d_in=d, d_sae=D_SAE, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                               out_hook_name=f"blocks.{layer}.hook_mlp_out")
        with torch.device("meta"):
            t = SparseDictionary(cfg)
        t = t.to_empty(device="cpu")
        gen = torch.Generator().manual_seed(layer)
        with torch.no_grad():
            for p in t.parameters():
                p.normal_(0, d**-0.5, generator=gen) if p.dim() >= 2 else p.fill_(-0.5)
        out.append(t.set_dtypes(dtype))
    return out


def memory(args: argparse.Namespace) -> list[dict]:
    results = []
    for layers in args.layers:
        code = CHILD.format(bench=str(Path(__file__).parent), threads=args.threads, layers=layers, dtype=args.dtype,
                            transcoders=not args.no_transcoders, tokens=args.tokens, mmap=args.mmap,
                            tmp=args.tmp)
        env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"child failed:\n{proc.stderr[-2000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        mapped = " (memory-mapped)" if args.mmap else ""
        print(f"{args.dtype} storage, {layers} layers + {r['transcoders']} transcoders{mapped}: peak "
              f"{r['peak_mb'] / 1024:.2f} GiB (model built {r['model_peak_mb'] / 1024:.2f}, all built "
              f"{r['build_peak_mb'] / 1024:.2f}); after the forward: {r['rss_anon_mb'] / 1024:.2f} GiB anonymous + "
              f"{r['rss_file_mb'] / 1024:.2f} GiB file-backed; forward {r['forward_s']:.2f} s; built in "
              f"{r['build_s']:.0f} s", flush=True)
    if len(results) >= 2:
        a, b = results[0], results[-1]
        per_layer = (b["peak_mb"] - a["peak_mb"]) / (b["layers"] - a["layers"])
        at26 = a["peak_mb"] + per_layer * (26 - a["layers"])
        print(f"per layer (+ its transcoder): {per_layer:.0f} MiB; extrapolated to 26 layers: {at26 / 1024:.2f} GiB")
    return results


def speed(args: argparse.Namespace) -> None:
    import copy
    import time

    import torch

    torch.set_num_threads(args.threads)
    full = build_model(args.layers[0], "float32")
    held = copy.deepcopy(full).set_dtypes(args.dtype)
    tokens = torch.randint(0, full.cfg.d_vocab, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    best = {"float32": float("inf"), args.dtype: float("inf")}
    with torch.no_grad():
        full(tokens), held(tokens)
        for _ in range(args.repeat):
            for name, model in (("float32", full), (args.dtype, held)):
                t = time.perf_counter()
                model(tokens)
                best[name] = min(best[name], time.perf_counter() - t)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"forward, {args.layers[0]} layers of Gemma-2-2B's widths, {args.tokens} tokens, {args.threads} thread(s), "
          f"best of {args.repeat}: float32 {best['float32']:.3f} s, {args.dtype} storage + float32 compute "
          f"{best[args.dtype]:.3f} s ({best[args.dtype] / best['float32']:.2f}x); load {' '.join(load)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("memory", "speed"))
    p.add_argument("--dtype", default="bfloat16", help="storage dtype (default bfloat16)")
    p.add_argument("--layers", type=int, nargs="+", default=[26], help="layer counts (default 26)")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: what perf.threads_for_work picks on a busy 2-core machine)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-transcoders", action="store_true")
    p.add_argument("--mmap", action="store_true", help="save the transcoders in our layout and map them back")
    p.add_argument("--tmp", default="/tmp", help="where --mmap saves them (deleted after)")
    p.add_argument("--json", default=None, help="also write the memory results here")
    args = p.parse_args()
    if args.what == "speed":
        speed(args)
        return
    results = memory(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
