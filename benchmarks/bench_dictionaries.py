"""Dictionary benchmarks, printed as ratios measured in one run (timings on a shared CPU are noisy).

1. training throughput (activations/s) against SAELens: same activations, architecture, sizes and batch;
   one optimizer step each (SAELens: TrainingSAE.training_forward_pass + backward + Adam). Target ≥ 1.5x.
2. activation generation through the store vs the model's own unhooked forward on the same tokens
   (the store stops the forward after the last hook it needs). Target: overhead ≤ 10%.
3. peak memory (RSS) of training from the on-disk cache at 1x and 10x the tokens: should stay flat.

    PYTHONPATH=src python benchmarks/bench_dictionaries.py [--quick]
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time

import torch


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def training_throughput(arch: str, d_in: int, d_sae: int, k: int, batch: int, steps: int) -> tuple[float, float]:
    from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput

    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.planted import PlantedFeatures
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    planted = PlantedFeatures(n_features=4 * d_in, d=d_in, l0=8, rows_per_chunk=batch * 4)
    batches = [planted.chunk(i)["planted"][:batch] for i in range(4)]
    cfg = DictionaryConfig(arch, d_in=d_in, d_sae=d_sae, k=k if arch == "topk" else None, hook_name="planted")
    ours = DictionaryTrainer([cfg], DictTrainConfig(steps=10**6, batch_size=batch, normalise=False), ActivationStore(planted, batch))
    ours.init_from_data()

    def run_ours():
        for i in range(steps):
            ours.train_step({"planted": batches[i % 4]})

    if arch == "topk":
        theirs = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=k))
    else:
        theirs = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae, l1_coefficient=1.0))
    opt = torch.optim.Adam(theirs.parameters(), lr=1e-3)
    coefs = {name: (c.value if hasattr(c, "value") else c) for name, c in theirs.get_coefficients().items()}
    dead = torch.zeros(d_sae, dtype=torch.bool)

    def run_theirs():
        for i in range(steps):
            out = theirs.training_forward_pass(TrainStepInput(batches[i % 4], coefs, dead, i, False))
            opt.zero_grad()
            out.loss.backward()
            opt.step()

    run_ours(), run_theirs()  # warm up
    t_ours, t_theirs = best_of(run_ours, 3), best_of(run_theirs, 3)
    return steps * batch / t_ours, steps * batch / t_theirs


def generation_overhead(preset: str, hook: str, batch: int, seq: int) -> tuple[float, float]:
    from circuitlab.config import ModelConfig
    from circuitlab.dictionaries.store import ModelActivations
    from circuitlab.model import Transformer

    model = Transformer(ModelConfig.from_preset(preset, d_vocab=4096, n_ctx=seq)).eval()
    tokens = torch.randint(0, 4096, (batch * 4, seq))
    source = ModelActivations(model, [hook], tokens, seq_len=seq, seqs_per_chunk=batch)

    @torch.no_grad()
    def forward():
        model(tokens[:batch])

    def store():
        source.chunk(0)

    forward(), store()
    return best_of(forward, 5), best_of(store, 5)


def peak_memory_child(folder: str, chunks: int, batch: int) -> None:
    """Run in a fresh process: cache `chunks` chunks of planted activations, train through all of them."""
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.planted import PlantedFeatures
    from circuitlab.dictionaries.store import ActivationStore, CachedActivations, cache_activations
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    planted = PlantedFeatures(n_features=1024, d=256, l0=8, rows_per_chunk=batch * 8)
    cache_activations(planted, folder, chunks, progress=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    source = CachedActivations(folder)
    cfg = DictionaryConfig("topk", d_in=256, d_sae=1024, k=16, hook_name="planted")
    steps = chunks * 8
    DictionaryTrainer([cfg], DictTrainConfig(steps=steps, batch_size=batch), ActivationStore(source, batch)).fit(progress=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{before} {peak} {chunks * batch * 8}")


def peak_memory(chunks: int, batch: int) -> tuple[int, int, int]:
    with tempfile.TemporaryDirectory() as folder:
        out = subprocess.run([sys.executable, __file__, "--child", folder, str(chunks), str(batch)],
                             capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        peak_memory_child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    d_in, d_sae, batch, steps = (64, 512, 256, 10) if args.quick else (256, 4096, 1024, 20)
    print(f"torch threads: {torch.get_num_threads()}")
    print("\n1. dictionary training throughput vs SAELens (same activations, sizes, batch) — target >= 1.5x")
    for arch, k in (("topk", 32), ("relu", 0)):
        ours, theirs = training_throughput(arch, d_in, d_sae, k, batch, steps)
        print(f"   {arch:5s} d_in {d_in} d_sae {d_sae} batch {batch}: circuitlab {ours:,.0f} act/s, "
              f"SAELens {theirs:,.0f} act/s  -> {ours / theirs:.2f}x")
    print("\n2. activation generation through the store vs the model's own forward — target overhead <= 10%")
    preset, seq, b = ("gpt2-tiny", 64, 8) if args.quick else ("quick", 128, 16)
    for hook in ("blocks.1.hook_resid_post", "blocks.0.hook_mlp_out"):
        t_model, t_store = generation_overhead(preset, hook, b, seq)
        print(f"   {preset} [{b} x {seq}] {hook}: forward {t_model * 1e3:.1f} ms, store {t_store * 1e3:.1f} ms "
              f"-> overhead {100 * (t_store / t_model - 1):+.0f}%")
    print("\n3. peak memory training from the on-disk cache (fresh process each) — should stay flat")
    rows = []
    for scale in (1, 10):
        before, peak, tokens = peak_memory(4 * scale if not args.quick else 2 * scale, 512)
        rows.append(peak)
        print(f"   {scale:2d}x ({tokens:,} activations): peak RSS {peak / 1024:.0f} MiB (before training {before / 1024:.0f} MiB)")
    print(f"   10x / 1x peak: {rows[1] / rows[0]:.2f}")


if __name__ == "__main__":
    main()
