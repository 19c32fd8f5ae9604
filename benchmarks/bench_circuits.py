"""Edge scores against auto-circuit on the same weights and prompts, and exact batched edge patching
against a one-edge-at-a-time loop (the ACDC way). Prints agreement and time ratios (same run, same load).

    PYTHONPATH=src python benchmarks/bench_circuits.py [--layers 2 --d-model 128 --heads 4 --batch 16 --pos 20]
    PYTHONPATH=src python benchmarks/bench_circuits.py --scale [--batch 8 --pos 32]

--scale: a GPT-2-small-shaped model (12 layers x 12 heads, d_model 768, d_mlp 3072, GPT-2's 50257-token
vocabulary; random weights, ~32k edges): EAP and EAP-IG on every edge, each in a fresh process, with
wall time and the process's peak resident memory (the issue's bound: 8 GiB).

Conventions: auto-circuit's EAP score is the gradient of −metric (its loss) with respect to the edge mask,
so ours (the estimated change of the metric) is minus its score; its IG variant sums the mask gradients
at n + 1 mask values 0, 1/n, ..., 1 without dividing, ours averages n right-Riemann points.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import helpers  # noqa: E402

from circuitlab import ModelConfig, Transformer  # noqa: E402
from circuitlab.analysis.edges import EdgeGraph, edge_scores, graph_forward  # noqa: E402
from circuitlab.analysis.edges.scoring import per_copy, reference  # noqa: E402
from circuitlab.analysis.patching import logit_diff  # noqa: E402
from circuitlab.pretrained.tl_reference import to_transformer_lens  # noqa: E402


def timed(fn, repeats=3):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _auto_circuit_on_tl3() -> None:
    """auto-circuit 1.0.1 imports TransformerLens 2's module path for the KV cache; TL 3 renamed it.
    auto-circuit only uses the class for type hints and optional caching, so the renamed class stands in."""
    import types

    import transformer_lens
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    if not hasattr(transformer_lens, "HookedTransformerKeyValueCache"):
        transformer_lens.HookedTransformerKeyValueCache = TransformerLensKeyValueCache

    shim = types.ModuleType("transformer_lens.past_key_value_caching")
    shim.HookedTransformerKeyValueCache = TransformerLensKeyValueCache
    sys.modules.setdefault("transformer_lens.past_key_value_caching", shim)


def auto_circuit_scores(tl_model, clean, corrupt, answer, wrong, ig_samples=None):
    _auto_circuit_on_tl3()
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    model = patchable_model(tl_model, factorized=True, slice_output="last_seq", separate_qkv=True, device=torch.device("cpu"))
    data = PromptDataset(list(clean), list(corrupt), [a.view(1) for a in answer], [w.view(1) for w in wrong])
    loader = PromptDataLoader(data, seq_len=None, diverge_idx=0, batch_size=len(clean))

    def run():
        kw = {"mask_val": 0.0} if ig_samples is None else {"integrated_grad_samples": ig_samples}
        return mask_gradient_prune_scores(model, loader, None, grad_function="logit", answer_function="avg_diff", **kw)
    return model, run


def our_name(ac_src: str, ac_dest: str) -> tuple[str, str]:
    def node(n):
        if n == "Resid Start":
            return "input"
        if n.startswith("MLP "):
            return f"MLP{n[4:]}"
        l, h = n[1:].split(".")[:2]
        return f"L{l}H{h}"
    if ac_dest == "Resid End":
        reader = "logits"
    elif ac_dest.startswith("MLP "):
        reader = f"MLP{ac_dest[4:]}.in"
    else:
        l, h, kind = ac_dest[1:].split(".")
        reader = f"L{l}H{h}.{kind.lower()}"
    return node(ac_src), reader


GPT2_SMALL = dict(n_layers=12, d_model=768, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # Linux: KiB


def scale_child(method: str, batch: int, pos: int, steps: int, shape: dict) -> dict:
    """One method on a fresh GPT-2-small-shaped model, in this (fresh) process: seconds and peak memory."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", **shape)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    V = shape["d_vocab"]
    clean, corrupt = torch.randint(0, V, (batch, pos), generator=gen), torch.randint(0, V, (batch, pos), generator=gen)
    metric = logit_diff(torch.randint(0, V, (batch,), generator=gen), torch.randint(0, V, (batch,), generator=gen))
    with torch.no_grad():
        model(clean)
    before = peak_rss_gib()
    t0 = time.perf_counter()
    scores = edge_scores(model, clean, corrupt, metric, method=method, steps=steps, progress=False)
    seconds = time.perf_counter() - t0
    return {"method": method, "seconds": seconds, "peak_gib": peak_rss_gib(), "peak_before_gib": before,
            "n_edges": scores.graph.n_edges, "graph": scores.graph.summary(),
            "weights_gib": sum(p.numel() for p in model.parameters()) * 4 / 2 ** 30,
            "finite": bool(torch.isfinite(scores.scores).all())}


