"""Cross-layer transcoder benchmarks: training throughput against sparsify, peak memory at L = 6 and 12
layers, and training from the disk cache flat in memory. One run, printed as ratios.

The peer: EleutherAI's sparsify (PyPI `eai-sparsify`, 1.3.3, in the dev extra: it installs without
touching our pins). No PyPI release of sparsify has cross-layer transcoders (its CLT code lives on
GitHub branches this machine cannot reach), so the peer is sparsify's closest trainable thing: one TopK
transcoder per layer (SparseCoder(transcode=True)) on the same activations, width per layer, k and
batch, stepped with Adam the way its trainer does (fvu loss, decoder kept unit-norm is off for
transcoders). A CLT does strictly more work per step (layer l decodes into L - l layers, L(L+1)/2
blocks against L), so "CLT tokens/s / sparsify per-layer tokens/s" understates the CLT-to-CLT ratio.
circuitlab's own per-layer transcoders are timed beside them.

1. Throughput (tokens/s; a token is one row of all L layers), at init and from a trained state (200
   steps on planted cross-layer features first, so that latents are specialised and some may be dead:
   AuxK runs on both sides with the same dead mask rule: not fired in the last 100 steps).
2. Peak memory (RSS added by training, a fresh process each) at L = 6 and L = 12: ours CLT, ours
   per-layer, sparsify per-layer.
3. Training a CLT from the on-disk cache at 1x and 4x the tokens (fresh processes): added peak RSS flat.

Timings alternate between the sides (round robin, median of the repeats), so load on the machine hits
both alike.

    PYTHONPATH=src python benchmarks/bench_clt.py            # ~5 min on 2 idle cores
    PYTHONPATH=src python benchmarks/bench_clt.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings
from typing import Any

import torch

from _timing import peak_rss_kib, round_robin  # benchmarks/_timing.py (this folder is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))


def _planted(L: int, d: int, d_sae: int):
    from circuitlab.dictionaries.planted import PlantedCrossLayer

    return PlantedCrossLayer(n_layers=L, d=d, n_per_layer=d_sae // 2, reach=2, l0=8.0, rows_per_chunk=4096)


def _ours(L: int, d: int, d_sae: int, k: int, batch: int, kind: str, source):
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.clt import CLTConfig
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    if kind == "clt":
        cfgs = [CLTConfig("topk", n_layers=L, d_model=d, d_sae=d_sae, k=k)]
    else:
        cfgs = [DictionaryConfig("topk", d_in=d, d_sae=d_sae, k=k, hook_name=source.input_hook.format(layer=l),
                                 out_hook_name=source.output_hook.format(layer=l)) for l in range(L)]
    trainer = DictionaryTrainer(cfgs, DictTrainConfig(steps=10**6, batch_size=batch, dead_after=100, lr=1e-3),
                                ActivationStore(source, batch))
    trainer.init_from_data()
    return trainer


class _Sparsify:
    """sparsify's per-layer TopK transcoders, one Adam over all, its forward (fvu + AuxK) per layer."""

    def __init__(self, L: int, d: int, d_sae: int, k: int, source) -> None:
        from sparsify import SparseCoder, SparseCoderConfig

        cfg = SparseCoderConfig(num_latents=d_sae, k=k, transcode=True)
        self.coders = [SparseCoder(d, cfg) for _ in range(L)]
        self.opt = torch.optim.Adam([p for c in self.coders for p in c.parameters()], lr=1e-3)
        self.source, self.L = source, L
        self.last_fired = [torch.zeros(d_sae, dtype=torch.long) for _ in range(L)]
        self.step_n = 0

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        loss = 0.0
        for l, coder in enumerate(self.coders):
            x, y = batch[self.source.input_hook.format(layer=l)], batch[self.source.output_hook.format(layer=l)]
            dead = (self.step_n - self.last_fired[l]) >= 100
            out = coder(x, y, dead_mask=dead if bool(dead.any()) else None)
            loss = loss + out.fvu + out.auxk_loss / 32
            self.last_fired[l][out.latent_indices.flatten().unique()] = self.step_n + 1
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.step_n += 1


def throughput(L: int, d: int, d_sae: int, k: int, batch: int, steps: int, repeats: int, warm: int) -> dict[str, dict]:
    """tokens/s of one step of each side, at init and after `warm` training steps on planted data."""
    from circuitlab.dictionaries.store import ActivationStore

    source = _planted(L, d, d_sae)
    store = ActivationStore(source, batch, seed=1)
    batches = [store.next_batch() for _ in range(4)]
    sides = {"circuitlab CLT": _ours(L, d, d_sae, k, batch, "clt", source),
             "circuitlab per-layer": _ours(L, d, d_sae, k, batch, "per-layer", source),
             "sparsify per-layer": _Sparsify(L, d, d_sae, k, source)}

    def stepper(side):
        i = [0]

        def run() -> None:
            for _ in range(steps):
                b = batches[i[0] % len(batches)]
                i[0] += 1
                side.step(b) if isinstance(side, _Sparsify) else side.train_step(b)
        return run

    out = {}
    for state in ("init", "trained"):
        if state == "trained":
            for side in sides.values():  # the same planted stream for every side
                warm_store = ActivationStore(source, batch, seed=2)
                for _ in range(warm):
                    b = warm_store.next_batch()
                    side.step(b) if isinstance(side, _Sparsify) else side.train_step(b)
        sec = round_robin({name: stepper(side) for name, side in sides.items()}, repeats)
        out[state] = {name: batch * steps / s for name, s in sec.items()}
    return out


