"""The demo end to end on a tiny budget, and the causal-evidence summary it writes."""
import json
import re

import pytest

from circuitlab.experiments.demo import DemoOptions, causal_evidence, run_induction_demo
from circuitlab.report.markdown import causal_paragraph


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    run_induction_demo(DemoOptions(out=out, steps_2l=12, steps_1l=4, progress=False))
    return out


def test_demo_writes_checkpoints_results_figures_and_report(demo_dir):
    for name in ("2l", "1l"):
        assert (demo_dir / name / "checkpoint").is_dir()
        assert (demo_dir / name / "metrics.jsonl").stat().st_size > 0
    results = json.loads((demo_dir / "results.json").read_text())
    two, one = results["models"]["2l"], results["models"]["1l"]
    assert (two["n_layers"], one["n_layers"]) == (2, 1)
    assert len(two["heads"]) == 2 * len(one["heads"]) and {"induction_score", "labels"} <= set(two["heads"][0])
    assert {"circuits", "logit_lens", "patching", "ablation"} <= set(results["analysis"])
    assert "causal_evidence" in results
    for fname in results["figures"].values():
        assert (demo_dir / fname).is_file(), fname
    report = (demo_dir / "report.md").read_text()
    assert "## Heads" in report and "**Contrast.**" in report
    html = (demo_dir / "report.html").read_text()
    sections = re.findall(r'<section id="([^"]+)"', html)
    assert sections == ["model-card", "summary", "training", "heads", "induction-by-period", "attention", "circuits",
                        "logit-lens", "patching", "ablation"]
    assert "## Induction by period" in report and "| 32 | " in report  # every period 4..n_ctx/2, both models
    sweep = two["induction_by_period"]
    assert sweep["periods"] == list(range(4, 33)) and len(sweep["best"]) == 29
    wall = results["wall_seconds"]
    rounding = 0.05 + 0.05 * (wall["gflops"] + wall["total"]) / 150  # each of the three is rounded to 0.1
    assert wall["gflops"] > 0 and wall["total_at_150_gflops"] == pytest.approx(wall["total"] * wall["gflops"] / 150,
                                                                                abs=rounding + 1e-9)
    records = [json.loads(line) for line in (demo_dir / "2l" / "metrics.jsonl").read_text().splitlines()]
    assert {"icl", "induction_by_period", "repeat_loss_by_period"} <= set(records[0])
    assert "<script src" not in html and html.count("Plotly.newPlot") >= 5


def test_causal_evidence_reads_recovery_paths_and_ablation():
    found = {"induction_heads": ["L1H0", "L1H1"], "previous_token_heads": ["L0H2"]}
    head_out = {"clean_value": -1.0, "corrupt_value": -5.0,
                "values": [[-5.0, -5.0, -3.0], [-2.0, -4.0, -5.0]]}
    nan = float("nan")
    paths = {inp: {"receiver": "L1H0", "clean_value": -1.0, "corrupt_value": -5.0,
                   "values": [[nan, nan, value], [nan, nan, nan]]}
             for inp, value in (("q", -1.0), ("k", -3.0), ("v", -1.4))}
    analysis = {"patching": {"patching": {"head_out": head_out}, "path_patching": paths},
                "ablation": {"group": {"heads": ["L1H0", "L1H1"], "repeated_loss": [2.0, 5.0],
                                       "first_half_loss": [7.0, 7.1]}}}
    evidence = causal_evidence(found, analysis)
    assert evidence["patching_recovery"] == {"L1H0": 0.75, "L1H1": 0.25, "L0H2": 0.5}
    assert evidence["path_patching"]["fraction_of_gap"] == {"q": 0.0, "k": 0.5, "v": 0.1}
    assert evidence["path_patching"]["other_induction_heads"] == ["L1H1"]
    text = "\n".join(causal_paragraph(evidence))
    assert "L1H0 75%" in text and "K-composition" in text and "from 2.00 to 5.00" in text
    assert causal_paragraph({}) == []


def test_the_narrative_of_a_demo_that_formed_no_induction_heads_claims_nothing_it_did_not_show():
    from circuitlab.report.markdown import demo_narrative

    def model(n_layers, repeat_loss):
        return {"n_layers": n_layers, "steps": 5, "tokens_seen": 1000, "best_val_loss": 6.25, "phase_change": None,
                "induction_heads": [], "previous_token_heads": [], "induction_evidence": [], "rejected": [],
                "repeat_loss": repeat_loss, "heads": [{"induction_score": 0.01}]}

    group = {"heads": ["L1H0"], "repeated_loss": [6.251, 6.252], "first_half_loss": [6.25, 6.25]}
    head_out = {"clean_value": -6.25, "corrupt_value": -6.27, "values": [[-6.26], [-6.25]], "gap_noise": 0.0}
    evidence = causal_evidence({"induction_heads": [], "previous_token_heads": ["L0H0"]},
                               {"patching": {"patching": {"head_out": head_out}}, "ablation": {"group": group}})
    assert "patching_recovery" not in evidence and "within noise" in evidence["patching_noise"]
    text = "\n".join(demo_narrative({"models": {"2l": model(2, 6.25), "1l": model(1, 6.25)},
                                     "causal_evidence": evidence}))
    assert "One layer cannot compose" not in text and "raises" not in text
    assert "formed no induction head either" in text and "No induction head" in text
    assert "stayed at about 6.25" in text and "recovery fractions are meaningless" in text
    # The positive case keeps its sentence.
    two, one = model(2, 1.0), model(1, 6.25)
    two["induction_heads"] = ["L1H0"]
    assert "One layer cannot compose" in "\n".join(demo_narrative({"models": {"2l": two, "1l": one}}))


