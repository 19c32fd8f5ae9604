"""Training: exact resume, DDP equivalence, accumulation, NaN stop, checkpoints, CLI.

(Split out of the flat test_training module, issue 38.)"""
import os
import subprocess
import sys
from pathlib import Path

import yaml

from circuitlab.training import train

from training.test_trainer import TINY, tiny, losses  # noqa: F401 (shared with it)


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it), so parallel test runs do not collide."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_match_one(tmp_path):
    cfg = tiny(tmp_path, steps=6, eval_every=3, track_every=3, ckpt_every=6)
    train(cfg, tmp_path / "single", progress=False)
    # A cold cache for the DDP run: rank 0 builds the tokenizer and token files while rank 1 waits.
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**cfg.to_dict(), "data": {**cfg.to_dict()["data"],
                                                              "cache_dir": str(tmp_path / "ddp-cache")}}))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(torchrun), "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "circuitlab.cli",
                           "train", "--config", str(path), "--out", str(tmp_path / "ddp"), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    single, ddp = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert len(single) == len(ddp) == 6
    for a, b in zip(single, ddp):
        assert abs(a - b) < 1e-4
