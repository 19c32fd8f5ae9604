"""`circuitlab steer`'s pipeline from Python, and its options declared once (SteerOptions, circuitlab.spec): the
command line, the class's defaults and a config agree, and a bad value is refused by each with the same rule."""
import argparse
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from tiny_trained import induction_model

from circuitlab import CircuitlabError
from circuitlab.analysis.steering import contrast_direction, steering_sweep
from circuitlab.cli import main
from circuitlab.commands import steer as steer_command
from circuitlab.data import CharTokenizer
from circuitlab.errors import ConfigError, InputError
from circuitlab.experiments.steer import MAX_COEFS, SteerOptions
from circuitlab.spec import schema
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
REQUIRED = dict(checkpoint="ck", positive="pos.txt", negative="neg.txt", layer=1)
ARGV = ["--model", "ck", "--positive", "pos.txt", "--negative", "neg.txt", "--layer", "1"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    steer_command.add_arguments(p)
    return p


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """`circuitlab steer ARGV argv`: its exit status and its stderr (a parse error exits 2 too)."""
    try:
        rc = main(["steer", *ARGV, *argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def test_the_flags_the_class_and_a_config_agree():
    """Every flag but --memory / --estimate is a field; no flag given is the class's defaults; a config with the
    required fields is the same options; the schema's defaults are the class's."""
    p = parser()
    assert {a.dest for a in p._actions} - {"help", "memory", "estimate"} == {f.name for f in fields(SteerOptions)}
    defaults = SteerOptions(**REQUIRED).check()
    assert SteerOptions.from_args(p.parse_args(ARGV)) == defaults == SteerOptions.from_dict(REQUIRED)
    assert defaults.coefs == (0.0, 1.0, 2.0, 4.0) and defaults.progress and not defaults.overwrite
    props = schema(SteerOptions)["properties"]
    for f in fields(SteerOptions):
        if f.name not in REQUIRED:
            assert props[f.name]["default"] == (list(f.default) if isinstance(f.default, tuple) else f.default)
    got = SteerOptions.from_args(p.parse_args(ARGV + ["--coef", "0", "3", "--no-progress", "--overwrite", "--seed", "5",
                                                      "--temperature", "0", "--count", "d", "--neutral", "n.txt"]))
    assert got == SteerOptions(**REQUIRED, coefs=[0, 3], progress=False, overwrite=True, seed=5, temperature=0,
                               count="d", neutral="n.txt").check()
    assert SteerOptions.from_dict(got.to_dict()) == got and json.loads(json.dumps(got.to_dict()))["coefs"] == [0, 3]
    assert SteerOptions(**{**REQUIRED, "checkpoint": Path("ck")}).check() == defaults   # a path kept as its str
    with pytest.raises(InputError, match=r"^layer is required$"):
        SteerOptions(**{**REQUIRED, "layer": None}).check()
    with pytest.raises(ConfigError, match="unknown SteerOptions option.*coef.*did you mean 'coefs'"):
        SteerOptions.from_dict({**REQUIRED, "coef": [1.0]})


@pytest.mark.parametrize("flag, text, field, value, rule", [
    ("--samples", "0", "samples", 0, "must be a whole number from 1 to 1024"),
    ("--samples", "2000", "samples", 2000, "must be a whole number from 1 to 1024 (the samples are generated as one "
                                           "batch)"),
    ("--max-tokens", "5000", "max_tokens", 5000, "must be a whole number from 1 to 4096 (each new token"),
    ("--layer", "1.5", "layer", 1.5, "must be a whole number"),
    ("--seed", "x", "seed", "x", "must be a whole number"),
    ("--coef", "nan", "coefs", [float("nan")], "must be a finite number"),
])
def test_a_bad_value_is_refused_by_the_command_line_and_check_with_one_rule(capsys, flag, text, field, value, rule):
    rc, err = run_cli([flag, text], capsys)
    assert rc == 2 and f"argument {flag}: {rule}" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(InputError, match=re.escape(rule)):
        SteerOptions(**{**REQUIRED, field: value}).check()
    with pytest.raises(ConfigError, match=re.escape(rule)):
        SteerOptions.from_dict({**REQUIRED, field: value})


def test_temperature_and_the_number_of_coefficients_in_each_front_ends_words(capsys):
    """The command line names --temperature and --coef; Python names temperature and coefs; the temperature's rule
    is check_sampling's (0 = greedy decoding), the same as `circuitlab generate`'s."""
    too_many = ["1"] * (MAX_COEFS + 1)
    for argv, said in [(["--temperature", "-1"], "--temperature must be a finite number >= 0 (0 = greedy decoding), "
                                                 "got -1.0"),
                       (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy decoding), "
                                                  "got nan"),
                       (["--coef", *too_many], "--coef: give at most 64 coefficients (each is one more sweep), got 65")]:
        assert run_cli(argv, capsys) == (2, f"circuitlab steer: error: {said}\n")
    rc, err = run_cli(["--temperature", "warm"], capsys)
    assert rc == 2 and "argument --temperature: invalid float value: 'warm'" in err
    for bad, said in [(dict(temperature=-1.0), "temperature must be a finite number >= 0 (0 = greedy decoding), got "
                                               "-1.0"),
                      (dict(temperature=True), "temperature must be a finite number >= 0 (0 = greedy decoding), got "
                                               "True"),
                      (dict(coefs=[1.0] * 65), "coefs: give at most 64 coefficients (each is one more sweep), got 65"),
                      (dict(coefs=[]), "coefs: give at least one coefficient"),
                      (dict(coefs=2.0), "coefs must be a list of numbers, got 2.0")]:
        with pytest.raises(InputError, match="^" + re.escape(said) + "$"):
            SteerOptions(**REQUIRED, **bad).check()
        with pytest.raises(ConfigError, match="^" + re.escape(said) + "$"):
            SteerOptions.from_dict({**REQUIRED, **bad})


def test_run_steer_is_the_command_from_python(tmp_path):
    """The pipeline behind `circuitlab steer`: the same sweep as steering_sweep on the same direction, the files it
    writes are its to_dict, and a value out of range is one line naming the option."""
    from circuitlab.experiments.steer import SteerOptions, run_steer

    tok = CharTokenizer("abcdefghijklmnopqrstuvw")
    model = induction_model()
    save_checkpoint(tmp_path / "ckpt", model, tok)
    (tmp_path / "pos.txt").write_text("dddddddd\nddddcdddd\n")
    (tmp_path / "neg.txt").write_text("kkkkkkkk\nkkkkkk\n")
    opts = dict(checkpoint=tmp_path / "ckpt", positive=tmp_path / "pos.txt", negative=tmp_path / "neg.txt",
                neutral=tmp_path / "pos.txt", layer=1, coefs=[0, 2], count="d", samples=2, max_tokens=5,
                prompt="abc", progress=False)
    result = run_steer(SteerOptions(**opts, out=tmp_path / "out"))
    pos = [torch.tensor(tok.encode(s)) for s in ("dddddddd", "ddddcdddd")]
    neg = [torch.tensor(tok.encode(s)) for s in ("kkkkkkkk", "kkkkkk")]
    vec = contrast_direction(model, pos, neg, layer=1)
    torch.testing.assert_close(result.vector.direction, vec.direction)
    plain = steering_sweep(model, vec, [0.0, 2.0], pos, neg, pos)
    torch.testing.assert_close(result.sweep.preference, plain.preference)
    torch.testing.assert_close(result.sweep.neutral_loss, plain.neutral_loss)
    assert result.sweep.preference[1] > result.sweep.preference[0]           # towards 'd'
    assert json.loads((tmp_path / "out" / "steering.json").read_text()) == json.loads(json.dumps(result.to_dict()))
    assert list(result.generations) == ["0.0", "2.0"] and all(len(t) == 2 for t in result.generations.values())
    assert result.summary()[0].startswith("direction: 2 positive − 2 negative prompts at blocks.1.hook_resid_pre")
    for bad, said in [(dict(samples=0), "samples must be"), (dict(coefs=[float("nan")]), "coef must be"),
                      (dict(max_tokens=10 ** 9), "max_tokens must be"), (dict(coefs=[]), "at least one")]:
        with pytest.raises(CircuitlabError, match=said):
            run_steer(SteerOptions(**{**opts, **bad}))
