"""Dictionary training throughput on 1 and 2 ranks (gloo, CPU, one thread per rank), and what bounds it.

The same work both ways: a 4-layer model (d_model 256) runs on the token stream and a TopK SAE
(d_sae 2048, k 32) and a ReLU transcoder (d_sae 1024) train on its activations, global batch 1024 rows
cut into 2 stream shards. One process (1 thread) runs both shards; 2 ranks (1 thread each) run one each.
Data parallel (replicas, one gradient all-reduce per dictionary and step) and module parallel (each
dictionary on one rank, activations gathered to it) are timed. Printed per setting: tokens/s, scaling
against one process, and the parts of a step (model forward, dictionary steps, communication) measured
on rank 0, so the bound is visible.

    PYTHONPATH=src python benchmarks/bench_dictionaries_distributed.py           # ~2 min on 2 idle cores
    PYTHONPATH=src python benchmarks/bench_dictionaries_distributed.py --quick   # smoke run
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


def _model():
    from circuitlab.config import ModelConfig
    from circuitlab.model import Transformer

    cfg = ModelConfig.from_preset("gpt2-tiny", d_model=256, n_heads=4, n_layers=4, d_vocab=512, n_ctx=128)
    torch.manual_seed(0)
    return Transformer(cfg).eval()


def _trainer(batch: int, parallel: str | None):
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    tokens = torch.randint(0, 512, (4096, 65), generator=torch.Generator().manual_seed(0))
    source = ModelActivations(_model(), ["blocks.1.hook_resid_post", "blocks.2.ln2.hook_normalized", "blocks.2.hook_mlp_out"],
                              tokens, seq_len=64, seqs_per_chunk=4)  # 256 rows: chunks load every step
    cfgs = [DictionaryConfig("topk", d_in=256, d_sae=2048, k=32, hook_name="blocks.1.hook_resid_post"),
            DictionaryConfig("relu", d_in=256, d_sae=1024, hook_name="blocks.2.ln2.hook_normalized",
                             out_hook_name="blocks.2.hook_mlp_out", d_out=256)]
    train = DictTrainConfig(steps=10_000, batch_size=batch, log_every=10_000)
    return DictionaryTrainer(cfgs, train, ActivationStore(source, batch, shards=2), parallel=parallel)


class _Clock:
    """Seconds spent in the model's forward (the store's chunk loads) and in collectives, on this rank."""

    def __init__(self, trainer) -> None:
        import circuitlab.dictionaries.parallel as par
        import torch.distributed as dist

        self.forward = self.comm = 0.0
        source = trainer.store.source
        chunk = source.chunk

        def timed_chunk(*a, **k):
            t = time.perf_counter()
            try:
                return chunk(*a, **k)
            finally:
                self.forward += time.perf_counter() - t
        source.chunk = timed_chunk
        for name in ("all_reduce", "all_gather", "gather", "broadcast"):
            original = getattr(dist, name)

            def timed(*a, _original=original, **k):
                t = time.perf_counter()
                try:
                    return _original(*a, **k)
                finally:
                    self.comm += time.perf_counter() - t
            setattr(par.dist, name, timed)


def _measure(trainer, steps: int, warm: int) -> dict:
    trainer.init_from_data()
    for _ in range(warm):
        trainer.train_step(trainer.store.next_batch())
    clock = _Clock(trainer)
    t = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(trainer.store.next_batch())
    wall = time.perf_counter() - t
    return {"wall": wall, "forward": clock.forward, "comm": clock.comm}


def _rank(rank: int, world: int, port: int, batch: int, parallel: str, steps: int, warm: int, out: str) -> None:
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = _measure(_trainer(batch, parallel), steps, warm)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_cost(n_floats: int, repeats: int = 20) -> float:
    """Seconds per all-reduce of n float32 between 2 gloo ranks on this machine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        mp.start_processes(_allreduce_rank, args=(2, _port(), n_floats, repeats, out), nprocs=2, start_method="spawn")
        with open(out) as f:
            return float(f.read())


def _allreduce_rank(rank, world, port, n, repeats, out):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(n)
    dist.all_reduce(t)
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(t)
    if rank == 0:
        with open(out, "w") as f:
            f.write(str((time.perf_counter() - start) / repeats))
    dist.destroy_process_group()


def main() -> None:
    import json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    steps, warm, batch = (3, 1, 256) if args.quick else (12, 2, 1024)
    torch.set_num_threads(1)
    print(f"global batch {batch} rows, {steps} timed steps after {warm}; torch {torch.__version__}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    one = _measure(_trainer(batch, None), steps, warm)
    rate1 = steps * batch / one["wall"]
    print(f"1 process, 1 thread: {rate1:,.0f} tokens/s  (forward {one['forward'] / one['wall']:.0%} of the time, "
          f"dictionary steps {1 - one['forward'] / one['wall']:.0%})")
    for parallel in ("data", "modules"):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            mp.start_processes(_rank, args=(2, _port(), batch, parallel, steps, warm, out), nprocs=2, start_method="spawn")
            with open(out) as f:
                r = json.load(f)
        rate = steps * batch / r["wall"]
        print(f"2 ranks x 1 thread, {parallel} parallel: {rate:,.0f} tokens/s = {rate / rate1:.2f}x one process  "
              f"(rank 0: forward {r['forward'] / r['wall']:.0%}, communication {r['comm'] / r['wall']:.0%}, "
              f"dictionary steps {1 - (r['forward'] + r['comm']) / r['wall']:.0%})")
    grads = 256 * 2048 * 2 + 2048 + 256 + 256 * 1024 * 2 + 1024 + 256  # both dictionaries' parameters
    cost = _allreduce_cost(grads)
    print(f"all-reduce of the gradients ({grads * 4 / 2**20:.1f} MiB float32) between 2 gloo ranks here: "
          f"{cost * 1e3:.1f} ms per step")


if __name__ == "__main__":
    main()
