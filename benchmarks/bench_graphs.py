"""Attribution graphs against circuit-tracer 0.5.0: equal output, then time and memory.

circuit-tracer pins TransformerLens 2.16, transformers <= 4.57.3, nnsight 0.6.1 and numpy < 2, so it
runs in its own virtual environment, built here on first use (~/.cache/circuitlab-peers/circuit-tracer;
`--setup` only builds it). Both sides get:

- the same model: a circuitlab Transformer (rotary positions, or --positional learned; LayerNorm, GELU, biases),
  handed to circuit-tracer as a TransformerLens config + state dict (circuitlab.pretrained.to_transformer_lens);
  ours with circuit-tracer's token nodes (token_nodes="W_E": W_E[token] alone, the same as our default on rotary
  models; on learned positions our default adds W_pos[pos]);
- the same transcoders: ReLU skip transcoders reading blocks.L.hook_resid_mid and writing
  blocks.L.hook_mlp_out, written in circuit-tracer's layout (config.yaml + layer_{i}.safetensors);
- the same prompt: token 0 (the special token) then random tokens; both treat position 0 as the
  attention sink (no features, no error node: ours with bos=True).

Checked: the same active features in the same node order, adjacency equal (max |difference| <= 1e-4 of
max |A|), replacement and completeness scores equal, the same pruned node set. Timed: attribution
(+ pruning and scores), median of --repeats, same number of torch threads; peak memory (VmHWM) of each
side's process against the dense adjacency's size.

Timed in --pairs alternating pairs (ours then circuit-tracer, then circuit-tracer then ours, ...), each run in
its own process, with the 1-minute load printed before and after each, so that a load that rises or falls
during the benchmark falls on both sides; the claim is the smallest per-pair ratio. --busy N starts N
processes that each keep a core busy for the whole benchmark (a fixed background load). circuit-tracer runs on
--threads torch threads; ours starts at most there and re-decides between backward passes
(perf.ThreadGovernor); --fixed-threads holds ours at --threads too.

    PYTHONPATH=src python benchmarks/bench_graphs.py                      # 64 tokens, 4 layers, 3 pairs
    PYTHONPATH=src python benchmarks/bench_graphs.py --busy 1             # the same with the other core busy
    PYTHONPATH=src python benchmarks/bench_graphs.py --positional learned # GPT-2-style learned positions
    PYTHONPATH=src python benchmarks/bench_graphs.py --quick              # 16 tokens, 2 layers, 1 pair
    PYTHONPATH=src python benchmarks/bench_graphs.py --setup              # only build circuit-tracer's venv
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PEER_DIR = Path(os.environ.get("CIRCUITLAB_PEERS", Path.home() / ".cache" / "circuitlab-peers")) / "circuit-tracer"
PEER_PINS = ["circuit-tracer==0.5.0", "transformer-lens==2.16.1", "transformers<=4.57.3", "nnsight==0.6.1", "numpy<2",
             "pyarrow<20"]  # a newer pyarrow (through datasets) needs numpy 2


def peer_python() -> Path:
    """circuit-tracer's venv (built on first use: torch as in ours, then its pinned stack)."""
    py = PEER_DIR / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import circuit_tracer"], capture_output=True).returncode == 0:
        return py
    print(f"building circuit-tracer's virtual environment in {PEER_DIR} (a few minutes, once)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_DIR)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [f"torch=={torch.__version__.split('+')[0]}"], check=True)
    subprocess.run(pip + PEER_PINS, check=True)
    return py


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build(args):
    """The model, its transcoders and the prompt (float32)."""
    from circuitlab import ModelConfig, Transformer
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    from circuitlab.graphs import Transcoders

    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.d_model // 64, d_head=64,
                      d_mlp=4 * args.d_model, d_vocab=args.vocab, n_ctx=128,
                      positional=getattr(args, "positional", "rotary"), norm="layernorm",
                      mlp="gelu", bias=True)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".b", ".bias")):
                p.normal_(0, 0.02)
            elif name.endswith(".w"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    dicts = []
    for layer in range(cfg.n_layers):
        c = DictionaryConfig("relu", d_in=cfg.d_model, d_sae=args.d_sae, hook_name=f"blocks.{layer}.hook_resid_mid",
                             out_hook_name=f"blocks.{layer}.hook_mlp_out", skip=True)
        d = SparseDictionary(c, seed=layer)
        g = torch.Generator().manual_seed(100 + layer)
        with torch.no_grad():
            d.W_enc.copy_(torch.randn(d.W_enc.shape, generator=g) / cfg.d_model**0.5)
            d.W_dec.mul_(0.2)
            d.b_dec.copy_(0.02 * torch.randn(cfg.d_model, generator=g))
            d.W_skip.copy_(0.02 * torch.randn(d.W_skip.shape, generator=g))
        dicts.append(d)
    tokens = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.randint(1, cfg.d_vocab, (args.tokens - 1,), generator=torch.Generator().manual_seed(1))])
    # Encoder biases such that about args.active features fire per token and layer (random weights have no
    # natural sparsity): the (1 - active / d_sae) quantile of the pre-activations on the prompt, per layer.
    _, cache = model.run_with_cache(tokens[None], names_filter=[d.cfg.hook_name for d in dicts])
    with torch.no_grad():
        for d in dicts:
            pre = cache[d.cfg.hook_name][0] @ d.W_enc
            d.b_enc.fill_(-float(pre.flatten().quantile(1 - args.active / args.d_sae)))
    return model, Transcoders.per_layer(model, dicts), dicts, tokens


