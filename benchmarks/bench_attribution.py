"""Input attribution speed: batched integrated gradients against Captum, batched occlusion against a loop.

    .venv/bin/python benchmarks/bench_attribution.py [--steps 32 --seq 64 --repeats 5 --threads 1]

Same model (GPT-2 style, 4 layers, d_model 256, vocab 4096), same tokens, same metric (a logit
difference at the last position), same baseline (zeros), same steps (Gauss-Legendre):
- ours: integrated_gradients(..., steps=n): all n points in one batched forward/backward, through the
  blocks on positions up to the explained one and the unembedding at that position alone, with the
  model's parameters frozen (gradients for the inputs only);
- Captum: IntegratedGradients(forward_func = the model's logits from the token embeddings, the metric
  taken from them).attribute(n_steps=n, method="gausslegendre") with its default internal_batch_size
  (None: all steps in one batch too), and with internal_batch_size=1 (one call per step: a naive loop);
- both with their default steps (ours 32, Captum 50), with the completeness error each reaches.
Ours and Captum's batched run alternate, so load from other processes falls on both; the ratio is the
median of the per-pair ratios. Occlusion: ours (every position replaced in one batched pass) against a
Python loop of single forwards.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def paired(a, b, repeats: int) -> tuple[float, float, float, object, object]:
    """Median times of a and b run alternately, the median of the per-pair ratios t_b / t_a, and outputs."""
    a(), b()  # warm-up
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            start = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - start)
            if fn is a:
                out_a = out
            else:
                out_b = out
    ratio = statistics.median(y / x for x, y in zip(ta, tb))
    return statistics.median(ta), statistics.median(tb), ratio, out_a, out_b


def completeness(attr: torch.Tensor, change: float) -> float:
    return abs(float(attr.sum()) - change) / abs(change)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from captum.attr import IntegratedGradients

    from circuitlab import ModelConfig, Transformer
    from circuitlab.analysis.input_attribution import _run_embeds, integrated_gradients, logit_metric, occlusion

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", n_layers=4, d_model=256, n_heads=8, d_mlp=1024,
                                                d_vocab=4096, n_ctx=256)).eval()
    tokens = torch.randint(0, 4096, (args.seq,))
    metric = logit_metric(7, 3, args.seq - 1)
    x = model.embed(tokens).detach()[None]
    captum = IntegratedGradients(lambda e: metric(_run_embeds(model, tokens, e)))

    def ours_fn(steps):
        return lambda: integrated_gradients(model, tokens, target=7, foil=3, steps=steps)

    def captum_fn(steps, **kw):
        return lambda: captum.attribute(x, baselines=torch.zeros_like(x), n_steps=steps, method="gausslegendre", **kw)

    t_ours, t_cap, ratio, ours, cap = paired(ours_fn(args.steps), captum_fn(args.steps), args.repeats)
    t_loop, _ = timed(captum_fn(args.steps, internal_batch_size=1), max(1, args.repeats // 2))
    diff = float((cap[0].sum(-1) - ours.scores).abs().max())
    print(f"integrated gradients, {args.steps} steps, 1 x {args.seq} tokens (max |ours - Captum| = {diff:.1e})")
    print(f"  circuitlab (batched)           {1000 * t_ours:9.1f} ms")
    print(f"  Captum (all steps batched)     {1000 * t_cap:9.1f} ms   ratio {ratio:.2f}x (median of paired runs)")
    print(f"  Captum (internal_batch_size=1) {1000 * t_loop:9.1f} ms   ratio {t_loop / t_ours:.2f}x")
    d_ours, d_cap, d_ratio, ours_d, cap_d = paired(ours_fn(32), captum_fn(50), args.repeats)
    change = ours_d.metric_value - ours_d.baseline_value
    print(f"defaults: circuitlab 32 steps {1000 * d_ours:.1f} ms (completeness error {ours_d.completeness_error:.1e}), "
          f"Captum 50 steps {1000 * d_cap:.1f} ms (completeness error {completeness(cap_d[0], change):.1e}): "
          f"ratio {d_ratio:.2f}x")

    def loop():
        with torch.no_grad():
            base = float(metric(model(tokens[None]))[0])
            out = []
            for i in range(args.seq):
                e = x.clone()
                e[0, i] = 0
                out.append(base - float(metric(_run_embeds(model, tokens, e))[0]))
            return torch.tensor(out)

    t_occ, occ = timed(lambda: occlusion(model, tokens, target=7, foil=3), args.repeats)
    t_one, ref = timed(loop, max(1, args.repeats // 2))
    print(f"occlusion of every position, 1 x {args.seq} tokens (max diff {float((occ.scores - ref).abs().max()):.1e})")
    print(f"  circuitlab (one batched pass) {1000 * t_occ:9.1f} ms")
    print(f"  loop of single forwards       {1000 * t_one:9.1f} ms   ratio {t_one / t_occ:.2f}x")


if __name__ == "__main__":
    main()
