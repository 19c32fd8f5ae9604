"""Dictionary training across ranks (gloo on the CPU): N ranks with B rows each train exactly what one process
with N·B rows trains on the same token stream (float64), data parallel and module parallel; the store's
shards; the multi-rank disk cache; a killed rank (no half-written checkpoint, the resume reaches the same
weights); another world size on resume (exact when it divides the shards, else one line)."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException
from safetensors.torch import load_file, save_file

import helpers
from circuitlab.dictionaries import DictionaryConfig
from circuitlab.dictionaries.clt import CLTConfig
from circuitlab.dictionaries.store import ActivationStore, CachedActivations, _seed, cache_activations
from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
from circuitlab.errors import CircuitlabError
from circuitlab.training.run_log import read_metrics

ARCHS = ("relu", "topk", "batchtopk", "jumprelu")
D, LAYERS = 6, 2


class LayeredSource:
    """A deterministic stand-in for a model: per layer, an MLP input x_l (sparse planted features in D dims)
    and output y_l = tanh(x_l M_l) + x_{l-1} N_l, at the hooks a CLT reads (chunk i of a split is fixed)."""

    def __init__(self, rows_per_chunk: int = 96) -> None:
        g = torch.Generator().manual_seed(1)
        self.dirs = torch.randn(12, D, generator=g)
        self.maps = torch.randn(LAYERS, D, D, generator=g) / D ** 0.5
        self.rows = rows_per_chunk
        self.widths = {h: D for l in range(LAYERS) for h in (f"blocks.{l}.ln2.hook_normalized", f"blocks.{l}.hook_mlp_out")}

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(_seed("layered", split, index))
        out, prev = {}, torch.zeros(self.rows, D)
        for l in range(LAYERS):
            feats = (torch.rand(self.rows, 12, generator=g) < 0.25) * (0.5 + torch.rand(self.rows, 12, generator=g))
            x = feats @ self.dirs
            out[f"blocks.{l}.ln2.hook_normalized"] = x
            out[f"blocks.{l}.hook_mlp_out"] = torch.tanh(x @ self.maps[l]) + 0.3 * prev
            prev = x
        return out

    def describe(self) -> dict:
        return {"kind": "layered", "rows": self.rows}


def configs(archs=ARCHS, kinds=("sae", "transcoder", "clt")) -> list:
    out = []
    for a in archs:
        k = 2 if a in ("topk", "batchtopk") else None
        if "sae" in kinds:
            out.append(DictionaryConfig(a, d_in=D, d_sae=16, k=k, hook_name="blocks.0.ln2.hook_normalized", dtype="float64"))
        if "transcoder" in kinds:
            out.append(DictionaryConfig(a, d_in=D, d_sae=16, k=k, hook_name="blocks.1.ln2.hook_normalized",
                                        out_hook_name="blocks.1.hook_mlp_out", d_out=D, dtype="float64"))
        if "clt" in kinds:
            out.append(CLTConfig(a, n_layers=LAYERS, d_model=D, d_sae=8, k=k, dtype="float64"))
    return out


def train_settings(steps: int = 50, **extra) -> DictTrainConfig:
    # dead latents and resampling inside 50 steps, and BatchTopK's threshold moving: every reduction is exercised
    return DictTrainConfig(steps=steps, batch_size=32, lr=3e-3, lr_warmup_steps=5, sparsity_warmup_steps=10,
                           dead_after=5, dead_density=0.1, resample_every=20, resample_batches=2, log_every=10, **extra)


def weights(trainer: DictionaryTrainer) -> dict[str, torch.Tensor]:
    return {f"{j}.{k}": v.detach().clone() for j in range(len(trainer.saes)) for k, v in trainer._state_tensors(j).items()}


def _trainer(cfgs, train, shards, parallel=None, overrides=None) -> DictionaryTrainer:
    return DictionaryTrainer(cfgs, train, ActivationStore(LayeredSource(), train.batch_size, shards=shards),
                             overrides=overrides, parallel=parallel)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, job: dict) -> None:
    """One rank: join the gloo group, cache activations (job["cache"]: a folder), train each of job["runs"],
    and write rank 0's weights after each to job["out"].<run name>."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if job.get("cache"):
            cache_activations(LayeredSource(rows_per_chunk=16), job["cache"], 5, progress=False)
        for name, (cfgs, train, overrides, parallel, folder, stop_at) in job["runs"].items():
            trainer = _trainer(cfgs, train, job["shards"], parallel, overrides)
            kill = job.get("kill")
            if kill and rank == kill[0]:  # this rank dies (SIGKILL) after finishing step kill[1]
                step = trainer.train_step

                def dying(batch, step=step):
                    if trainer.step == kill[1]:
                        os.kill(os.getpid(), 9)
                    return step(batch)
                trainer.train_step = dying
            trainer.fit(folder, progress=False, stop_at=stop_at)
            if rank == 0:
                save_file(weights(trainer), f"{job['out']}.{name}")
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, job: dict, tmp: Path) -> None:
    job = {**job, "out": str(tmp / "w")}
    mp.start_processes(_worker, args=(world, _free_port(), job), nprocs=world, start_method="spawn")


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    worst = max((float((a[k].double() - b[k].double()).abs().max()), k) for k in a if a[k].numel())
    assert worst[0] <= atol, worst


