"""Training: exact resume, DDP equivalence, accumulation, NaN stop, checkpoints, CLI.

(Its tests of other modules moved with issue 38: tests/commands/test_train.py,
tests/training/test_checkpoint.py, tests/training/test_config.py, tests/training/test_distributed.py.)"""
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


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg = tiny(tmp_path, steps=30, lr=1e4, grad_clip=0.0, warmup_steps=1, ckpt_every=1)
    with pytest.raises(TrainingDiverged, match="diverged"):
        train(cfg, tmp_path / "nan", progress=False)
    model, tokenizer, _ = load_checkpoint(tmp_path / "nan")
    assert tokenizer is not None
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_bf16_autocast_trains(tmp_path):
    half = train(tiny(tmp_path, steps=4, bf16=True), tmp_path / "bf16", progress=False).model
    full = train(tiny(tmp_path, steps=4), tmp_path / "fp32", progress=False).model
    curve = losses(tmp_path / "bf16")
    assert len(curve) == 4 and all(math.isfinite(x) for x in curve)
    # Autocast really ran: bf16 matmuls give other gradients, so other (but close, fp32) weights.
    w_half, w_full = half.W_E.detach(), full.W_E.detach()
    assert w_half.dtype == torch.float32 and not torch.equal(w_half, w_full)
    torch.testing.assert_close(w_half, w_full, atol=1e-2, rtol=0)


def test_the_train_flags_the_class_and_a_config_agree(tmp_path, capsys):
    """Every flag of `circuitlab train` is a field of TrainOptions (--set: overrides); no flag but --config is the
    class's defaults (and a config's); train()'s keyword defaults are the class's; the config is required by the
    command line and by check() alike; the options load the run config the command trains."""
    import argparse
    import inspect
    from dataclasses import fields

    from circuitlab.commands import train as train_command
    from circuitlab.errors import InputError
    from circuitlab.training import TrainOptions

    p = argparse.ArgumentParser(exit_on_error=False)
    train_command.add_arguments(p)
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(TrainOptions)}
    args = p.parse_args(["--config", "demo"])
    assert TrainOptions.from_args(args) == TrainOptions(config="demo").check() == TrainOptions.from_dict(
        {"config": "demo"})
    assert args.overrides == list(TrainOptions.overrides) == []
    keywords = inspect.signature(train).parameters
    assert (keywords["resume"].default, keywords["progress"].default) == (TrainOptions.resume, TrainOptions.progress)
    got = TrainOptions.from_args(p.parse_args(["--config", "c.yaml", "--out", "o", "--resume", "--no-progress"]))
    assert got == TrainOptions(config="c.yaml", out="o", resume=True, progress=False)
    assert TrainOptions.from_dict(got.to_dict()) == got
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny(tmp_path).to_dict()))
    opts = TrainOptions(config=str(path), overrides=("train.lr=1e-3",))
    assert opts.load_config().train.lr == 1e-3 and opts.out_folder(opts.load_config()) == "runs/tiny"
    with pytest.raises(SystemExit):
        main(["train"])
    assert "the following arguments are required: --config" in capsys.readouterr().err
    with pytest.raises(InputError, match="^config is required$"):
        TrainOptions().check()
