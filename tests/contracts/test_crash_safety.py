"""Nothing lost: a torn metrics line, a crash between a checkpoint save's two renames, Ctrl-C before the
first checkpoint, outputs over another run's files, and the permissions of atomically written files.
Each crash is injected at the exact point a kill would hit."""
import os
import signal
import stat

import pytest
import torch
from training.test_trainer import losses, tiny

import circuitlab.atomic as atomic
from circuitlab.cli import main
from circuitlab.errors import CircuitlabError
from circuitlab.training import TrainingInterrupted, load_checkpoint, read_metrics, save_checkpoint, train
from circuitlab.training import trainer as trainer_module

pytestmark = pytest.mark.usefixtures("one_thread")


def _same_weights(a, b) -> None:
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run every recovery must reproduce exactly."""
    tmp = tmp_path_factory.mktemp("straight")
    return tmp, train(tiny(tmp), tmp / "run", progress=False)


def test_a_torn_last_metrics_line_is_dropped_once_and_resume_continues(straight, tmp_path):
    tmp, reference = straight
    run = tmp_path / "run"
    train(tiny(tmp), run, progress=False, stop_at=10)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "tokens": 28')  # a kill in the middle of an append
    with pytest.warns(UserWarning, match="torn last line"):
        assert [r["step"] for r in read_metrics(run)][-1] == 10
    with pytest.warns(UserWarning, match="torn last line"):
        resumed = train(tiny(tmp), run, resume=True, progress=False)
    assert losses(run) == losses(tmp / "run")  # the torn record is gone, the curve continues exactly
    _same_weights(reference.model, resumed.model)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(CircuitlabError, match="line 2 is damaged"):  # not what a crash leaves
        read_metrics(run)


def _crash_between_renames(monkeypatch):
    """Make the next checkpoint save die after renaming the old folder aside, before renaming the new one in."""
    real = os.replace

    def replace(src, dst):
        if ".tmp-" in str(src) and os.path.isdir(src):
            raise KeyboardInterrupt("killed between the renames")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)


def test_a_crash_between_the_renames_keeps_the_last_checkpoint_found_and_safe(straight, tmp_path, monkeypatch,
                                                                              capsys):
    tmp, reference = straight
    run = tmp_path / "run"
    partial = train(tiny(tmp), run, progress=False, stop_at=10)
    with monkeypatch.context() as m:
        _crash_between_renames(m)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(run / "checkpoint", partial.model, partial.tokenizer, state={"step": 10})
    assert not (run / "checkpoint").exists() and (run / "checkpoint.old").is_dir()
    with pytest.warns(UserWarning, match="checkpoint.old"):  # generate / serve / interpret read it
        model, _, _ = load_checkpoint(run)
    _same_weights(partial.model, model)
    # a plain `train` into the folder must not delete it
    assert main(["train", "--config", str(_config(tmp, tmp_path)), "--out", str(run), "--no-progress"]) == 2
    assert "already holds a checkpoint; pass --resume" in capsys.readouterr().err
    assert (run / "checkpoint.old").is_dir() and len(losses(run)) == 10
    # resuming finds it, and a later save leaves no .old behind
    with pytest.warns(UserWarning, match="checkpoint.old"):
        resumed = train(tiny(tmp), run, resume=True, progress=False)
    _same_weights(reference.model, resumed.model)
    assert (run / "checkpoint").is_dir() and not (run / "checkpoint.old").exists()


def _config(tmp, tmp_path):
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny(tmp).to_dict()))
    return path


def test_ctrl_c_before_the_first_checkpoint_saves_one_that_resumes_exactly(straight, tmp_path, monkeypatch):
    tmp, reference = straight
    run = tmp_path / "run"
    real_lr_at = trainer_module.lr_at

    def lr_at(step, *args):
        if step == 3:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C in the middle of step 3; ckpt_every is 10
        return real_lr_at(step, *args)

    monkeypatch.setattr(trainer_module, "lr_at", lr_at)
    with pytest.raises(TrainingInterrupted,
                       match=r"stopped at step 4 and saved .*checkpoint; continue with train\(\.\.\., resume=True\)"):
        train(tiny(tmp), run, progress=False)
    monkeypatch.setattr(trainer_module, "lr_at", real_lr_at)
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3, 4]
    resumed = train(tiny(tmp), run, resume=True, progress=False)
    assert losses(run) == losses(tmp / "run")
    _same_weights(reference.model, resumed.model)


@pytest.mark.parametrize("second", [False, True], ids=["ctrl-c", "ctrl-c-twice"])
def test_interrupted_train_command_says_the_last_checkpoint_and_the_command_to_continue(tmp_path, capsys,
                                                                                       monkeypatch, second):
    """One Ctrl-C: the step finishes and is saved. Twice (the second stops mid-step): the checkpoint of step 10
    stands. Either way the one line says the step of the last checkpoint and the command that continues."""
    config, run = _config(tmp_path, tmp_path), tmp_path / "run"
    real_lr_at = trainer_module.lr_at

    def lr_at(step, *args):
        if step == 12:  # ckpt_every is 10
            if second:
                raise KeyboardInterrupt  # what the second Ctrl-C raises, mid-step
            signal.raise_signal(signal.SIGINT)
        return real_lr_at(step, *args)

    monkeypatch.setattr(trainer_module, "lr_at", lr_at)
    assert main(["train", "--config", str(config), "--out", str(run), "--no-progress"]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    saved = "stopped at step 12; the last checkpoint (" if second else "stopped at step 13 and saved "
    assert saved in line and str(run / "checkpoint") in line, line
    assert ") is at step 10;" in line if second else "is at step" not in line
    assert line.endswith(f"continue with: circuitlab train --config {config} --out {run} --no-progress --resume"), line
    monkeypatch.setattr(trainer_module, "lr_at", real_lr_at)
    assert main(["train", "--config", str(config), "--out", str(run), "--no-progress", "--resume"]) == 0
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == list(range(1, 21))


def test_resume_without_a_checkpoint_says_what_to_do(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["train", "--config", str(_config(tmp_path, tmp_path)), "--out", str(tmp_path / "run"),
                 "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint to resume" in err and "run without --resume" in err and len(err.strip().splitlines()) == 1


def test_train_refuses_a_folder_holding_another_runs_files(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.html").write_text("<html>the demo's report</html>")
    assert main(["train", "--config", str(_config(tmp_path, tmp_path)), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds other files (report.html)" in err and len(err.strip().splitlines()) == 1
    assert (out / "report.html").read_text() == "<html>the demo's report</html>"
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomic_writes_get_the_permissions_of_a_plain_write(tmp_path, umask):
    from circuitlab.config import ModelConfig
    from circuitlab.model import Transformer

    old = os.umask(umask)
    try:
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
        (tmp_path / "plain_dir").mkdir()
        atomic.atomic_write_text(tmp_path / "atomic.txt", "x")
        save_checkpoint(tmp_path / "ckpt", Transformer(ModelConfig.from_preset("attn-only-1l", d_vocab=11)))
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(tmp_path / "atomic.txt") == mode(tmp_path / "plain.txt") == 0o666 & ~umask
    assert mode(tmp_path / "ckpt") == mode(tmp_path / "plain_dir") == 0o777 & ~umask
    assert {mode(p) for p in (tmp_path / "ckpt").iterdir()} == {0o666 & ~umask}


def test_rerunning_a_finished_train_is_never_called_unfinished(straight, tmp_path, capsys):
    tmp, reference = straight
    argv = ["train", "--config", str(_config(tmp, tmp_path)), "--out", str(tmp / "run"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"already holds a checkpoint of a finished run ({reference.steps} steps)" in err, err
    assert "pass --resume to continue" not in err and len(err.splitlines()) == 1
    assert main([*argv, "--resume"]) == 2
    assert f"already finished {reference.steps} steps" in capsys.readouterr().err
