"""`circuitlab study`: every study into its folder, one report.html with a section each, resumed by study (a
finished one reused only with the same checkpoint and options), and the command line's one-line refusals."""
import json
import subprocess
import sys

import pytest

from circuitlab import ModelConfig
from circuitlab.studies import STUDIES, StudyRunOptions, run_studies
from circuitlab.studies.induction import InductionOptions
from circuitlab.studies.facts import FactsOptions
from circuitlab.studies.ioi import IOIOptions
from circuitlab.studies.lens import LensStudyOptions
from helpers import random_model, save_char_checkpoint
from word_tokenizer import WordTokenizer

SMALL = {"induction": InductionOptions(batch=2, period=4, ks=(1,), draws=2), "ioi": IOIOptions(prompts=4, circuit_size=2),
         "facts": FactsOptions(facts=2)}


def _small(tmp_path):
    """SMALL, and the lens study on a text file the word tokenizer reads."""
    text = tmp_path / "text.txt"
    text.write_text("When Mary and John went to the store, John gave a drink to Mary.\n" * 40)
    return {**SMALL, "lens": LensStudyOptions(text=str(text), train_sequences=4, held_out_sequences=4, lens_seq_len=8,
                                              lens_steps=2)}


def _model(tok):
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=tok.vocab_size, n_ctx=32, norm="rmsnorm",
                      positional="rotary", mlp="swiglu", d_mlp=32)
    return random_model(cfg, scale=2.0)


def test_all_writes_each_study_and_one_report_then_resumes_by_study(tmp_path, monkeypatch, one_thread):
    tok = WordTokenizer()
    model = _model(tok)
    small = _small(tmp_path)
    opts = StudyRunOptions("all", "tiny", out=str(tmp_path / "out"), progress=False)
    first = run_studies(opts, small, model=model, tokenizer=tok)
    assert list(first) == list(STUDIES) == ["induction", "ioi", "facts", "lens"]
    tmp_path = tmp_path / "out"
    for name in STUDIES:
        d = json.loads((tmp_path / name / "results.json").read_text())
        assert d["made_with"] == {"checkpoint": "tiny", "options": small[name].to_dict()}
        assert d["claims"] and all(set(c) == {"claim", "verdict", "holds"} for c in d["claims"])
        report = (tmp_path / name / "report.md").read_text()
        assert "| claim | what the numbers say | verdict |" in report
        for file in d["figures"].values():
            assert (tmp_path / name / file).is_file()
    page = (tmp_path / "report.html").read_text()
    assert all(f'id="{name}"' in page for name in STUDIES) and "Plotly.newPlot" in page
    assert "<table>" in page and "Reproducing Olsson et al. 2022" in page

    def refuse(*args, **kwargs):
        raise AssertionError("a finished study was run again")
    import dataclasses

    import circuitlab.studies.registry as registry
    # resumed with the same checkpoint and options: no study runs
    monkeypatch.setattr(registry, "STUDIES", {n: dataclasses.replace(s, run=refuse) for n, s in STUDIES.items()})
    again = run_studies(StudyRunOptions("all", "tiny", out=str(tmp_path), resume=True, progress=False), small,
                        model=model, tokenizer=tok)
    assert [c.to_dict() for c in again["ioi"].claims] == [c.to_dict() for c in first["ioi"].claims]
    # other options (or without --resume): the study runs again
    with pytest.raises(AssertionError, match="run again"):
        run_studies(StudyRunOptions("induction", "tiny", out=str(tmp_path), resume=True, progress=False),
                    {"induction": InductionOptions(batch=3, period=4, ks=(1,), draws=2)}, model=model, tokenizer=tok)
    with pytest.raises(AssertionError, match="run again"):
        run_studies(StudyRunOptions("ioi", "tiny", out=str(tmp_path), progress=False), SMALL, model=model,
                    tokenizer=tok)


def _cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "circuitlab.cli", "study", *argv], cwd=cwd, capture_output=True,
                          text=True)


def test_the_command_line_estimates_runs_and_refuses_in_one_line(tmp_path):
    save_char_checkpoint(tmp_path / "ck", n_ctx=64)
    done = _cli("all", "--checkpoint", "ck", "--estimate", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.count("estimate:") == len(STUDIES) == 4 and "all: ~" in done.stdout
    done = _cli("induction", "--checkpoint", "ck", "--out", "o", "--batch", "2", "--period", "4", "--ks", "1",
                "--draws", "2", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[holds]" in done.stdout or "[does not hold]" in done.stdout or "[undecided]" in done.stdout
    assert (tmp_path / "o" / "induction" / "results.json").is_file() and (tmp_path / "o" / "report.html").is_file()
    for argv, said in ((("nope", "--checkpoint", "ck"), "unknown study 'nope'"),
                       (("induction", "--checkpoint", "ck", "--period", "40"), "more than the model's context of 64"),
                       (("ioi", "--checkpoint", "ck"), "names are one token in this tokenizer")):
        done = _cli(*argv, "--no-progress", cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
