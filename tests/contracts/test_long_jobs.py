"""Long jobs interrupted at any moment: `sae train` killed (SIGKILL) before and after its first checkpoint, or
stopped by Ctrl-C, leaves a folder the same command continues (--resume) or restarts; metrics.jsonl holds every
completed step exactly once; the result equals the uninterrupted run's; a resume with a setting that changes the
result is refused naming it. `lens train` likewise refuses a resume with other data settings."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import helpers
from circuitlab.cli import main
from circuitlab.data import stories_text
from circuitlab.training.run_log import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
STEPS = 24


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("long_jobs")
    helpers.save_char_checkpoint(root / "model", n_layers=1)
    data = {"model": str(root / "model"), "data": {"source": "stories", "n_stories": 100, "tokenizer": "char"},
            "store": {"seq_len": 16, "seqs_per_chunk": 8},
            "dictionaries": [{"architecture": "topk", "hook_name": "blocks.0.hook_resid_post", "d_sae": 32, "k": 4}],
            "train": {"steps": STEPS, "batch_size": 32, "eval_batches": 1, "ckpt_every": 8, "log_every": 1}}
    (root / "sae.yaml").write_text(yaml.safe_dump(data))
    assert main(_train(root, "straight")) == 0
    return root


def _train(root, out, *extra):
    return ["sae", "train", "--config", str(root / "sae.yaml"), "--out", str(root / out), "--no-progress", *extra]


def _weights(run):
    folder = next((run / "dictionaries").iterdir())
    return load_file(str(next(folder.glob("*.safetensors"))))


def _steps(run):
    return [r["step"] for r in read_metrics(run) if "dictionaries" in r]


_KILLER = """
import os, signal, sys
from circuitlab.dictionaries.train import DictionaryTrainer
step = DictionaryTrainer.train_step
def train_step(self, batch):
    if self.step == int(sys.argv[1]):
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    return step(self, batch)
DictionaryTrainer.train_step = train_step
from circuitlab.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _killed_at(root, out, step, sig="SIGKILL"):
    """`circuitlab sae train` in a subprocess, sent `sig` (SIGKILL by default) as it starts step `step` (after
    `step` steps). Returns stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", _KILLER, str(step), sig, *_train(root, out)], env=env,
                       capture_output=True, text=True, timeout=300)
    signum = getattr(signal, sig)
    assert r.returncode == (-signum if signum == signal.SIGKILL else 128 + signum), r.stderr[-2000:]
    return r.stderr


def test_sae_train_terminated_saves_the_step_and_says_how_to_resume(root):
    """SIGTERM (a scheduler, `docker stop`) does what Ctrl-C does: the step finishes, is saved, and the one line
    says the command that continues; resuming gives the uninterrupted run's weights."""
    err = _killed_at(root, "term", 5, "SIGTERM")
    line = err.strip().splitlines()[-1]
    assert line.startswith("circuitlab sae: terminated: stopped at step 6 and saved "), line
    assert line.endswith(" ".join(["continue with: circuitlab", *_train(root, "term"), "--resume"])), line
    assert main(_train(root, "term", "--resume")) == 0
    assert _steps(root / "term") == list(range(1, STEPS + 1))
    straight, resumed = _weights(root / "straight"), _weights(root / "term")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_sae_train_killed_after_a_checkpoint_resumes_exactly(root, capsys):
    _killed_at(root, "after", 13)  # checkpoint at step 8; steps 9..13 done, unsaved
    assert _steps(root / "after") == list(range(1, 14))  # written line by line: a kill keeps every completed step
    assert main(_train(root, "after")) == 2  # a plain rerun points at --resume
    assert "pass --resume" in capsys.readouterr().err
    assert main(_train(root, "after", "--resume")) == 0
    assert _steps(root / "after") == list(range(1, STEPS + 1))  # each step exactly once
    straight, resumed = _weights(root / "straight"), _weights(root / "after")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_sae_train_killed_before_its_first_checkpoint_restarts(root, capsys):
    import shutil

    _killed_at(root, "before", 5)
    assert _steps(root / "before") == [1, 2, 3, 4, 5] and not (root / "before" / "checkpoint").exists()
    shutil.copytree(root / "before", root / "before2")
    for out, extra in (("before", ()), ("before2", ("--resume",))):  # the same command, with or without --resume
        assert main(_train(root, out, *extra)) == 0
        assert "starting from step 0" in capsys.readouterr().out
        assert _steps(root / out) == list(range(1, STEPS + 1))
        straight, again = _weights(root / "straight"), _weights(root / out)
        assert all(torch.equal(straight[k], again[k]) for k in straight)