FAST = [configs(("batchtopk",), ("sae",))[0], configs(("relu",), ("transcoder",))[0], configs(("jumprelu",), ("clt",))[0]]
FAST_OWN = [{}, {"target_l0": 3.0}, {}]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One launch of 2 gloo ranks for the fast tests (starting processes is most of their time): the cache
    test's caching, then FAST trained data parallel and module parallel."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    folder = tmp / "cache"
    cache_activations(LayeredSource(rows_per_chunk=16), folder, 2, progress=False)  # alone: chunks 0 and 1 ...
    (folder / "cache.json").unlink()  # ... as if killed before the index was merged, chunk 1 in a progress file
    (folder / "cache.rank-1.json").write_text('{"train": {"train-00001.safetensors": [16, 384]}}')
    (folder / "train-00000.safetensors").unlink()
    written = (folder / "train-00001.safetensors").stat().st_mtime_ns
    train = train_settings()
    run_ranks(2, {"shards": 2, "cache": str(folder), "runs": {"data": (FAST, train, FAST_OWN, "data", None, None),
                                                            "modules": (FAST, train, FAST_OWN, "modules", None, None)}}, tmp)
    return tmp, written


def test_two_ranks_train_what_one_process_trains(two_ranks, tmp_path):
    """Fast case: a BatchTopK SAE (global top-k, running threshold), a ReLU transcoder steered to a target L0
    (its controller reads the L0 of both ranks' rows) and a JumpReLU CLT, with dead-latent resampling,
    50 steps, float64: 2 ranks x 16 rows == one process x 32 rows, data and module parallel (the slow matrix
    has every architecture)."""
    one = _trainer(FAST, train_settings(), shards=2, overrides=FAST_OWN)
    one.fit(tmp_path / "one", progress=False)
    reference = weights(one)
    assert one.controllers[1] is not None and float(one.controllers[1].log_coeff[0]) != 0
    assert float(one.saes[0].threshold.min()) > 0  # BatchTopK's running threshold moved
    resampled = [d["resampled"] for r in read_metrics(tmp_path / "one") if "dictionaries" in r for d in r["dictionaries"]]
    assert sum(resampled) > 0  # dead latents were resampled (on both ranks' rows)
    assert_same(reference, load_file(f"{two_ranks[0]}/w.data"))
    assert_same(reference, load_file(f"{two_ranks[0]}/w.modules"))


def test_store_shards_interleave_the_stream_and_refuse_what_cannot_split():
    """Shard s reads chunks s, s + shards, ... with its own buffer; a step takes batch / shards rows of each."""
    source = LayeredSource(rows_per_chunk=8)
    two = ActivationStore(source, 8, shards=2)
    got = [two.next_batch()["blocks.0.ln2.hook_normalized"] for _ in range(3)]
    alone = ActivationStore(source, 4)
    evens = [alone._load(c)["blocks.0.ln2.hook_normalized"] for c in (0, 2)]
    odds = [alone._load(c)["blocks.0.ln2.hook_normalized"] for c in (1, 3)]
    torch.testing.assert_close(torch.cat(got), torch.cat([evens[0][:4], odds[0][:4], evens[0][4:], odds[0][4:],
                                                          evens[1][:4], odds[1][:4]]))
    state = two.state_dict()
    assert state == {"shards": 2, "positions": {"0": [2, 4], "1": [3, 4]}}
    again = ActivationStore(source, 8, shards=2)
    again.load_state_dict(state)
    torch.testing.assert_close(again.next_batch(), two.next_batch())
    with pytest.raises(CircuitlabError, match="divisible by the number of stream shards"):
        ActivationStore(source, 9, shards=2)
    with pytest.raises(CircuitlabError, match="has 2 shard"):
        ActivationStore(source, 8).load_state_dict(state)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["data", "modules"])
