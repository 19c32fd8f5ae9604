"""Dictionary benchmarks against the issue's targets, measured in one run and printed as ratios.

1. Training throughput (activations/s) against SAELens 6: the same activations, architecture, sizes
   and batch; one optimizer step each (ours: DictionaryTrainer.train_step, with its dead-latent
   bookkeeping and unit-norm decoder; SAELens: TrainingSAE.training_forward_pass + backward + Adam;
   its `use_sparse_activations` mode fails on the CPU in training, so it runs dense), in two states:
   trained (the target, >= 1.5x): both sides start from a dictionary that has learned planted features
   (decoder rows = the true directions, L0 ~ k), the state a run spends most of its steps in, where
   circuitlab's step touches only the kept latents (dictionaries/sparse_ops.py); at init: both start
   from circuitlab's initialisation, where ReLU and JumpReLU fire on ~half the latents and both sides
   do the same dense products.
2. Activation generation through the store (ModelActivations + ActivationStore: the forward up to
   the hook, flattening, the shuffle, the batches) against the model's own forward on the same tokens
   (`model(tokens)` under no_grad). Target: overhead <= 10%. The hook is in the last block, where the
   store runs (almost) the whole model; an early hook would flatter it.
3. Peak memory of training from the on-disk cache at 1x and 10x the tokens, each in a fresh process
   (the peak over the import baseline is what training adds), at a size where the 10x activations
   (fp32, as training uses them) would not fit in this machine's free memory. Target: flat.

Timings alternate between the two sides (round robin, median of the repeats) so that other load on
the machine hits both alike; absolute figures still drop on a busy machine, ratios much less.

    PYTHONPATH=src python benchmarks/bench_dictionaries.py            # full size, ~3 min on 2 idle cores
    PYTHONPATH=src python benchmarks/bench_dictionaries.py --quick    # smoke run, ~30 s
    PYTHONPATH=src python benchmarks/bench_dictionaries.py --crossover --threads 1   # where SPARSE_BELOW comes from
"""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

from _timing import peak_rss_kib, round_robin  # benchmarks/_timing.py (this folder is on sys.path)

SIZES = {  # d_in, d_sae, k, batch, steps per repeat, repeats
    "full": {"train": (512, 4096, 32, 1024, 4, 5), "model": ("quick", 32, 256),
             "memory": (1024, 512, 16, 4096, 16384, 12)},
    "quick": {"train": (128, 1024, 16, 256, 4, 3), "model": ("gpt2-tiny", 8, 64),
              "memory": (256, 256, 16, 1024, 4096, 4)},
}
# memory: d_in, d_sae, k, batch, rows per shard, shards at 1x (10x has ten times as many)


# ---------------------------------------------------------------------------- 1. training throughput

def _saelens(arch: str, d_in: int, d_sae: int, k: int):
    import sae_lens as sl

    if arch == "relu":
        return sl.StandardTrainingSAE(sl.StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae, l1_coefficient=1.0))
    if arch == "topk":
        return sl.TopKTrainingSAE(sl.TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=k))
    if arch == "batchtopk":
        return sl.BatchTopKTrainingSAE(sl.BatchTopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=k))
    return sl.JumpReLUTrainingSAE(sl.JumpReLUTrainingSAEConfig(d_in=d_in, d_sae=d_sae))


def training_throughput(arch: str, d_in: int, d_sae: int, k: int, batch: int, steps: int, repeats: int,
                        trained: bool = False) -> dict[str, float]:
    """Activations/s of circuitlab and SAELens training the same architecture on the same batches from
    the same weights. trained=False: both at circuitlab's initialisation on Gaussian batches (ReLU and
    JumpReLU then fire on ~half the latents). trained=True: both at a dictionary that has learned planted
    features (below), on batches of those features: the state a training run spends most of its steps in."""
    from sae_lens.saes.sae import TrainStepInput

    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    gen = torch.Generator().manual_seed(0)
    if trained:
        directions, batches = _planted_batches(d_in, d_sae, k, batch, gen)
    else:
        batches = [torch.randn(batch, d_in, generator=gen) for _ in range(4)]
    source = _Random(d_in, batch)
    cfg = DictionaryConfig(arch, d_in=d_in, d_sae=d_sae, k=k if arch in ("topk", "batchtopk") else None, hook_name="x")
    ours = DictionaryTrainer([cfg], DictTrainConfig(steps=10**6, batch_size=batch, normalise=False), ActivationStore(source, batch))
    ours.init_from_data()
    if trained:
        _at_the_truth(ours.saes[0], directions, k, batches[0])
    theirs = _saelens(arch, d_in, d_sae, k)
    with torch.no_grad():  # the same weights on both sides
        for name, p in theirs.named_parameters():
            p.copy_(getattr(ours.saes[0], name))
    l0 = sum(ours.train_step({"x": b})[0]["l0"] for b in batches) / len(batches)

    def run_ours() -> None:
        for i in range(steps):
            ours.train_step({"x": batches[i % 4]})

    opt = torch.optim.Adam(theirs.parameters(), lr=1e-3)
    coefs = {n: (c.value if hasattr(c, "value") else c) for n, c in theirs.get_coefficients().items()}
    dead = torch.zeros(d_sae, dtype=torch.bool)

    def run_theirs() -> None:
        for i in range(steps):
            out = theirs.training_forward_pass(TrainStepInput(batches[i % 4], coefs, dead, i, False))
            opt.zero_grad()
            out.loss.backward()
            opt.step()

    sec = round_robin({"circuitlab": run_ours, "SAELens": run_theirs}, repeats)
    return {**{name: steps * batch / s for name, s in sec.items()}, "l0": l0}


