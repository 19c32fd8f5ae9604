"""Every method at the published shapes: time, peak memory, the estimate beside the peak, the peer where cheap.

Random weights at the published shapes of GPT-2 small, Qwen3-0.6B, Llama-3.2-1B and Gemma-2-2B (configs only,
nothing downloaded; benchmarks/_shapes.py) and transcoders at published widths (24,576 for GPT-2 small, 16,384
for Gemma Scope, TopK k=64). Each (shape, method) runs in its own subprocess, so every peak is its own: the
peak resident memory (VmHWM) less what the process held after building the model (and dictionaries) — the
method's own memory — beside the estimate the library prints before the work.

Methods (the README's method map): forward, run_with_cache, patching (a resid_pre sweep over layers x
positions), eap (edge attribution patching), causal_tracing (hidden/mlp/attn restorations, 10 noise runs),
graph (the attribution graph, --nodes feature nodes), sae_step (one training step of a dictionary at the
published width, batch 4,096), tuned_lens (training steps). Peers: Hugging Face's forward on a random model
of the same config (transformers), TransformerLens's run_with_cache on our weights (to_transformer_lens).

    PYTHONPATH=src python benchmarks/bench_scale.py --quick                       # GPT-2 small, short prompts
    PYTHONPATH=src python benchmarks/bench_scale.py --shapes gpt2-small --methods graph --nodes 7500
    PYTHONPATH=src python benchmarks/bench_scale.py --shapes gemma-2-2b --layers 6  # fewer layers, same widths
    CIRCUITLAB_MEMORY=2.5G PYTHONPATH=src python benchmarks/bench_scale.py --shapes gemma-2-2b --methods graph \
        --storage bfloat16                                        # all 26 layers, bfloat16 weights, float32 arithmetic
    PYTHONPATH=src python benchmarks/bench_scale.py --device cuda --dtype bfloat16  # benchmarks/gpu_scale.sh
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

METHODS = ("forward", "run_with_cache", "patching", "eap", "causal_tracing", "graph", "sae_step", "tuned_lens")
PEERS = {"forward": "hf_forward", "run_with_cache": "tl_cache"}


def _rss_kib(field: str = "VmRSS") -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def run_one(shape: str, method: str, n_pos: int, layers: int | None, nodes: int, device: str, dtype: str,
            storage: str | None = None) -> dict:
    """One (shape, method) in this process: build, then time the method; returns the row."""
    import torch

    from _shapes import HF_CONFIGS, build_model, build_transcoders
    from circuitlab import memory

    from circuitlab.perf import threads_for

    torch.set_num_threads(threads_for(1e9))   # the library's rule: no more threads than the cores free now
    torch_dtype = getattr(torch, dtype)
    row: dict = {"shape": shape, "method": method, "n_pos": n_pos, "layers": layers, "device": device, "dtype": dtype,
                 "storage": storage}
    g = torch.Generator().manual_seed(0)
    if method in ("hf_forward",):
        import transformers

        hf = dict(HF_CONFIGS[shape])
        if layers:
            hf["n_layer" if "n_layer" in hf else "num_hidden_layers"] = layers
        conf = transformers.AutoConfig.for_model(**hf)
        model = transformers.AutoModelForCausalLM.from_config(conf).eval().to(device, torch_dtype)
        tokens = torch.randint(0, conf.vocab_size, (1, n_pos), generator=g).to(device)
        with torch.no_grad():
            model(tokens[:, :2])                          # warm-up: lazy initialisation is not the method's
        est = None
        fn = lambda: model(tokens).logits  # noqa: E731
    else:
        if storage:   # the matrices held in `storage`, float32 arithmetic: built straight in it
            model = build_model(shape, n_layers=layers, storage=storage)
        else:
            model = build_model(shape, n_layers=layers).to(device, torch_dtype)
        cfg = model.cfg
        tokens = torch.randint(0, cfg.d_vocab, (1, n_pos), generator=g).to(device)
        tc = None
        if method == "graph":
            tc = build_transcoders(model, shape, storage=storage) if storage else \
                build_transcoders(model, shape).to(torch_dtype)
        if tc is not None and device != "cpu":
            for layer in tc.layers:
                tc.dictionary(layer).to(device)
        with torch.no_grad():
            model(tokens[:, :2])                          # warm-up: fused weights, thread pools, allocator
        est, fn = _method(method, model, tc, tokens, nodes, torch_dtype)
    _reset_peak()
    base = _rss_kib()
    t0 = time.perf_counter()
    with torch.no_grad() if method in ("forward", "hf_forward", "run_with_cache", "tl_cache") else _null():
        out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    row["seconds"] = time.perf_counter() - t0
    row["peak_mib"] = (_rss_kib("VmHWM") - base) / 1024
    row["loaded_mib"], row["process_peak_mib"] = base / 1024, _rss_kib("VmHWM") / 1024   # the whole process's
    if device == "cuda":
        row["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if callable(est):
        est = est()
    if est is not None:
        row["estimate_mib"] = est.peak_bytes / 2**20
        row["estimate_line"] = est.line()
        if est.flops is not None:   # the estimated time at the speed measured now, beside the measured one
            row["estimate_seconds"] = est.timed().seconds()
    if method == "graph":
        row["graph"] = {k: out.info[k] for k in ("n_active_features", "n_feature_nodes", "batch_size",
                                                  "backward_passes", "peak_mb", "threads") if k in out.info}
        _reset_peak()
        held = _rss_kib()
        t1 = time.perf_counter()
        out.prune()
        row["prune_seconds"] = time.perf_counter() - t1
        row["prune_peak_mib"] = (_rss_kib("VmHWM") - held) / 1024
        row["prune_process_peak_mib"] = _rss_kib("VmHWM") / 1024
    row["budget_gib"] = memory.budget_bytes() / 2**30
    row["threads"] = torch.get_num_threads()
    return row


def _reset_peak() -> None:
    """VmHWM starts again from the current RSS (Linux: /proc/self/clear_refs 5), so the peak is the method's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _method(method: str, model, tc, tokens, nodes: int, dtype):
    """(estimate, fn) for a method of ours: the estimate an Estimate, None, or a function that makes it (called
    after the measurement: making it runs the model, whose freed memory would hide part of the method's peak)."""
    import torch

    from circuitlab import memory

    cfg = model.cfg
    T = tokens.shape[1]
    size = torch.empty(0, dtype=dtype).element_size()
    if method == "forward":
        # the logits, and one block's working set (the residual stream, attention's inputs, the MLP's hidden)
        est = memory.Estimate("forward", {"logits": size * T * cfg.d_vocab,
                                          "a block": size * T * (4 * cfg.d_model + 3 * cfg.mlp_dim)})
        return est, lambda: model(tokens)
    if method == "run_with_cache":
        from circuitlab.model.hooks import cache_estimate

        return (lambda: cache_estimate(model, *tokens.shape)), lambda: model.run_with_cache(tokens)
    if method == "tl_cache":
        from circuitlab.pretrained import to_transformer_lens

        tl = to_transformer_lens(model)
        return None, lambda: tl.run_with_cache(tokens)
    from circuitlab.analysis.patching import logit_diff

    if method == "patching":
        from circuitlab.analysis.patching import activation_patching, sweep_estimate

        corrupt = tokens.roll(1, dims=1)
        return (sweep_estimate(model, *tokens.shape, ["resid_pre"]),
                lambda: activation_patching(model, tokens, corrupt, logit_diff(1, 2), "resid_pre", progress=False))
    if method == "eap":
        from circuitlab.analysis.edges.scoring import edge_estimate, edge_scores

        corrupt = tokens.roll(1, dims=1)
        return (edge_estimate(model, *tokens.shape, method="eap"),
                lambda: edge_scores(model, tokens, corrupt, logit_diff(1, 2), method="eap", progress=False))
    if method == "causal_tracing":
        from circuitlab.analysis.patching.causal_tracing import causal_trace, trace_estimate

        subject = (1, 3)
        est = trace_estimate(model, T, runs=10)
        return est, lambda: causal_trace(model, tokens[0], subject, answer=1, progress=False)
    if method == "graph":
        from circuitlab.graphs import attribute
        from circuitlab.graphs.attribution import estimate_graph

        return (lambda: estimate_graph(model, tc, tokens[0], max_feature_nodes=nodes)), lambda: attribute(model, tc, tokens[0], max_feature_nodes=nodes)
    if method == "sae_step":
        return _sae_step(model, tokens, dtype)
    if method == "tuned_lens":
        from circuitlab.analysis.lens.tuned import lens_estimate, train_tuned_lens

        batch = tokens.repeat(4, 1)
        return lens_estimate(model, *batch.shape, steps=3), lambda: train_tuned_lens(model, batch, steps=3)
    raise SystemExit(f"unknown method {method}")


