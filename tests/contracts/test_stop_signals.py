"""The termination signal (SIGTERM: `kill`, a scheduler, `docker stop`) does what Ctrl-C does, for every command:
a training loop finishes its step, saves and says the command that continues; a stage with nothing saved says
the same command starts over. Exit status 128 + the signal (143; Ctrl-C 130). Sent from outside to a real
`circuitlab` process here; the sae and graphs demo cases are in tests/contracts/test_long_jobs.py and tests/experiments/test_graphs_demo.py."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from training.test_trainer import tiny

from circuitlab.cli import main
from circuitlab.training import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
STEPS = 40

# `circuitlab` with each training step slowed down, so that a signal from outside lands mid-run
_SLOW = """
import sys, time
import circuitlab.training.trainer as T
real = T.lr_at
T.lr_at = lambda *a: (time.sleep(0.05), real(*a))[1]
from circuitlab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _steps(run):
    return [r["step"] for r in read_metrics(run) if "loss" in r]


def test_sigterm_from_outside_saves_and_says_the_command_that_continues(tmp_path, capsys):
    config, run = tmp_path / "tiny.yaml", tmp_path / "run"
    config.write_text(yaml.safe_dump(tiny(tmp_path, steps=STEPS, ckpt_every=1000).to_dict()))
    argv = ["train", "--config", str(config), "--out", str(run), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").is_file() and len(_steps(run)) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("circuitlab train: terminated: stopped at step ") and " and saved " in line, line
    assert line.endswith(f"continue with: circuitlab train {' '.join(argv[1:])} --resume"), line
    assert "the termination signal: stopping after this step to save a checkpoint" in err
    stopped = _steps(run)[-1]
    assert 3 <= stopped < STEPS and f"stopped at step {stopped} and saved" in line
    assert main([*argv, "--resume"]) == 0                         # the printed command continues it
    assert _steps(run) == list(range(1, STEPS + 1))              # each step exactly once


def test_a_stop_where_nothing_is_saved_says_the_same_command_starts_over(tmp_path, capsys, monkeypatch):
    import circuitlab.methods.graph as graph_experiment

    def stopping(signum):
        def attribute(*args, **kwargs):
            signal.raise_signal(signum)
            raise AssertionError("the signal did not stop the command")
        return attribute

    argv = ["graph", "--planted", "--prompt", "xAxBxyx", "--out", str(tmp_path / "g"), "--dashboard-tokens", "0"]
    for signum, how in ((signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")):
        monkeypatch.setattr(graph_experiment, "attribute", stopping(signum))
        assert main(argv) == 128 + signum
        err = capsys.readouterr().err.strip()
        assert err == (f"circuitlab graph: {how}: stopped before anything was saved; the same command starts over: "
                       f"circuitlab {' '.join(argv)}"), err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL     # the command's handler is gone after it


def test_the_explorer_stops_on_sigterm_and_says_how_to_start_it_again():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["serve", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "circuitlab.cli", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == (f"circuitlab serve: terminated: the explorer stopped; start it again with: "
                                            f"circuitlab {' '.join(argv)}"), err