def test_ctrl_c_saves_says_where_and_how_to_resume(root, capsys, monkeypatch):
    from circuitlab.dictionaries.train import DictionaryTrainer

    step = DictionaryTrainer.train_step

    def train_step(self, batch):
        if self.step == 5:  # before the first periodic checkpoint
            signal.raise_signal(signal.SIGINT)
        return step(self, batch)

    monkeypatch.setattr(DictionaryTrainer, "train_step", train_step)
    assert main(_train(root, "ctrl_c")) == 130
    err = capsys.readouterr().err
    assert "stopped at step 6 and saved" in err and "--resume" in err and "circuitlab sae train" in err
    monkeypatch.setattr(DictionaryTrainer, "train_step", step)
    # a setting that changes the result is refused, naming it
    assert main(_train(root, "ctrl_c", "--resume", "--set", "train.lr=0.5")) == 2
    assert "train.lr (0.001 -> 0.5)" in capsys.readouterr().err
    assert main(_train(root, "ctrl_c", "--resume", "--set", "store.seq_len=8")) == 2
    assert "store.seq_len (16 -> 8)" in capsys.readouterr().err
    assert main(_train(root, "ctrl_c", "--resume", "--set", "train.log_every=2")) == 0  # logging is not the result
    assert _steps(root / "ctrl_c")[:6] == list(range(1, 7))
    straight, resumed = _weights(root / "straight"), _weights(root / "ctrl_c")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_rerunning_a_finished_sae_train_is_never_called_unfinished(root, capsys):
    assert main(_train(root, "straight")) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a finished run: pass --overwrite to replace it" in err and "unfinished" not in err, err


def test_non_finite_learning_rates_are_refused(root, capsys):
    for value in ("inf", "nan", "-1", "0", "true"):
        assert main(_train(root, f"lr_{value}", "--set", f"train.lr={value}")) == 2
        err = capsys.readouterr().err
        assert "train.lr must be a finite number > 0" in err and len(err.strip().splitlines()) == 1
        assert not (root / f"lr_{value}").exists()


def test_lens_train_interrupted_resumes_and_refuses_other_settings(root, capsys, monkeypatch):
    import circuitlab.analysis.lens.tuned as tl

    lens = ["lens", "train", "--checkpoint", str(root / "model"), "--out", str(root / "lens"), "--steps", "8",
            "--batches", "2", "--batch-size", "2", "--seq-len", "16", "--save-every", "100", "--no-progress"]
    calls = {"n": 0}
    real = tl._lens_log_probs

    def interrupting(model, resid):
        calls["n"] += 1
        if calls["n"] == 7:  # in step 3 (two calls a step): before any periodic save
            signal.raise_signal(signal.SIGINT)
        return real(model, resid)

    monkeypatch.setattr(tl, "_lens_log_probs", interrupting)
    assert main(lens) == 130
    err = capsys.readouterr().err
    assert "stopped at step 4 and saved" in err and "--resume" in err
    monkeypatch.setattr(tl, "_lens_log_probs", real)
    for option, value, named in (("--seq-len", "8", "--seq-len (16 -> 8)"), ("--batch-size", "1", "--batch-size (2 -> 1)"),
                                 ("--lr", "0.5", "lr (0.01 -> 0.5)")):
        changed = list(lens)
        if option in changed:
            changed[changed.index(option) + 1] = value
        else:
            changed += [option, value]
        assert main([*changed, "--resume"]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, err
    (root / "other.txt").write_text(stories_text(20, seed=5))
    assert main([*lens, "--resume", "--text", str(root / "other.txt")]) == 2
    assert "--text (None -> " in capsys.readouterr().err
    assert main([*lens, "--resume"]) == 0
    assert main([*lens, "--resume"]) == 2             # finished: never called unfinished
    err = capsys.readouterr().err
    assert "holds a finished tuned lens: nothing to resume" in err and "unfinished" not in err, err
    straight = ["lens", "train", *lens[2:]]
    straight[straight.index("--out") + 1] = str(root / "lens_straight")
    assert main(straight) == 0
    from circuitlab.analysis.lens.tuned import TunedLens

    a, b = TunedLens.load(root / "lens"), TunedLens.load(root / "lens_straight")
    assert torch.allclose(a.weight, b.weight, atol=1e-6) and torch.allclose(a.bias, b.bias, atol=1e-6)
    for value in ("inf", "nan", "0"):
        with pytest.raises(SystemExit):
            main([*lens, "--overwrite", "--lr", value])
        assert "argument --lr: must be a finite number > 0" in capsys.readouterr().err