def _planted_batches(d_in: int, n_features: int, l0: int, batch: int,
                     gen: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """n_features planted directions [n_features, d_in] in superposition, on average l0 active per row,
    and 4 batches [batch, d_in] of them scaled to E‖x‖ = √d_in (the trainer's normalisation)."""
    from circuitlab.dictionaries.planted import PlantedFeatures

    planted = PlantedFeatures(n_features=n_features, d=d_in, l0=l0, seed=0)
    batches = [planted.sample(batch, gen)[0] for _ in range(4)]
    scale = d_in**0.5 / float(torch.cat(batches).norm(dim=-1).mean())
    return planted.directions, [b * scale for b in batches]


@torch.no_grad()
def _at_the_truth(sae: Any, directions: torch.Tensor, l0: int, x: torch.Tensor) -> None:
    """Make sae a dictionary that has learned the planted directions: decoder rows are the directions,
    the encoder their transpose, and b_dec 0; ReLU's bias (or JumpReLU's threshold) is the cut that
    keeps l0 latents per row on x [rows, d_in] (TopK and BatchTopK keep k = l0 by themselves)."""
    sae.W_dec.copy_(directions)
    sae.W_enc.copy_(directions.T)
    sae.b_dec.zero_()
    sae.b_enc.zero_()
    pre = x @ sae.W_enc
    cut = pre.flatten().kthvalue(pre.numel() - l0 * len(x)).values
    if sae.cfg.architecture == "relu":
        sae.b_enc.fill_(-float(cut))
    elif sae.cfg.architecture == "jumprelu":
        sae.threshold.fill_(float(cut))


def sparse_crossover(rows: int, d_in: int, d_sae: int, fractions: tuple[float, ...], repeats: int) -> dict[float, float]:
    """Dense step time / sparse step time of one ReLU training step (training_step + backward + Adam)
    at each fraction of (row, latent) pairs kept (set through b_enc): where SPARSE_BELOW comes from."""
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    from circuitlab.dictionaries.objectives import Coefficients, training_step

    x = torch.randn(rows, d_in, generator=torch.Generator().manual_seed(0))
    sae = SparseDictionary(DictionaryConfig("relu", d_in=d_in, d_sae=d_sae, hook_name="x"), seed=0)
    opt = torch.optim.Adam(sae.parameters(), lr=1e-9, fused=True)  # a step that leaves the density alone
    with torch.no_grad():
        pre = (x @ sae.W_enc).flatten()
    ratios = {}
    for frac in fractions:
        with torch.no_grad():
            sae.b_enc.fill_(-float(pre.kthvalue(int(pre.numel() * (1 - frac))).values))

        def step(sparse: bool) -> None:
            out = training_step(sae, x, x, Coefficients(sparsity=1.0, aux=0.0, bandwidth=0.05), None, sparse=sparse)
            opt.zero_grad()
            out.loss.backward()
            opt.step()

        sec = round_robin({"dense": lambda: step(False), "sparse": lambda: step(True)}, repeats)
        ratios[frac] = sec["dense"] / sec["sparse"]
    return ratios


class _Random:
    """An activation source of seeded Gaussian rows {"x": [rows, d]} (the cost of making it is negligible)."""

    def __init__(self, d: int, rows_per_chunk: int) -> None:
        self.widths, self.rows_per_chunk, self.d = {"x": d}, rows_per_chunk, d

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(index * 2 + (split == "val"))
        return {"x": torch.randn(self.rows_per_chunk, self.d, generator=gen)}

    def describe(self) -> dict[str, Any]:
        return {"kind": "random", "d": self.d, "rows_per_chunk": self.rows_per_chunk}


# ---------------------------------------------------------------------------- 2. store overhead

class _Stop(Exception):
    pass


def _stop(t: torch.Tensor, hook: Any) -> None:
    raise _Stop


def store_overhead(preset: str, batch: int, seq: int, repeats: int) -> tuple[str, dict[str, float]]:
    """The hook, and seconds of: model(tokens); the same forward stopped at the hook; the store
    serving the same tokens' activations at the hook."""
    from circuitlab.config import ModelConfig
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.model import Transformer

    model = Transformer(ModelConfig.from_preset(preset, d_vocab=4096, n_ctx=seq)).eval()
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    tokens = torch.randint(0, 4096, (batch, seq), generator=torch.Generator().manual_seed(0))
    rows = batch * seq

    @torch.no_grad()
    def forward() -> None:
        model(tokens)

    @torch.no_grad()
    def forward_to_hook() -> None:
        try:
            with model.hooks([(hook, _stop)]):
                model(tokens)
        except _Stop:
            pass

    source = ModelActivations(model, [hook], tokens, seq_len=seq, seqs_per_chunk=batch)  # set up once, as in training

    def store() -> None:
        st = ActivationStore(source, rows // 4)
        for _ in range(4):
            st.next_batch()

    return hook, round_robin({"forward": forward, "to_hook": forward_to_hook, "store": store}, repeats)


# ---------------------------------------------------------------------------- 3. peak memory

def _write_cache(folder: str, d: int, rows_per_shard: int, shards: int) -> None:
    from circuitlab.dictionaries.store import cache_activations

    cache_activations(_Random(d, rows_per_shard), folder, shards, progress=False)


def _train_from_cache(folder: str, d_in: int, d_sae: int, k: int, batch: int) -> None:
    """In a fresh process: train one epoch over the cache; print the RSS before training and the peak (KiB)."""
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.store import ActivationStore, CachedActivations
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    source = CachedActivations(folder)
    cfg = DictionaryConfig("topk", d_in=d_in, d_sae=d_sae, k=k, hook_name="x")
    steps = source.manifest["splits"]["train"]["rows"] // batch
    trainer = DictionaryTrainer([cfg], DictTrainConfig(steps=steps, batch_size=batch), ActivationStore(source, batch))
    before = peak_rss_kib()
    trainer.fit(progress=False)
    print(before, peak_rss_kib(), steps)


def peak_memory(d: int, d_sae: int, k: int, batch: int, rows_per_shard: int, shards: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-dict-cache-") as folder:
        child = [sys.executable, __file__, "--child"]
        subprocess.run(child + ["cache", folder, str(d), str(rows_per_shard), str(shards)], check=True)
        out = subprocess.run(child + ["train", folder, str(d), str(d_sae), str(k), str(batch)],
                             capture_output=True, text=True, check=True).stdout.split()
    before, peak, steps = (int(v) for v in out[-3:])
    rows = rows_per_shard * shards
    return {"rows": rows, "held_mib": rows * d * 4 / 2**20, "disk_mib": rows * d * 2 / 2**20,
            "before_mib": before / 1024, "peak_mib": peak / 1024, "added_mib": (peak - before) / 1024, "steps": steps}


# ---------------------------------------------------------------------------- main

def available_mib() -> float:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: the machine's cores)")
    p.add_argument("--crossover", action="store_true",
                   help="only: the sparse step's speed-up over the dense one by kept fraction (ReLU)")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    if args.child:
        kind, folder, *nums = args.child
        (_write_cache if kind == "cache" else _train_from_cache)(folder, *map(int, nums))
        return 0

    from importlib.metadata import version

    from circuitlab.perf import REFERENCE_GFLOPS, matmul_gflops

    size = SIZES["quick" if args.quick else "full"]
    start = time.perf_counter()
    gflops = matmul_gflops()
    print(f"# dictionaries benchmark ({'quick' if args.quick else 'full'} size)  torch {torch.__version__}  "
          f"sae-lens {version('sae-lens')}  threads {threads}  load avg {os.getloadavg()[0]:.2f}")
    print(f"# this machine: {gflops:.0f} GFLOP/s fp32 matmul (circuitlab.perf.matmul_gflops); wall times scale "
          f"to a {REFERENCE_GFLOPS:.0f} GFLOP/s machine by x{gflops / REFERENCE_GFLOPS:.2f}")

    d_in, d_sae, k, batch, steps, repeats = size["train"]
    if args.crossover:
        fractions = (0.02, 0.05, 0.1, 0.15, 0.2)
        print("\n## sparse step vs dense step, ReLU, by fraction of (row, latent) pairs kept (dense time / sparse time)")
        print(f"{'rows x d_in -> d_sae':22s}" + "".join(f"{f:>8.0%}" for f in fractions))
        for shape in ((batch, d_in, d_sae), (batch, d_in // 4, d_sae // 4), (4 * batch, 3 * d_in // 2, 4 * d_sae)):
            r = sparse_crossover(*shape, fractions, repeats=2)
            print(f"{'%d x %d -> %d' % shape:22s}" + "".join(f"{r[f]:7.1f}x" for f in fractions))
        return 0
    print(f"\n## 1. training throughput, d_in {d_in}, d_sae {d_sae}, k {k}, batch {batch} "
          f"(median of {repeats} x {steps} steps)")
    print("trained: both sides at a dictionary that has learned planted features (decoder = the true directions),\n"
          "         on batches of them, L0 ~ k: the state of most of a run; at init: both at circuitlab's\n"
          "         initialisation on Gaussian batches (ReLU and JumpReLU fire on ~half the latents there)")
    print(f"{'architecture':12s} {'state':8s} {'L0':>6s} {'circuitlab act/s':>17s} {'SAELens act/s':>14s} {'ratio':>7s}")
    ratios, at_init = {}, {}
    for arch in ("relu", "topk", "batchtopk", "jumprelu"):
        for trained in (True, False):
            r = training_throughput(arch, d_in, d_sae, k, batch, steps, repeats, trained=trained)
            ratio = r["circuitlab"] / r["SAELens"]
            (ratios if trained else at_init)[arch] = ratio
            print(f"{arch:12s} {'trained' if trained else 'at init':8s} {r['l0']:6.0f} {r['circuitlab']:17,.0f} "
                  f"{r['SAELens']:14,.0f} {ratio:6.2f}x")

    preset, b, seq = size["model"]
    hook, t = store_overhead(preset, b, seq, repeats=max(repeats, 5))
    overhead = t["store"] / t["forward"] - 1
    print(f"\n## 2. activation store vs the model's own forward, {preset} preset, {b} x {seq} tokens, {hook}")
    print(f"model(tokens) {t['forward'] * 1e3:.1f} ms; the same forward stopped at the hook {t['to_hook'] * 1e3:.1f} ms; "
          f"store (forward to the hook, flatten, shuffle, 4 batches) {t['store'] * 1e3:.1f} ms")
    print(f"store vs model(tokens): {100 * overhead:+.1f}%; the store's own work (vs the stopped forward): "
          f"{100 * (t['store'] / t['to_hook'] - 1):+.1f}%")

    d, d_sae_m, k_m, batch_m, rows_per_shard, shards = size["memory"]
    print(f"\n## 3. peak memory training from the disk cache (fresh process each; fp16 shards of {rows_per_shard:,} "
          f"x {d}; TopK d_sae {d_sae_m}, batch {batch_m}); MemAvailable now {available_mib():,.0f} MiB")
    print(f"{'tokens':>6s} {'activations':>12s} {'fp32 if held':>13s} {'on disk':>9s} {'RSS before':>11s} "
          f"{'peak RSS':>9s} {'added':>8s}")
    mem = {}
    for scale in (1, 10):
        m = mem[scale] = peak_memory(d, d_sae_m, k_m, batch_m, rows_per_shard, shards * scale)
        print(f"{scale:5d}x {m['rows']:12,d} {m['held_mib']:10,.0f} MiB {m['disk_mib']:6,.0f} MiB "
              f"{m['before_mib']:7,.0f} MiB {m['peak_mib']:5,.0f} MiB {m['added_mib']:4,.0f} MiB")
    growth = mem[10]["peak_mib"] / mem[1]["peak_mib"]

    print("\n## summary")
    print(f"{'target':62s} {'measured':>10s}  met")
    for arch, ratio in ratios.items():
        print(f"{'training throughput vs SAELens, ' + arch + ', trained (>= 1.5x)':62s} {ratio:9.2f}x  "
              f"{'yes' if ratio >= 1.5 else 'NO'}  (at init {at_init[arch]:.2f}x)")
    print(f"{'store overhead over the forward (<= +10%)':62s} {100 * overhead:+9.1f}%  {'yes' if overhead <= 0.10 else 'NO'}")
    print(f"{'peak RSS, 10x tokens / 1x tokens (flat: <= 1.10)':62s} {growth:9.2f}x  {'yes' if growth <= 1.10 else 'NO'}")
    print(f"{'  (what training added at 10x / the 10x activations as fp32)':62s} "
          f"{mem[10]['added_mib'] / mem[10]['held_mib']:9.2f}x")
    print(f"# {time.perf_counter() - start:.0f} s; load avg at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
