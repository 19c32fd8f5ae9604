"""Training: exact resume, DDP equivalence, accumulation, NaN stop, checkpoints, CLI."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from circuitlab import CircuitlabError, ConfigError
from circuitlab.cli import main
from circuitlab.training import RunConfig, TrainingDiverged, load_checkpoint, read_metrics, train

TINY = {
    "name": "tiny",
    "model": {"preset": "attn-only-1l", "d_model": 32, "n_heads": 2},
    "data": {"source": "stories", "n_stories": 150, "tokenizer": "char", "random_segment_frac": 0.5},
    "train": {"steps": 20, "batch_size": 8, "seq_len": 32, "lr": 3e-3, "warmup_steps": 4, "eval_every": 10,
              "eval_batches": 2, "ckpt_every": 10, "track_every": 10, "log_every": 1},
}


def tiny(tmp_path, **train_overrides) -> RunConfig:
    data = json.loads(json.dumps(TINY))
    data["data"]["cache_dir"] = str(tmp_path / "cache")
    data["train"].update(train_overrides)
    return RunConfig.from_dict(data)


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(out) if "loss" in r]


def test_resume_continues_the_identical_loss_curve(tmp_path):
    straight = train(tiny(tmp_path), tmp_path / "a", progress=False)
    train(tiny(tmp_path), tmp_path / "b", progress=False, stop_at=10)
    assert len(losses(tmp_path / "b")) == 10
    resumed = train(tiny(tmp_path), tmp_path / "b", resume=True, progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # loss by loss, exactly
    assert len(losses(tmp_path / "b")) == 20
    for (k, v), w in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(v, w), k


def test_training_lowers_loss_and_tracks_the_callers_probes(tmp_path):
    seen = []

    def probe(model, data):  # the trainer runs it in eval mode, at step 0 and every track_every steps
        seen.append(model.training)
        return {"probe_calls": len(seen), "n_val_tokens": len(data.val)}

    result = train(tiny(tmp_path, steps=30, lr=1e-2), tmp_path / "r", progress=False,
                   track=[probe, lambda model, data: {"weight_norm": float(model.embed.weight.norm())}])
    curve = losses(tmp_path / "r")
    assert sum(curve[-5:]) / 5 < curve[0] - 0.2
    tracked = [r for r in read_metrics(tmp_path / "r") if "probe_calls" in r]
    assert [r["step"] for r in tracked] == [0, 10, 20, 30] and [r["probe_calls"] for r in tracked] == [1, 2, 3, 4]
    assert seen == [False] * 4 and all(r["weight_norm"] > 0 and r["n_val_tokens"] > 0 for r in tracked)
    assert result.model.training is False
    evals = [r for r in read_metrics(tmp_path / "r") if "val_loss" in r]
    assert math.isclose(evals[-1]["val_ppl"], math.exp(evals[-1]["val_loss"]), rel_tol=1e-3)
    assert (tmp_path / "r" / "best" / "model.safetensors").is_file()
    assert result.tokens_seen == 30 * 8 * 32


def test_grad_accumulation_matches_one_big_batch(tmp_path):
    train(tiny(tmp_path, steps=6), tmp_path / "one", progress=False)
    train(tiny(tmp_path, steps=6, grad_accum=4), tmp_path / "acc", progress=False)
    for a, b in zip(losses(tmp_path / "one"), losses(tmp_path / "acc")):
        assert abs(a - b) < 1e-4


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


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg = tiny(tmp_path, steps=30, lr=1e4, grad_clip=0.0, warmup_steps=1, ckpt_every=1)
    with pytest.raises(TrainingDiverged, match="diverged"):
        train(cfg, tmp_path / "nan", progress=False)
    model, tokenizer, _ = load_checkpoint(tmp_path / "nan")
    assert tokenizer is not None
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_checkpoint_roundtrip_and_errors(tmp_path):
    result = train(tiny(tmp_path, steps=3), tmp_path / "r", progress=False)
    model, tokenizer, meta = load_checkpoint(tmp_path / "r")
    t = torch.tensor([tokenizer.encode("Once upon a time")])
    torch.testing.assert_close(model(t), result.model(t))
    assert meta["run"]["name"] == "tiny"
    with pytest.raises(CircuitlabError, match="not found"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "r" / "checkpoint" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CircuitlabError, match="corrupt"):
        load_checkpoint(tmp_path / "r" / "checkpoint")
    with pytest.raises(CircuitlabError, match="already holds a checkpoint"):
        train(tiny(tmp_path, steps=3), tmp_path / "r", progress=False)


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="train.lr"):
        RunConfig.from_dict({"train": {"lr": "fast"}})
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        RunConfig.from_dict({"train": {"step": 3}})
    with pytest.raises(ConfigError, match="seq_len"):
        RunConfig.from_dict({"model": {"preset": "attn-only-1l", "n_ctx": 16}, "train": {"seq_len": 32}}).model_config(10)


@pytest.mark.parametrize("name", ["demo", "attn-only-1l", "attn-only-8l", "quick", "small", "medium", "mlp-4l"])
def test_bundled_configs_parse(name):
    from circuitlab.training.configs import resolve_config

    run = RunConfig.load(resolve_config(name))
    cfg = run.model_config(d_vocab=1000)
    assert cfg.n_ctx >= run.train.seq_len


def test_cli_train_generate_and_bad_input(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny(tmp_path, steps=4).to_dict()))
    out = str(tmp_path / "cli")
    assert main(["train", "--config", str(path), "--out", out, "--no-progress", "--set", "train.lr=1e-3"]) == 0
    assert main(["generate", "--checkpoint", out, "--prompt", "Once", "--max-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("Once")
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert main(["train", "--config", str(path), "--set", "train.steps=abc"]) == 2
    assert main(["train", "--config", str(path), "--set", "data.tokenizer=klingon", "--out", str(tmp_path / "k")]) == 2
    assert main(["generate", "--checkpoint", str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    assert main(["generate", "--checkpoint", out, "--prompt", "x" * 40]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 5


def test_bf16_autocast_trains(tmp_path):
    half = train(tiny(tmp_path, steps=4, bf16=True), tmp_path / "bf16", progress=False).model
    full = train(tiny(tmp_path, steps=4), tmp_path / "fp32", progress=False).model
    curve = losses(tmp_path / "bf16")
    assert len(curve) == 4 and all(math.isfinite(x) for x in curve)
    # Autocast really ran: bf16 matmuls give other gradients, so other (but close, fp32) weights.
    w_half, w_full = half.W_E.detach(), full.W_E.detach()
    assert w_half.dtype == torch.float32 and not torch.equal(w_half, w_full)
    torch.testing.assert_close(w_half, w_full, atol=1e-2, rtol=0)