def test_every_architecture_two_ranks_equal_one_process(tmp_path, parallel):
    """The full matrix: SAEs, transcoders and CLTs of every architecture, 50 steps, float64, <= 1e-6."""
    cfgs, train = configs(), train_settings()
    one = _trainer(cfgs, train, shards=2)
    one.fit(progress=False)
    run_ranks(2, {"shards": 2, "runs": {"m": (cfgs, train, None, parallel, None, None)}}, tmp_path)
    assert_same(weights(one), load_file(f"{tmp_path}/w.m"))


@pytest.mark.slow
def test_killed_rank_leaves_a_whole_checkpoint_and_the_resume_is_exact(tmp_path):
    """Rank 1 is SIGKILLed during step 23 (checkpoints every 10): rank 0 stops with one line instead of
    hanging, the checkpoint is step 20's, whole; resuming on 2 ranks, and on 1 process (it divides the 2
    shards), reaches the weights of an uninterrupted run."""
    cfgs, train = configs(("batchtopk", "jumprelu"), ("sae", "clt")), train_settings(steps=40, ckpt_every=10)
    one = _trainer(cfgs, train, shards=2)
    one.fit(progress=False)
    folder = tmp_path / "run"
    with pytest.raises(ProcessException):
        run_ranks(2, {"shards": 2, "kill": (1, 23), "runs": {"k": (cfgs, train, None, "data", str(folder), None)}}, tmp_path)
    import json

    state = json.loads((folder / "checkpoint" / "state.json").read_text())
    assert state["step"] == 20 and state["world_size"] == 2
    assert [p.name for p in (folder / "checkpoint").iterdir() if p.name.startswith(".")] == []  # no temp left
    run_ranks(2, {"shards": 2, "runs": {"r": (cfgs, train, None, "data", str(folder), None)}}, tmp_path)
    assert_same(weights(one), load_file(f"{tmp_path}/w.r"))
    # one process resumes a 2-rank run exactly (2 shards); 3 ranks could not share 2 shards: one line
    single = tmp_path / "single"
    run_ranks(2, {"shards": 2, "runs": {"s": (cfgs, train, None, "data", str(single), 20)}}, tmp_path)
    resumed = _trainer(cfgs, train, shards=2)
    resumed.fit(single, progress=False)
    assert_same(weights(one), weights(resumed))
    with pytest.raises(CircuitlabError, match="has 2 shard"):
        _trainer(cfgs, train, shards=1).fit(single, progress=False)


def test_a_failed_collective_is_one_line_and_the_timeout_is_checked(monkeypatch):
    from circuitlab.training import distributed as D

    with pytest.raises(CircuitlabError, match=r"^rank 0: another rank stopped or did not answer during averaging "
                                              r"gradients \(\[gloo\] Connection closed by peer\); stopping"):
        with D.collective("averaging gradients"):
            raise RuntimeError("[gloo] Connection closed by peer\n  frame 1\n  frame 2")
    monkeypatch.setenv("CIRCUITLAB_DIST_TIMEOUT", "30")
    assert D.timeout().total_seconds() == 30
    for bad in ("soon", "0"):
        monkeypatch.setenv("CIRCUITLAB_DIST_TIMEOUT", bad)
        with pytest.raises(CircuitlabError, match="CIRCUITLAB_DIST_TIMEOUT must be"):
            D.timeout()


def test_autocast_is_for_a_gpu_forward():
    from circuitlab.config import ModelConfig
    from circuitlab.dictionaries.store import ModelActivations
    from circuitlab.model import Transformer

    model = Transformer(ModelConfig.from_preset("attn-only-1l", d_model=16, n_heads=2, d_vocab=20, n_ctx=8))
    tokens = torch.zeros(4, 8, dtype=torch.long)
    with pytest.raises(CircuitlabError, match="autocast bfloat16 is for a GPU's forward"):
        ModelActivations(model, ["blocks.0.hook_resid_post"], tokens, seq_len=8, autocast="bfloat16")
    with pytest.raises(CircuitlabError, match="autocast must be one of bfloat16, float16"):
        ModelActivations(model, ["blocks.0.hook_resid_post"], tokens, seq_len=8, autocast="int8")