def run_scale_child(method: str, batch: int, pos: int, steps: int, shape: dict | None = None) -> dict:
    """scale_child in a fresh interpreter, so that the peak memory is this method's alone."""
    spec = json.dumps({"method": method, "batch": batch, "pos": pos, "steps": steps, "shape": shape or GPT2_SMALL})
    out = subprocess.run([sys.executable, __file__, "--scale-child", spec], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def scale(args) -> None:
    print(f"GPT-2-small shape (random weights), batch {args.batch} x {args.pos} tokens, "
          f"{torch.get_num_threads()} threads")
    for method in ("eap", "eap-ig"):
        r = run_scale_child(method, args.batch, args.pos, args.steps)
        extra = f" ({args.steps} steps)" if method == "eap-ig" else ""
        print(f"{method}{extra}: {r['graph']}; {r['seconds']:.1f} s, peak resident memory {r['peak_gib']:.2f} GiB "
              f"(weights {r['weights_gib']:.2f} GiB; {r['peak_before_gib']:.2f} GiB before scoring); "
              f"scores finite: {r['finite']}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--scale-child":
        print(json.dumps(scale_child(**json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=None, help="prompts (default 16; 8 with --scale)")
    ap.add_argument("--pos", type=int, default=None, help="tokens per prompt (default 20; 32 with --scale)")
    ap.add_argument("--attn-only", action="store_true")
    ap.add_argument("--no-exact", action="store_true", help="skip exact batched vs one edge at a time")
    ap.add_argument("--scale", action="store_true", help="GPT-2-small-sized graph: time and peak memory")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG steps for --scale")
    args = ap.parse_args()
    if args.scale:  # defaults for the big model: a short batch
        args.batch, args.pos = args.batch or 8, args.pos or 32
        scale(args)
        return
    args.batch, args.pos = args.batch or 16, args.pos or 20
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                                  d_vocab=512, n_ctx=64, attn_only=args.attn_only)
    model = helpers.random_model(cfg, scale=2.0).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 512, (args.batch, args.pos), generator=gen)
    corrupt = torch.randint(0, 512, (args.batch, args.pos), generator=gen)
    answer, wrong = torch.randint(0, 512, (args.batch,), generator=gen), torch.randint(0, 512, (args.batch,), generator=gen)
    metric = logit_diff(answer, wrong)
    graph = EdgeGraph.of(model)
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"{'attention-only' if args.attn_only else 'MLPs'}; {graph.summary()}; batch {args.batch} x {args.pos}")

    tl = to_transformer_lens(model)
    tl.set_use_attn_result(True)
    tl.set_use_split_qkv_input(True)
    if not args.attn_only:  # TransformerLens refuses the MLP-input hook on an attention-only model
        tl.set_use_hook_mlp_in(True)
    ac_model, ac_eap = auto_circuit_scores(tl, clean, corrupt, answer, wrong)
    t_ac, ac = timed(ac_eap)
    t_ours, ours = timed(lambda: edge_scores(model, clean, corrupt, metric, method="eap", progress=False))
    diffs = []
    for edge in ac_model.edges:
        s, r = our_name(edge.src.name, edge.dest.name)
        diffs.append(abs(-float(edge.prune_score(ac)) - ours.score(s, r)))
    print(f"EAP: {len(diffs)} edges (ours {graph.n_edges}); max |ours - (-auto-circuit)| = {max(diffs):.2e}; "
          f"largest |score| {float(ours.scores.abs().max()):.3g}")
    print(f"EAP time: ours {t_ours * 1e3:.0f} ms, auto-circuit {t_ac * 1e3:.0f} ms -> {t_ac / t_ours:.1f}x")
    _, ac_ig = auto_circuit_scores(tl, clean, corrupt, answer, wrong, ig_samples=5)
    t_ac_ig, _ = timed(ac_ig)
    t_ig, _ = timed(lambda: edge_scores(model, clean, corrupt, metric, method="eap-ig", steps=5, ig_path="edges",
                                        progress=False))
    print(f"EAP-IG (5 steps, edge path) time: ours {t_ig * 1e3:.0f} ms, auto-circuit (6 mask values) "
          f"{t_ac_ig * 1e3:.0f} ms -> {t_ac_ig / t_ig:.1f}x")

    if args.no_exact:
        return
    t_exact, exact = timed(lambda: edge_scores(model, clean, corrupt, metric, method="exact", progress=False), 1)
    with torch.no_grad():
        run = graph_forward(model, graph, clean)
        ref = reference(model, graph, clean, corrupt, "counterfactual", run)
        base = float(per_copy(metric, run.logits)[0])

        def loop():
            out = torch.empty(graph.n_edges, dtype=torch.float64)
            for i, (s, r) in enumerate(graph.edge_pairs.tolist()):
                mask = torch.zeros(1, len(graph.sources), len(graph.readers))
                mask[0, s, r] = 1
                out[i] = float(per_copy(metric, graph_forward(model, graph, clean, ref=ref, mask=mask).logits)[0]) - base
            return out
        t_loop, looped = timed(loop, 1)
    print(f"exact: batched {t_exact:.2f} s, one edge at a time {t_loop:.2f} s -> {t_loop / t_exact:.1f}x; "
          f"max |difference| {float((looped - exact.scores).abs().max()):.1e}")


if __name__ == "__main__":
    main()
