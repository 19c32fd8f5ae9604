"""`interpret` saves each experiment as it finishes: a Ctrl-C keeps the finished ones (and says how to go on),
--resume runs only the rest, and the resumed run's results.json equals an uninterrupted run's."""
import json

import pytest

from circuitlab.cli import main
from circuitlab.experiments.interpret import run_interpret
from circuitlab.methods import REGISTRY
from helpers import save_char_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

EXPERIMENTS = ["logit_lens", "attribution", "probing"]



@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    save_char_checkpoint(root / "model", n_layers=2, d_model=16, n_ctx=32)
    return root / "model"


def _stop_in(monkeypatch, name: str) -> list[int]:
    """Make experiment `name` raise KeyboardInterrupt (as a Ctrl-C would); returns a counter of its calls."""
    calls = []

    def stopped(*_, **__):
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(type(REGISTRY[name]), "run_with",
                        lambda self, *a, _orig=type(REGISTRY[name]).run_with, **k:
                        stopped() if self.name == name else _orig(self, *a, **k))
    return calls


def test_a_stopped_run_keeps_what_finished_and_resume_gives_the_uninterrupted_results(ckpt, tmp_path, capsys,
                                                                                          monkeypatch):
    whole = tmp_path / "whole"
    run_interpret(ckpt, whole, EXPERIMENTS, prompt="Lily saw a cat")
    expected = json.loads((whole / "results.json").read_text())

    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _stop_in(m, "attribution")
        with pytest.raises(KeyboardInterrupt, match=r"1 of 3 experiments finished and kept .*logit_lens.*"
                                                    r"run the rest \(attribution, probing\)"):
            run_interpret(ckpt, out, EXPERIMENTS, prompt="Lily saw a cat")
    kept = json.loads((out / "finished" / "logit_lens.json").read_text())
    assert kept["result"] == expected["logit_lens"] and (out / "logit_lens.png").is_file()
    partial = json.loads((out / "results.json").read_text())   # what finished reads as a report already
    assert partial["experiments"] == ["logit_lens"] and partial["unfinished"] == ["attribution", "probing"]
    assert (out / "report.md").is_file() and not (out / "report.html").exists()   # the html at the end
    assert not (out / "finished" / "attribution.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".running")]   # no scratch left behind

    capsys.readouterr()
    ran = []
    with monkeypatch.context() as m:   # the finished experiment is not run again
        orig = type(REGISTRY["logit_lens"]).run_with
        m.setattr(type(REGISTRY["logit_lens"]), "run_with", lambda self, *a, **k: (ran.append(self.name),
                                                                                     orig(self, *a, **k))[1])
        run_interpret(ckpt, out, EXPERIMENTS, resume=True, prompt="Lily saw a cat")
    assert ran == ["attribution", "probing"]
    assert "logit_lens (1 of 3): finished earlier, kept" in capsys.readouterr().out
    resumed = json.loads((out / "results.json").read_text())
    expected["checkpoint"] = resumed["checkpoint"]
    assert resumed == expected and "unfinished" not in resumed
    assert sorted(p.name for p in out.glob("*.png")) == sorted(p.name for p in whole.glob("*.png"))


def test_resume_runs_again_what_finished_with_other_inputs(ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    run_interpret(ckpt, out, ["logit_lens"], prompt="Lily saw a cat")
    first = json.loads((out / "results.json").read_text())["logit_lens"]
    capsys.readouterr()
    run_interpret(ckpt, out, ["logit_lens"], resume=True, prompt="the cat saw Lily")
    said = capsys.readouterr().out
    assert "finished earlier with other options; running it again" in said and "running logit_lens" in said
    found = json.loads((out / "results.json").read_text())["logit_lens"]
    assert found == json.loads((out / "finished" / "logit_lens.json").read_text())["result"]
    assert found["tokens"] != first["tokens"]


def test_the_command_says_how_to_resume_and_resume_is_a_flag(ckpt, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cli"
    argv = ["interpret", "--checkpoint", str(ckpt), "--experiments", "logit_lens", "attribution", "--prompt",
            "Lily saw", "--out", str(out)]
    with monkeypatch.context() as m:
        _stop_in(m, "attribution")
        assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("circuitlab interpret: interrupted: stopped; 1 of 2 experiments finished") and \
        err.endswith("--resume") and len(err.splitlines()) == 1
    assert main(argv + ["--resume"]) == 0
    assert json.loads((out / "results.json").read_text())["experiments"] == ["logit_lens", "attribution"]
    assert main(argv) == 0   # without --resume an earlier output is moved aside whole, as before
    assert "moved the previous results to" in capsys.readouterr().out