def test_the_demo_keeps_an_earlier_demo_renamed_and_refuses_other_files(tmp_path, monkeypatch, capsys):
    import circuitlab.experiments.demo as demo
    from circuitlab.errors import CircuitlabError

    class Stop(Exception):
        pass

    def stop():
        raise Stop  # right after the output folder is prepared: no training

    monkeypatch.setattr(demo, "work_gflops", stop)
    out = tmp_path / "demo"
    (out / "2l").mkdir(parents=True)
    (out / "results.json").write_text("{}")
    with pytest.raises(Stop):
        run_induction_demo(DemoOptions(out=out, progress=False))
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("demo.")]
    assert len(kept) == 1 and (kept[0] / "results.json").is_file() and "moved the previous demo" in capsys.readouterr().out
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(CircuitlabError, match="already holds other files"):
        run_induction_demo(DemoOptions(out=other, progress=False))
    assert (other / "notes.txt").read_text() == "keep me"


def test_an_interrupted_demo_says_the_command_that_continues_it_and_that_command_does(demo_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    """Ctrl-C in the demo's second model: the line's command (with --resume, which `circuitlab demo` accepts)
    continues it; a resume with other steps is refused before any training; a finished demo is said finished."""
    import shutil
    import signal

    import circuitlab.experiments.demo as demo
    import circuitlab.training.trainer as trainer_module
    from circuitlab.cli import main
    from circuitlab.experiments.demo import DemoResult
    from circuitlab.training.checkpoint import read_trainer_state

    # the analysis is the fixture's (tested above); here only the stages around it
    monkeypatch.setattr(demo, "analyse_models", lambda runs, out: DemoResult({}, figures={"steps": {n: r.steps for n, r in
                                                                                                   runs.items()}}))
    monkeypatch.setattr(demo, "write_outputs", lambda *a: None)

    out = tmp_path / "demo"
    shutil.copytree(demo_dir, out)
    shutil.rmtree(out / "1l")
    (out / "results.json").unlink()
    argv = ["demo", "--out", str(out), "--steps", "12", "--steps-1l", "4", "--no-progress", "--resume"]
    real = trainer_module.lr_at
    monkeypatch.setattr(trainer_module, "lr_at", lambda step, *a: (signal.raise_signal(signal.SIGINT)
                                                                    if step == 1 else None, real(step, *a))[1])
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert "the model in" in captured.out and "already finished 12 steps; reusing it" in captured.out   # 2l reused
    line = captured.err.strip().splitlines()[-1]
    assert line == (f"circuitlab demo: interrupted: stopped at step 2 and saved {out / '1l' / 'checkpoint'}; "
                    f"continue with: circuitlab {' '.join(argv)}"), line
    monkeypatch.setattr(trainer_module, "lr_at", real)
    before = read_trainer_state(out / "1l" / "checkpoint")["step"]
    wrong = [a if a != "4" else "6" for a in argv]
    assert main(wrong) == 2                                          # another plan: refused before training
    err = capsys.readouterr().err.strip()
    assert "--steps-1l (4 -> 6)" in err and len(err.splitlines()) == 1
    assert read_trainer_state(out / "1l" / "checkpoint")["step"] == before
    assert main(argv) == 0                                           # the printed command continues it
    assert read_trainer_state(out / "1l" / "checkpoint")["step"] == 4
    assert json.loads((out / "results.json").read_text())["figures"]["steps"] == {"2l": 12, "1l": 4}
    assert main(argv) == 0                                           # and rerunning the finished demo says so
    said = capsys.readouterr().out
    assert f"the demo in {out} is finished" in said and "unfinished" not in said


def test_the_demo_flags_the_class_and_a_config_agree():
    """Every flag of `circuitlab demo` is a field of DemoOptions; no flag given is the class's defaults (and an empty
    config's); the flags read back into the options run_induction_demo takes."""
    import argparse
    from dataclasses import fields

    from circuitlab.commands import demo as demo_command

    p = argparse.ArgumentParser(exit_on_error=False)
    demo_command.add_arguments(p)
    assert [a.dest for a in p._actions if a.dest != "help"] == [f.name for f in fields(DemoOptions)]
    defaults = DemoOptions().check()
    assert DemoOptions.from_args(p.parse_args([])) == defaults == DemoOptions.from_dict({})
    assert (defaults.out, defaults.steps_2l, defaults.steps_1l, defaults.resume, defaults.progress) == (
        "runs/demo", None, 300, False, True)
    got = DemoOptions.from_args(p.parse_args(["--out", "o", "--steps", "12", "--steps-1l", "4", "--resume",
                                              "--no-progress"]))
    assert got == DemoOptions(out="o", steps_2l=12, steps_1l=4, resume=True, progress=False)
    assert DemoOptions.from_dict(got.to_dict()) == got


@pytest.mark.parametrize("flag, field", [("--steps", "steps_2l"), ("--steps-1l", "steps_1l")])
def test_a_bad_demo_value_is_refused_by_the_command_line_and_check_with_one_rule(tmp_path, capsys, flag, field):
    """The rule COUNT, in each front end's words; the Python API refuses before anything is written."""
    from circuitlab.cli import main
    from circuitlab.errors import ConfigError, InputError

    out = tmp_path / "demo"
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(out), flag, "0"])
    assert f"argument {flag}: must be a whole number >= 1, got '0'" in capsys.readouterr().err
    with pytest.raises(InputError, match=f"^{field} must be a whole number >= 1, got 0$"):
        run_induction_demo(DemoOptions(out=out, **{field: 0}))
    with pytest.raises(ConfigError, match=f"^{field} must be a whole number >= 1, got 0$"):
        DemoOptions.from_dict({field: 0})
    assert not out.exists()
