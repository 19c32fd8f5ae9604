"""KernelSHAP and LIME speed: ours (coalitions deduplicated, batched forward passes) against Captum 0.9's
KernelShap and Lime on the same model, tokens, metric, baseline, samples and seed.

    .venv/bin/python benchmarks/bench_shap_lime.py [--samples 512 --seq 32 --repeats 3 --threads 1]

Same model as bench_attribution.py (GPT-2 style, 4 layers, d_model 256, vocab 4096), tokens 1 x seq, the
metric a logit difference at the last position, the mean-embedding baseline, one feature per position.
Captum runs with its default perturbations_per_eval=1 (one forward per coalition) and batched
(perturbations_per_eval = the rows our chunk holds). Captum's surrogates need sklearn; without it a
least-squares stand-in of the same algorithm is used (its fit is a few milliseconds either way) and LIME
is compared at alpha=0. Runs alternate (round robin) so load falls on both; medians of the repeats.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import round_robin  # noqa: E402


class LeastSquares:
    """Captum's interpretable-model interface, solved as sklearn's LinearRegression does (weighted centring,
    least-norm lstsq): the stand-in where sklearn is missing."""

    def fit(self, loader):
        z, y, w = (t.double().numpy() for t in next(iter(loader)))
        zm, ym = w @ z / w.sum(), w @ y / w.sum()
        root = np.sqrt(w)
        self.coef = np.linalg.lstsq(root[:, None] * (z - zm), root * (y - ym), rcond=None)[0]

    def representation(self):
        return torch.tensor(self.coef, dtype=torch.float32)[None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from captum.attr import KernelShap, Lime

    from circuitlab import ModelConfig, Transformer
    from circuitlab.analysis.input_attribution import (_run_embeds, baseline_embeddings, kernel_shap, lime,
                                                       logit_metric, rows_per_chunk)

    try:
        import sklearn  # noqa: F401
        have_sklearn = True
    except ImportError:
        have_sklearn = False
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", n_layers=4, d_model=256, n_heads=8, d_mlp=1024,
                                                d_vocab=4096, n_ctx=256)).eval()
    T, n = args.seq, args.samples
    tokens = torch.randint(0, 4096, (T,))
    metric = logit_metric(7, 3, T - 1)
    x = model.token_embeddings(tokens).detach()[None]
    base = baseline_embeddings(model, tokens, "mean")[None]
    chunk = min(n, rows_per_chunk(model, T, False))
    alpha = 0.01 if have_sklearn else 0.0

    ks = KernelShap(lambda e: metric(_run_embeds(model, tokens, e)))
    if not have_sklearn:
        ks.interpretable_model = LeastSquares()

    def present(p):
        return metric(_run_embeds(model, tokens, torch.where(p[..., None].bool(), x, base)))

    lm = Lime(present) if have_sklearn else Lime(present, interpretable_model=LeastSquares())
    mask = torch.arange(T)[None, :, None]
    out: dict = {}

    def captum_shap(ppe):
        def run():
            torch.manual_seed(0)
            with torch.no_grad():
                out["captum_shap"] = ks.attribute(x, baselines=base, feature_mask=mask, n_samples=n,
                                                  perturbations_per_eval=ppe)[0, :, 0]
        return run

    def captum_lime(ppe):
        def run():
            torch.manual_seed(0)
            with torch.no_grad():
                out["captum_lime"] = lm.attribute(torch.ones(1, T), baselines=torch.zeros(1, T), n_samples=n,
                                                  perturbations_per_eval=ppe)[0]
        return run

    def ours_shap():
        out["shap"] = kernel_shap(model, tokens, target=7, foil=3, samples=n, seed=0, progress=False)

    def ours_lime():
        out["lime"] = lime(model, tokens, target=7, foil=3, samples=n, seed=0, alpha=alpha, progress=False)

    times = round_robin({"ours shap": ours_shap, "captum shap": captum_shap(1), "captum shap batched":
                         captum_shap(chunk), "ours lime": ours_lime, "captum lime": captum_lime(1),
                         "captum lime batched": captum_lime(chunk)}, args.repeats)
    print(f"{n} coalitions, 1 x {T} tokens, {torch.get_num_threads()} thread(s); Captum's surrogate: "
          f"{'sklearn (its default)' if have_sklearn else 'least-squares stand-in (no sklearn)'}; "
          f"load {open('/proc/loadavg').read().split()[0]}")
    for method in ("shap", "lime"):
        diff = float((out[method].scores - out[f"captum_{method}"]).abs().max())
        scale = float(out[method].scores.abs().max())
        print(f"{method}: max |ours - Captum| {diff:.1e} (scores up to {scale:.2g}); distinct coalitions run: "
              f"{out[method].extra['evaluated']} of {n}")
        ours = times[f"ours {method}"]
        print(f"  circuitlab                          {1000 * ours:9.1f} ms")
        for label, key in (("Captum (one forward per coalition)", f"captum {method}"),
                           (f"Captum (perturbations_per_eval={chunk})", f"captum {method} batched")):
            print(f"  {label:<36}{1000 * times[key]:9.1f} ms   ratio {times[key] / ours:.2f}x")


if __name__ == "__main__":
    main()
