"""Head loadings and QK attributions against the graph's own time, on bench_graphs.py's 64-token graph.

The model, transcoders and prompt are bench_graphs.build's (4 layers, d_model 256, 4 heads, ReLU skip
transcoders of 2,048 features per layer, ~24 active per token and layer, token 0 as the sink). Timed, in one
process with the same threads: the graph (attribute), the head loadings of the pruned graph's cross-position
edges, and the QK attributions of the top --qk-heads (head, query, key) places; each as a fraction of the
graph's time. Checked on the way: the loadings add up to their edges and the terms to the model's scores
(float32 model: to rounding).

    PYTHONPATH=src python benchmarks/bench_graph_heads.py               # 64 tokens, 4 layers
    PYTHONPATH=src python benchmarks/bench_graph_heads.py --quick       # 16 tokens, 2 layers
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from bench_graphs import add_shape_arguments, build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(p)
    p.add_argument("--qk-heads", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.quick:
        args.tokens, args.layers, args.d_model, args.d_sae = 16, 2, 128, 512
    torch.set_num_threads(args.threads)
    from circuitlab.graphs import attribute
    from circuitlab.graphs.heads import head_loadings, strongest_heads
    from circuitlab.graphs.qk import qk_attributions

    model, tc, _, tokens = build(args)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    graph = attribute(model, tc, tokens, batch_size=args.batch, bos=True)
    t_graph = time.perf_counter() - t0
    pruned = graph.prune()                       # GraphOptions' thresholds
    t0 = time.perf_counter()
    graph.loadings = head_loadings(model, tc, graph, pruned, batch_size=args.batch)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    heads = strongest_heads(graph, args.qk_heads)
    qks = qk_attributions(model, tc, graph.tokens, [(h["layer"], h["head"], h["query_pos"], h["key_pos"]) for h in heads],
                          bos=True)
    t_qk = time.perf_counter() - t0
    rem = float(graph.loadings.remainder.abs().max() / graph.loadings.edge.abs().max())
    err = max(abs(r.terms_sum - r.raw_score) / max(1.0, abs(r.raw_score)) for r in qks)
    print(f"{args.tokens} tokens, {args.layers} layers: {graph.n_nodes} nodes, {int(pruned.edge_mask.sum())} pruned "
          f"edges, {len(graph.loadings)} cross-position; load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end; {args.threads} threads")
    print(f"graph (attribute)          {t_graph:7.2f} s")
    print(f"head loadings (pruned)     {t_load:7.2f} s  = {t_load / t_graph:.3f} of the graph  "
          f"(max |remainder| {rem:.1e} of max |edge|)")
    print(f"QK, top {len(qks)} heads         {t_qk:7.2f} s  = {t_qk / t_graph:.3f} of the graph  "
          f"(max |terms - score| {err:.1e}; {max(len(r.query_parts) for r in qks)} parts per side at most)")
    for r in qks[:3]:
        print("  " + r.summary(1)[0])


if __name__ == "__main__":
    main()
