"""`circuitlab forge compare`: the addition data source, the trained-vs-hand-built comparison, the command."""
import json
import re

import pytest
import torch

from circuitlab.cli import main
from circuitlab.config import ModelConfig
from circuitlab.data import AdditionTask, DataConfig, build_data, load_texts
from circuitlab.data.dataset import AdditionData
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.forge import build_carry_adder
from circuitlab.experiments.forge_compare import (CATEGORIES, addition_run_config, key_categories, position_labels,
                                      run_forge_compare, summarize_comparison)
from circuitlab.model import Transformer


# ---------------------------------------------------------------- the addition data source
def test_addition_source_rows_are_whole_problems_and_val_pairs_are_held_out():
    data = build_data(DataConfig(source="addition", seed=0))
    assert isinstance(data, AdditionData) and data.tokenizer.vocab_size == 11 and data.tokenizer.eos_id == 10
    assert data.tokenizer.encode("0123456789") == list(range(10))
    task = AdditionTask(2, 2)
    train = data.get_batch("train", 0, 256, 7)
    assert train.shape == (256, 8)
    assert torch.equal(train, data.get_batch("train", 0, 256, 7))          # a function of (seed, split, step)
    assert not torch.equal(train, data.get_batch("train", 1, 256, 7))
    for row in train.tolist():
        assert row == task.encode(row[0] * 10 + row[1], row[2] * 10 + row[3])
    val = data.get_batch("val", 0, 256, 7)

    def held_out(batch):
        return data.is_val(batch[:, 0] * 10 + batch[:, 1], batch[:, 2] * 10 + batch[:, 3])

    assert not held_out(train).any() and held_out(val).all()
    share = len(data._listed["val"]) / 10_000
    assert 0.03 < share < 0.07                                              # val_frac 0.05 of the pairs
    # ranks take contiguous shares of the global batch
    assert torch.equal(torch.cat([data.get_batch("train", 0, 256, 7, r, 2) for r in range(2)]), train)
    # beyond the enumerated sizes: rejection sampling keeps the same split
    big = build_data(DataConfig(source="addition:5:4", seed=3))
    rows = big.get_batch("val", 0, 64, 5 + 4 + 1 + 6 - 1)
    a = (rows[:, :5] * 10 ** torch.arange(4, -1, -1)).sum(1)
    b = (rows[:, 5:9] * 10 ** torch.arange(3, -1, -1)).sum(1)
    assert big.is_val(a, b).all() and (rows[:, 9] == 10).all()


@pytest.mark.parametrize("source, message", [("addition:0", "Bad addition source"), ("addition:2:x", "Bad addition"),
                                             ("addition:1:2:3", "Bad addition"), ("addition:10", "from 1 to 9")])