# ---------------------------------------------------------------------------- memory (fresh processes)

def _child_train(kind: str, L: int, d: int, d_sae: int, k: int, batch: int, steps: int, cache: str | None) -> None:
    """In a fresh process: train `steps` steps; print RSS before training and the peak (KiB)."""
    from circuitlab.dictionaries.store import ActivationStore, CachedActivations

    source = CachedActivations(cache) if cache else _planted(L, d, d_sae)
    if cache:
        steps = source.manifest["splits"]["train"]["rows"] // batch
        source.input_hook, source.output_hook = "blocks.{layer}.ln2.hook_normalized", "blocks.{layer}.hook_mlp_out"
    store = ActivationStore(source, batch)
    if kind == "sparsify":
        side = _Sparsify(L, d, d_sae, k, _planted(L, d, 4) if cache else source)
        first = store.next_batch()
        before = peak_rss_kib()
        side.step(first)
        for _ in range(steps - 1):
            side.step(store.next_batch())
    else:
        trainer = _ours(L, d, d_sae, k, batch, kind, source if not cache else _planted(L, d, 4))
        trainer.store = store
        first = store.next_batch()
        before = peak_rss_kib()
        trainer.train_step(first)
        for _ in range(steps - 1):
            trainer.train_step(store.next_batch())
    print(before, peak_rss_kib(), steps)


def _run_child(*args: Any) -> tuple[float, float]:
    out = subprocess.run([sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}).stdout.split()
    before, peak = int(out[-3]), int(out[-2])
    return before / 1024, (peak - before) / 1024


def _write_cache(folder: str, L: int, d: int, d_sae: int, shards: int) -> int:
    from circuitlab.dictionaries.store import cache_activations

    source = _planted(L, d, d_sae)
    manifest = cache_activations(source, folder, shards, progress=False, dtype="float16")
    return manifest["splits"]["train"]["rows"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        kind, L, d, d_sae, k, batch, steps, cache = argv[1:]
        _child_train(kind, int(L), int(d), int(d_sae), int(k), int(batch), int(steps), None if cache == "-" else cache)
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    q = args.quick
    L, d, d_sae, k, batch = (4, 64, 256, 8, 256) if q else (6, 256, 2048, 32, 1024)
    steps, repeats, warm = (2, 2, 20) if q else (3, 5, 200)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; sparsify {_version('eai-sparsify')}")
    print(f"\n1. training throughput, L={L} layers, d_model={d}, d_sae={d_sae} per layer, k={k}, batch {batch} tokens "
          f"(median of {repeats} x {steps} steps)")
    res = throughput(L, d, d_sae, k, batch, steps, repeats, warm)
    for state, t in res.items():
        peer = t["sparsify per-layer"]
        print(f"   {state:8s} " + ", ".join(f"{n} {v:,.0f} tok/s" for n, v in t.items())
              + f"  ->  CLT / sparsify per-layer {t['circuitlab CLT'] / peer:.2f}x, "
              f"per-layer / sparsify per-layer {t['circuitlab per-layer'] / peer:.2f}x")
    print("\n2. peak memory added by training (MiB, fresh process each; 20 steps)")
    for Lm in ((4,) if q else (6, 12)):
        row = {}
        for kind in ("clt", "per-layer", "sparsify"):
            _, added = _run_child(kind, Lm, d, d_sae, k, batch, 5 if q else 20, "-")
            row[kind] = added
        print(f"   L={Lm:2d}: circuitlab CLT {row['clt']:.0f}, circuitlab per-layer {row['per-layer']:.0f}, "
              f"sparsify per-layer {row['sparsify']:.0f}")
    print("\n3. CLT training from the disk cache (fp16 shards; one epoch; fresh process each)")
    for shards in ((1, 2) if q else (2, 8)):
        with tempfile.TemporaryDirectory(prefix="bench-clt-cache-") as folder:
            rows = _write_cache(folder, L, d, d_sae, shards)
            _, added = _run_child("clt", L, d, d_sae, k, batch, 0, folder)
        held = rows * L * 2 * d * 4 / 2**20
        print(f"   {rows:,} tokens ({held:,.0f} MiB as fp32 activations): peak added {added:.0f} MiB")
    return 0


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return "not installed"


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    raise SystemExit(main())