def write_peer_inputs(folder: Path, model, dicts, tokens, args) -> None:
    """TransformerLens config + state dict, circuit-tracer's transcoder layout, the run's spec."""
    from circuitlab.pretrained import to_transformer_lens

    tl = to_transformer_lens(model)
    tl_cfg = {k: getattr(tl.cfg, k) for k in ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab",
                                               "d_mlp", "act_fn", "eps", "normalization_type", "use_attn_scale",
                                               "positional_embedding_type", "rotary_dim", "rotary_base",
                                               "rotary_adjacent_pairs", "default_prepend_bos")}
    tl_cfg["dtype"] = "float32"
    state = {k: v.contiguous() for k, v in tl.state_dict().items()}
    save_file(state, str(folder / "tl_model.safetensors"))
    tc_dir = folder / "transcoders"
    tc_dir.mkdir()
    for layer, d in enumerate(dicts):  # circuit-tracer: W_enc/W_dec [d_sae, d_model]; skip = x @ W_skip.T
        save_file({"W_enc": d.W_enc.detach().T.contiguous(), "W_dec": d.W_dec.detach().contiguous(),
                   "b_enc": d.b_enc.detach().contiguous(), "b_dec": d.b_dec.detach().contiguous(),
                   "W_skip": d.W_skip.detach().T.contiguous()}, str(tc_dir / f"layer_{layer}.safetensors"))
    names = "\n".join(f"  - layer_{i}.safetensors" for i in range(len(dicts)))
    (tc_dir / "config.yaml").write_text("model_kind: transcoder_set\nscan: circuitlab-bench\n"
                                        "feature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\n"
                                        f"transcoders:\n{names}\n")
    spec = {"tl_config": tl_cfg, "tokens": tokens.tolist(), "threads": args.threads, "repeats": args.repeats,
            "max_n_logits": 10, "desired_logit_prob": 0.95, "batch_size": args.peer_batch, "max_feature_nodes": None,
            "node_threshold": 0.8, "edge_threshold": 0.98}
    (folder / "spec.json").write_text(json.dumps(spec))


def ours_child(folder: str, batch: int, repeats: int, threads: int) -> None:
    """Our side in a fresh process (so its peak memory is its own): same inputs as the peer's."""
    torch.set_num_threads(threads)
    args = argparse.Namespace(**json.loads((Path(folder) / "build.json").read_text()))
    model, tc, _, tokens = build(args)
    from circuitlab.graphs import attribute

    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        graph = attribute(model, tc, tokens, bos=True, batch_size=batch, token_nodes="W_E")
        seconds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    pruned = graph.prune(0.8, 0.98)
    scores = graph.scores()
    prune_s = time.perf_counter() - t0
    from circuitlab.graphs import neuronpedia_json

    viewer_kb = len(json.dumps(neuronpedia_json(graph, pruned)).encode()) / 1024
    save_file({"adjacency": graph.adjacency.contiguous(), "active_features": graph.active_features.contiguous(),
               "node_mask": pruned.node_mask.contiguous(), "logit_tokens": graph.logit_tokens.contiguous()},
              str(Path(folder) / "ours.safetensors"))
    (Path(folder) / "ours.json").write_text(json.dumps({
        "seconds": seconds, "prune_seconds": prune_s, **scores, "peak_rss_mb": peak_mb(), "info": graph.info,
        "viewer_kb": viewer_kb, "pruned_nodes": int(pruned.node_mask.sum()), "pruned_edges": int(pruned.edge_mask.sum())}))