def test_bad_addition_sources_are_config_errors(source, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(source=source)


def test_addition_source_misuse_is_a_clear_error():
    data = build_data(DataConfig(source="addition:3:1"))
    with pytest.raises(ConfigError, match="set train.seq_len to 8"):
        data.get_batch("train", 0, 4, 7)
    with pytest.raises(ConfigError, match="random_segment_frac"):
        build_data(DataConfig(source="addition", random_segment_frac=0.5))
    with pytest.raises(ConfigError, match="leaves no val pairs"):
        build_data(DataConfig(source="addition:1", val_frac=0.001))
    with pytest.raises(ConfigError, match="not text"):
        next(load_texts("addition"))


# ---------------------------------------------------------------- the comparison
def test_positions_and_key_categories():
    assert position_labels(2, 2) == ["a1", "a0", "b1", "b0", "EOS", "s2", "s1"]
    cats = key_categories(2, 2)
    name = {i: c for i, c in enumerate(CATEGORIES)}
    # EOS predicts column 2: every digit is in a lower column; s2 predicts column 1; s1 column 0
    assert [name.get(int(c), "-") for c in cats[0]] == ["lower columns"] * 4 + ["EOS", "-", "-"]
    assert [name.get(int(c), "-") for c in cats[1]][:6] == ["a, same column", "lower columns", "b, same column",
                                                            "lower columns", "EOS", "answer digits"]
    assert [name.get(int(c), "-") for c in cats[2]][:4] == ["higher columns", "a, same column", "higher columns",
                                                            "b, same column"]


def test_hand_built_against_itself_agrees_fully():
    hand = build_carry_adder(2, 2)
    res = summarize_comparison(hand, hand.model, samples=200)
    assert res["accuracy"]["hand"]["accuracy"] == res["accuracy"]["trained"]["accuracy"] == 1.0
    assert res["accuracy"]["trained"]["exhaustive"] and res["accuracy"]["trained"]["total"] == 10_000
    for head, best in res["agreement"]["best_match"].items():
        assert best["head"] == head and best["agreement"] > 0.999
    ov = res["ov"]["input"]
    assert ov[0][0]["top_similarity"] > 0.999 and ov[0][0]["rank_hand"] == 1   # head a reads the digit value
    assert ov[2][2]["similarity"] is None                                     # the carry head reads no token
    prof = res["attention"]["hand"]
    assert prof["L0H0"]["mass"]["a, same column"] == pytest.approx(2 / 3, abs=1e-3)   # EOS stands in at the top
    assert prof["L0H1"]["mass"]["b, same column"] == pytest.approx(2 / 3, abs=1e-3)
    assert prof["L1H0"]["top_weight"] > 0.99
    assert prof["L0H0"]["variability"] < 1e-6 and prof["L1H0"]["variability"] > 0.05   # the carry lookup varies
    assert any("is matched by trained L0H0: attention agreement 1.00" in f for f in res["findings"])
    assert not any("No trained head" in f for f in res["findings"])
    json.dumps(res)


def test_random_model_gets_low_agreement_and_no_match():
    hand = build_carry_adder(2, 2)
    torch.manual_seed(0)
    random_model = Transformer(ModelConfig(n_layers=2, n_heads=2, d_model=64, d_vocab=11, n_ctx=7)).eval()
    res = summarize_comparison(hand, random_model, samples=200)
    assert res["accuracy"]["trained"]["accuracy"] < 0.05
    best = [b["agreement"] for b in res["agreement"]["best_match"].values()]
    assert max(best) < 0.35                    # near-uniform patterns against one-key patterns
    assert sum(f.startswith("No trained head attends like") for f in res["findings"]) == 3
    assert res["attention"]["trained"]["L0H0"]["top_weight"] < 0.4


# ---------------------------------------------------------------- the command
def test_forge_compare_end_to_end(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["forge", "compare", "--out", str(out), "--steps", "30", "--samples", "100", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "30 steps" in printed and "report.md" in printed
    res = json.loads((out / "results.json").read_text())
    for key in ("accuracy", "agreement", "merged_agreement", "ov", "attention", "example", "findings", "training",
                "positions", "figures"):
        assert key in res, key
    assert res["accuracy"]["hand"]["accuracy"] == 1.0 and res["accuracy"]["trained_heldout"]["total"] > 0
    assert res["agreement"]["heads_a"] == ["L0H0", "L0H1", "L1H0"] and len(res["agreement"]["heads_b"]) == 4
    assert res["agreement"]["query_positions"] == ["EOS", "s2", "s1"]
    assert set(res["attention"]["trained"]["L1H1"]["mass"]) == set(CATEGORIES)
    assert res["training"]["steps"] == 30 and not res["training"]["reused"]
    for name in ("attention_mean.png", "attention_example.png", "similarity.png", "training.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    assert "What the comparison found" in report and "## Attention agreement" in report
    assert res["findings"][0].split(";")[0] in report
    assert (out / "trained" / "checkpoint" / "model.safetensors").is_file()
    # same settings: the trained model is reused; other settings: a clear error unless --retrain
    assert main(["forge", "compare", "--out", str(out), "--steps", "30", "--samples", "50", "--no-progress"]) == 0
    assert json.loads((out / "results.json").read_text())["training"]["reused"]
    capsys.readouterr()
    assert main(["forge", "compare", "--out", str(out), "--steps", "31", "--no-progress"]) == 2
    assert "--retrain" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--digits", "0"], "digits must be a whole number from 1 to 9"),
    (["--digits", "2", "--digits-b", "12"], "digits of b must be"),
    (["--steps", "0"], "steps must be a positive"),
    (["--samples", "0"], "samples must be a whole number from 1 to 50000"),
    (["--samples", "50001"], "samples must be a whole number from 1 to 50000 (both models' attention"),
])
def test_forge_compare_bad_input_is_one_clear_line(argv, message, tmp_path, capsys):
    assert main(["forge", "compare", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x" / "trained").exists()


def test_forge_compare_out_must_be_a_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CircuitlabError, match="is a file"):
        run_forge_compare(f, steps=1, progress=False)


def test_run_config_is_the_trainers():
    run = addition_run_config(3, 1, steps=10, seed=4)
    assert run.data.source == "addition:3:1" and run.train.seq_len == 3 + 1 + 1 + 4 - 1
    assert run.model_config(11).n_ctx == run.train.seq_len and run.train.threads == 1


def _profile(mass: dict[str, float], top_weight: float, variability: float) -> dict:
    cats = ("a, same column", "b, same column", "lower columns", "higher columns", "EOS", "answer digits")
    return {"mass": {c: mass.get(c, 0.0) for c in cats}, "top_weight": top_weight, "variability": variability}


def test_findings_state_what_the_numbers_say():
    """findings() on a made-up comparison: each rule fires on the numbers built to trigger it."""
    from circuitlab.experiments.forge_findings import findings

    hand = {"L0H0": _profile({"a, same column": 1.0}, 1.0, 0.0), "L0H1": _profile({"b, same column": 1.0}, 1.0, 0.0),
            "L1H0": _profile({"lower columns": 1.0}, 1.0, 0.1)}
    trained = {"L0H0": _profile({"a, same column": 0.5, "b, same column": 0.5}, 0.4, 0.02),  # reads both
               "L0H1": _profile({"lower columns": 0.6, "higher columns": 0.4}, 0.4, 0.03),
               "L1H0": _profile({"EOS": 0.3, "answer digits": 0.3, "lower columns": 0.4}, 0.3, 0.5),
               "L1H1": _profile({"higher columns": 1.0}, 0.5, 0.01)}
    ov_cell = {"rank_hand": 1, "top_similarity": 0.1, "top_chance": 0.09, "digits_vs_eos_baseline": 0.7}
    results = {
        "accuracy": {"hand": {"correct": 100, "total": 100, "accuracy": 1.0, "exhaustive": True},
                     "trained": {"correct": 90, "total": 100, "accuracy": 0.9, "exhaustive": True},
                     "trained_heldout": {"correct": 5, "total": 10, "accuracy": 0.5}},
        "agreement": {"heads_a": list(hand), "heads_b": list(trained),
                      "agreement": [[0.3, 0.1, 0.1, 0.1], [0.3, 0.1, 0.1, 0.1], [0.1, 0.2, 0.9, 0.1]]},
        "merged_agreement": {"L0H0+L0H1": {"L0H0": 0.7, "L0H1": 0.1, "L1H0": 0.1, "L1H1": 0.1}},
        "attention": {"hand": hand, "trained": trained},
        "ov": {"input": [[ov_cell] * 4] * 3, "output": [[{"top_similarity": 0.1, "top_chance": 0.09}] * 4] * 3,
               "digit_value_share": {"hand": {"L0H0": 1.0, "L0H1": 1.0, "L1H0": None},
                                     "trained": {"L0H0": 0.95, "L0H1": 0.2, "L1H0": 0.1, "L1H1": None}}},
        "roles": {},
    }
    text = "\n".join(findings(results))
    assert "answers 90 of all 100 problems exactly (90.0%)" in text
    assert "part of what it learned is memorised pairs" in text                # held out 50% < 90%
    assert "Hand-built L1H0 is matched by trained L1H0: attention agreement 0.90" in text
    assert "No trained head attends like hand-built L0H0" in text
    assert "Trained L0H0 agrees 0.70 with the average of hand-built L0H0 and L0H1" in text
    assert "Trained L0H0 reads both digits of the answer's column in one head (a 0.50, b 0.50)" in text
    assert "layer 0 already attends to the digits of lower columns (attention mass 0.60" in text
    assert "largest weight averages 0.40, against 1.00" in text
    assert "Trained L1H0 change where they look" in text                        # variability 0.5 >= 0.1 + 0.1
    assert "Trained L1H1 matches no hand-built head" in text
    assert "and this one does not beat that" in text                            # 0.1 <= digits-vs-EOS 0.7
    assert "trained L0H0 reads the value much like the hand-built ones" in text
    assert "output similarity at most 0.10" in text


# ---------------------------------------------------------------- `forge compare`'s options, declared once
def _compare_parser():
    import argparse

    from circuitlab.commands import forge as forge_command

    p = argparse.ArgumentParser(exit_on_error=False)
    forge_command.add_arguments(p)
    return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices["compare"]


def test_compare_flags_the_class_a_config_and_the_python_keywords_agree():
    import inspect
    from dataclasses import fields

    from circuitlab.experiments.forge_compare import DEFAULT_STEPS, ForgeCompareOptions
    from circuitlab.spec import schema

    p = _compare_parser()
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(ForgeCompareOptions)}
    defaults = ForgeCompareOptions().check()
    assert ForgeCompareOptions.from_args(p.parse_args([])) == defaults == ForgeCompareOptions.from_dict({})
    assert defaults.steps == DEFAULT_STEPS and defaults.out == "runs/forge-compare"
    props = schema(ForgeCompareOptions)["properties"]
    assert all(props[f.name]["default"] == f.default for f in fields(ForgeCompareOptions))
    assert props["digits"]["maximum"] == 9 and props["samples"]["maximum"] == 50_000
    keywords = inspect.signature(run_forge_compare).parameters   # the Python keywords are the flags
    assert {k: v.default for k, v in keywords.items()} == defaults.to_dict()
    summary = inspect.signature(summarize_comparison).parameters
    assert (summary["samples"].default, summary["seed"].default) == (defaults.samples, defaults.seed)
    got = ForgeCompareOptions.from_args(p.parse_args(["--out", "o", "--digits", "3", "--digits-b", "1", "--steps", "7",
                                                      "--seed", "2", "--samples", "5", "--retrain", "--no-progress"]))
    assert got == ForgeCompareOptions("o", 3, 1, 7, 2, 5, True, False)
    assert ForgeCompareOptions.from_dict(got.to_dict()) == got


@pytest.mark.parametrize("flag, text, field, value, said", [
    ("--digits", "10", "digits", 10, "digits must be a whole number from 1 to 9 (the addition data's limit), got 10"),
    ("--digits-b", "0", "digits_b", 0, "digits of b must be a whole number from 1 to 9"),
    ("--steps", "0", "steps", 0, "steps must be a positive whole number, got 0"),
    ("--samples", "50001", "samples", 50_001, "samples must be a whole number from 1 to 50000 (both models' attention"),
])
def test_a_bad_compare_option_is_refused_by_the_command_line_check_and_a_config(flag, text, field, value, said,
                                                                                 tmp_path, capsys):
    from circuitlab.errors import InputError
    from circuitlab.experiments.forge_compare import ForgeCompareOptions

    assert main(["forge", "compare", "--out", str(tmp_path / "x"), flag, text]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    with pytest.raises(InputError, match="^" + re.escape(said)):
        ForgeCompareOptions(**{field: value}).check()
    with pytest.raises(ConfigError, match="^" + re.escape(said)):
        ForgeCompareOptions.from_dict({field: value})
    with pytest.raises(CircuitlabError, match="^" + re.escape(said)):
        run_forge_compare(tmp_path / "x", **{field: value})
    assert not (tmp_path / "x").exists()