def _sae_step(model, tokens, dtype):
    """One step of a TopK transcoder at the published width on random activations (batch 4,096)."""
    import torch

    from _shapes import K, WIDTHS
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig, dictionary_step_estimate

    d = model.cfg.d_model
    width = next((w for s, w in WIDTHS.items() if _shape_of(model) == s), 16 * d)
    hook = "blocks.0.ln2.hook_normalized"

    class Random:
        widths = {hook: d}

        def chunk(self, index, split="train"):
            return {hook: torch.randn(8192, d, generator=torch.Generator().manual_seed(index))}

        def describe(self):
            return {"random": d}

    cfg = DictionaryConfig("topk", d_in=d, d_sae=width, k=K, hook_name=hook)
    train = DictTrainConfig(batch_size=4096, steps=2)
    trainer = DictionaryTrainer([cfg], train, ActivationStore(Random(), 4096))
    batch = trainer.store.next_batch()
    est = dictionary_step_estimate([cfg], 4096)
    return est, lambda: trainer.train_step(batch)


def _shape_of(model) -> str | None:
    from _shapes import HF_CONFIGS

    for name, hf in HF_CONFIGS.items():
        if hf.get("n_embd", hf.get("hidden_size")) == model.cfg.d_model:
            return name
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["gpt2-small"], help="gpt2-small qwen3-0.6b llama-3.2-1b gemma-2-2b")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), help=" ".join(METHODS))
    ap.add_argument("--peers", action="store_true", help="also the peers: HF forward, TransformerLens cache")
    ap.add_argument("--pos", type=int, default=64, help="prompt tokens (default 64)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (the rest of the shape kept)")
    ap.add_argument("--nodes", type=int, default=7500, help="the graph's feature nodes (default 7,500)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--storage", default=None, help="hold the weights in this dtype (bfloat16), float32 arithmetic")
    ap.add_argument("--quick", action="store_true", help="16 tokens, 500 feature nodes, no peers")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--one", nargs=2, metavar=("SHAPE", "METHOD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.pos, args.nodes = 16, 500
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.pos, args.layers, args.nodes, args.device,
                                 args.dtype, args.storage)))
        return
    rows = []
    load = open("/proc/loadavg").read().split()[:3]
    for shape in args.shapes:
        for method in args.methods + ([PEERS[m] for m in args.methods if m in PEERS] if args.peers else []):
            cmd = [sys.executable, __file__, "--one", shape, method, "--pos", str(args.pos), "--nodes",
                   str(args.nodes), "--device", args.device, "--dtype", args.dtype]
            if args.layers:
                cmd += ["--layers", str(args.layers)]
            if args.storage:
                cmd += ["--storage", args.storage]
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
            if r.returncode != 0:
                row = {"shape": shape, "method": method, "error": r.stderr.strip().splitlines()[-1:]}
            else:
                row = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append(row)
            est = row.get("estimate_mib")
            ratio = f"{est / row['peak_mib']:.2f}" if est and row.get("peak_mib") else "-"
            secs = f"  estimated {row['estimate_seconds']:.1f} s" if row.get("estimate_seconds") else ""
            print(f"{shape:14s} {method:15s} " + (f"{row['seconds']:8.2f} s  peak {row['peak_mib']:8.0f} MiB  "
                                                   f"estimate {est or 0:8.0f} MiB  (est/peak {ratio}); "
                                                   f"process peak {row.get('process_peak_mib', 0):,.0f} MiB"
                                                   if "seconds" in row else f"error: {row['error']}"), flush=True)
    print(f"load before: {' '.join(load)}; after: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    if args.out:
        Path(args.out).write_text(json.dumps({"load": load, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