def test_cache_written_by_two_ranks_is_one_index(two_ranks):
    """Each rank writes its own chunks (even / odd) and progress file; rank 0 merges them into one index. An
    interrupted run's shards (chunk 1, in rank 1's progress file) are kept, not written again."""
    tmp, written = two_ranks
    folder, source = tmp / "cache", LayeredSource(rows_per_chunk=16)
    cached = CachedActivations(folder)
    assert cached.shards("train") == [f"train-{i:05d}.safetensors" for i in range(5)]
    assert cached.manifest["splits"]["train"]["rows"] == 5 * 16
    assert not list(folder.glob("cache.rank-*")) and (folder / "train-00001.safetensors").stat().st_mtime_ns == written
    for i in range(5):
        torch.testing.assert_close(load_file(str(folder / f"train-{i:05d}.safetensors"))["blocks.0.ln2.hook_normalized"],
                                   source.chunk(i)["blocks.0.ln2.hook_normalized"].half())


@pytest.mark.slow
def test_sae_train_under_torchrun_equals_one_process(tmp_path):
    """`torchrun --nproc_per_node=2 -m circuitlab.cli sae train` (data parallel, the disk cache written by both
    ranks) saves the dictionaries one process saves with store.shards=2 (float32: <= 1e-5; each its own
    cache); module parallel
    too; one line and exit 2 on every rank when a rank fails, not a hang."""
    import subprocess

    import yaml

    from circuitlab.cli import main

    helpers.save_char_checkpoint(tmp_path / "model", n_layers=2)
    data = {"model": str(tmp_path / "model"), "data": {"source": "stories", "n_stories": 100, "tokenizer": "char"},
            "store": {"seq_len": 16, "seqs_per_chunk": 8, "shards": 2},
            "dictionaries": [{"architecture": "batchtopk", "hook_name": "blocks.0.hook_resid_post", "d_sae": 32, "k": 4},
                             {"kind": "clt", "architecture": "jumprelu", "d_sae": 16}],
            "train": {"steps": 12, "batch_size": 32, "eval_batches": 1, "ckpt_every": 6}}
    for name in ("one", "two"):  # each its own disk cache: one process writes all chunks, two ranks half each
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**data, "store": {**data["store"],
                                                                               "cache": str(tmp_path / f"cache-{name}")}}))
    assert main(["sae", "train", "--config", str(tmp_path / "one.yaml"), "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}

    def two(out, *extra, config="two.yaml"):
        return subprocess.run([str(torchrun), "--nproc_per_node=2", f"--master_port={_free_port()}", "-m", "circuitlab.cli",
                               "sae", "train", "--config", str(tmp_path / config), "--out", str(tmp_path / out),
                               "--no-progress", *extra], capture_output=True, text=True, env=env, timeout=600)

    for out, extra in (("data", ()), ("modules", ("--parallel", "modules"))):
        proc = two(out, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for name in ("blocks.0.hook_resid_post-batchtopk", "clt-jumprelu"):
            a, b = ({k: v for f in sorted((tmp_path / run / "dictionaries" / name).glob("*.safetensors"))
                     for k, v in load_file(str(f)).items()} for run in ("one", out))
            assert_same(a, b, atol=1e-5)
    assert CachedActivations(tmp_path / "cache-two").shards("train") == [f"train-{i:05d}.safetensors" for i in range(4)]
    # A rank that fails mid-run: every cached shard but chunk 0's is corrupt, so rank 1 fails on its first
    # batch (chunk 1) while rank 0 trains; rank 1 says why in one line, rank 0 stops at its next collective with one.
    names = CachedActivations(tmp_path / "cache-two").shards("train")
    first = names[int(torch.randperm(len(names), generator=torch.Generator().manual_seed(_seed(0, "train", 0)))[0])]
    for name in names:
        if name != first:
            (tmp_path / "cache-two" / name).write_bytes(b"not a shard")
    proc = two("broken")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("circuitlab sae: error")]
    assert any("is corrupt" in e for e in errors) and any("rank 0: another rank stopped" in e for e in errors), proc.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