def run_side(cmd: list[str], env: dict, name: str) -> tuple[float, float]:
    """One side's run in its own process: (load before, load after); exits with its error if it failed."""
    before = os.getloadavg()[0]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    return before, os.getloadavg()[0]


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark graph's shape (what build() reads), shared with bench_graph_heads.py."""
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-sae", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--positional", choices=["rotary", "learned"], default="rotary",
                   help="learned: GPT-2-style positions (ours with circuit-tracer's token nodes, W_E alone)")
    p.add_argument("--active", type=int, default=24, help="about this many features fire per token and layer")
    p.add_argument("--batch", type=int, default=256, help="our target rows per backward pass")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", action="store_true", help="only build circuit-tracer's venv")
    add_shape_arguments(p)
    p.add_argument("--peer-batch", type=int, default=512, help="circuit-tracer's batch_size (its default)")
    p.add_argument("--pairs", type=int, default=3, help="alternating pairs of runs (one attribution each)")
    p.add_argument("--repeats", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fixed-threads", action="store_true", help="hold ours at --threads (no re-decision)")
    p.add_argument("--busy", type=int, default=0, help="processes that each keep a core busy throughout")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return ours_child(args.child, args.batch, args.repeats, args.threads)
    py = peer_python()
    if args.setup:
        print(f"circuit-tracer ready: {py}")
        return
    if args.quick:
        args.tokens, args.layers, args.d_model, args.d_sae, args.pairs = 16, 2, 128, 512, 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-graphs-") as tmp:
            compare(args, py, Path(tmp))
    finally:
        for s in spinners:
            s.kill()


def compare(args, py: Path, folder: Path) -> None:
    model, tc, dicts, tokens = build(args)
    write_peer_inputs(folder, model, dicts, tokens, args)
    build_args = {k: getattr(args, k) for k in ("tokens", "layers", "d_model", "d_sae", "vocab", "active",
                                                "positional")}
    (folder / "build.json").write_text(json.dumps(build_args))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    ours_env = {**env, "CIRCUITLAB_THREADS": str(args.threads)} if args.fixed_threads else env
    peer_cmd = [str(py), str(Path(__file__).with_name("_graphs_peer.py")), str(folder)]
    ours_cmd = [sys.executable, __file__, "--child", str(folder), "--batch", str(args.batch), "--repeats",
                str(args.repeats), "--threads", str(args.threads)]
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.positional} positions, transcoders d_sae "
          f"{args.d_sae}; prompt {args.tokens} tokens; circuit-tracer on {args.threads} torch threads, ours "
          f"{'fixed at' if args.fixed_threads else 'at most'} {args.threads}; background: {args.busy} busy "
          f"process(es); {os.cpu_count()} cores", flush=True)
    ratios = []
    for pair in range(args.pairs):
        order = [("ours", ours_cmd, ours_env), ("circuit-tracer", peer_cmd, env)]
        loads = {}
        for name, cmd, e in order if pair % 2 == 0 else order[::-1]:
            loads[name] = run_side(cmd, e, name)
        oj, pj = json.loads((folder / "ours.json").read_text()), json.loads((folder / "peer.json").read_text())
        t_ours, t_peer = statistics.median(oj["seconds"]), statistics.median(pj["seconds"])
        ratios.append(t_peer / t_ours)
        first = "ours" if pair % 2 == 0 else "circuit-tracer"
        print(f"pair {pair + 1} ({first} first): ours {t_ours:.2f} s (load {loads['ours'][0]:.1f} -> "
              f"{loads['ours'][1]:.1f}; threads {oj['info'].get('threads')}, changed {oj['info'].get('thread_changes')}"
              f" times), circuit-tracer {t_peer:.2f} s (load {loads['circuit-tracer'][0]:.1f} -> "
              f"{loads['circuit-tracer'][1]:.1f}) -> {ratios[-1]:.2f}x", flush=True)
    pt, ot = load_file(str(folder / "peer.safetensors")), load_file(str(folder / "ours.safetensors"))
    same_features = torch.equal(pt["active_features"], ot["active_features"])
    same_logits = torch.equal(pt["logit_tokens"], ot["logit_tokens"])
    a, b = ot["adjacency"].double(), pt["adjacency"].double()
    rel = float((a - b).abs().max() / b.abs().max()) if a.shape == b.shape else float("inf")
    same_nodes = torch.equal(pt["node_mask"], ot["node_mask"])
    n = a.shape[0]
    dense_mb = n * n * 4 / 2**20
    print(f"{len(ot['active_features'])} active features, {n} nodes")
    print(f"same active features / node order: {same_features}; same logit targets: {same_logits}")
    print(f"adjacency: max |ours - circuit-tracer| / max |A| = {rel:.2e} (target <= 1e-4)")
    print(f"replacement score: ours {oj['replacement']:.6f}, circuit-tracer {pj['replacement']:.6f}; completeness: "
          f"ours {oj['completeness']:.6f}, circuit-tracer {pj['completeness']:.6f}")
    print(f"pruned node set equal: {same_nodes} ({int(ot['node_mask'].sum())} vs {int(pt['node_mask'].sum())} nodes)")
    print(f"attribution time, per pair: {', '.join(f'{r:.2f}x' for r in ratios)}; smallest {min(ratios):.2f}x, "
          f"median {statistics.median(ratios):.2f}x (target >= 3x in every pair)")
    print(f"pruning + scores: ours {oj['prune_seconds']:.2f} s, circuit-tracer {pj['prune_seconds']:.2f} s")
    print(f"peak RSS: ours {oj['peak_rss_mb']:.0f} MB, circuit-tracer {pj['peak_rss_mb']:.0f} MB; dense adjacency "
          f"{dense_mb:.0f} MB (fp32); our attribution's own peak (graph.info peak_mb) {oj['info']['peak_mb']:.0f} MB")
    print(f"pruned graph ({oj['pruned_nodes']} nodes, {oj['pruned_edges']} edges) as Neuronpedia JSON: "
          f"{oj['viewer_kb']:.0f} KB")


if __name__ == "__main__":
    main()
