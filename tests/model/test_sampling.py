"""GenerateOptions (model/sampling.py): `circuitlab generate`'s flags, the class's defaults and from_dict are one
declaration; a bad value is refused by the command line and by check() with the same rule (the sampling options in
check_sampling's words, each front end naming them its own way)."""
import argparse
import re
from dataclasses import fields

import pytest

from circuitlab.cli import main
from circuitlab.commands import generate as generate_command
from circuitlab.errors import ConfigError, InputError
from circuitlab.model.sampling import GenerateOptions
from circuitlab.spec import schema

ARGV = ["--model", "ck"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    generate_command.add_arguments(p)
    return p


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """`circuitlab generate --model ck argv` (refused before the checkpoint is read): exit status and stderr."""
    try:
        rc = main(["generate", *ARGV, *argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def test_the_flags_the_class_and_a_config_agree():
    p = parser()
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(GenerateOptions)}
    defaults = GenerateOptions(checkpoint="ck").check()
    assert GenerateOptions.from_args(p.parse_args(ARGV)) == defaults == GenerateOptions.from_dict({"checkpoint": "ck"})
    assert (defaults.max_tokens, defaults.temperature, defaults.seed, defaults.num) == (60, 0.8, 0, 1)
    assert defaults.prompt is None and defaults.top_k is None and defaults.top_p is None
    props = schema(GenerateOptions)["properties"]
    for f in fields(GenerateOptions):
        if f.name != "checkpoint":
            assert props[f.name]["default"] == f.default, f.name
    assert props["top_p"]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}
    assert props["num"]["maximum"] == 1024
    got = GenerateOptions.from_args(p.parse_args(ARGV + ["--prompt", "Once", "--max-tokens", "5", "--temperature", "0",
                                                         "--top-k", "3", "--top-p", "0.5", "--seed", "7", "--num", "2"]))
    assert got == GenerateOptions(checkpoint="ck", prompt="Once", max_tokens=5, temperature=0, top_k=3, top_p=0.5,
                                  seed=7, num=2).check()
    assert isinstance(got.temperature, float) and GenerateOptions.from_dict(got.to_dict()) == got
    with pytest.raises(ConfigError, match="unknown GenerateOptions option.*top_kk.*did you mean 'top_k'"):
        GenerateOptions.from_dict({"checkpoint": "ck", "top_kk": 3})


@pytest.mark.parametrize("flag, text, field, value, rule", [
    ("--num", "0", "num", 0, "must be a whole number from 1 to 1024"),
    ("--num", "2000", "num", 2000, "must be a whole number from 1 to 1024 (the samples are generated as one batch"),
    ("--max-tokens", "0", "max_tokens", 0, "must be a whole number >= 1"),
])
def test_a_bad_value_is_refused_by_the_command_line_and_check_with_one_rule(capsys, flag, text, field, value, rule):
    rc, err = run_cli([flag, text], capsys)
    assert rc == 2 and f"argument {flag}: {rule}" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(InputError, match=re.escape(f"{field} {rule}")):
        GenerateOptions(checkpoint="ck", **{field: value}).check()
    with pytest.raises(ConfigError, match=re.escape(f"{field} {rule}")):
        GenerateOptions.from_dict({"checkpoint": "ck", field: value})


@pytest.mark.parametrize("flag, text, field, value, rule", [
    ("--temperature", "-1", "temperature", -1.0, "must be a finite number >= 0 (0 = greedy decoding), got -1.0"),
    ("--temperature", "nan", "temperature", float("nan"), "must be a finite number >= 0 (0 = greedy decoding), got nan"),
    ("--top-k", "0", "top_k", 0, "must be a whole number >= 1 (or left out for no limit), got 0"),
    ("--top-p", "0", "top_p", 0.0, "must be in (0, 1] (or left out for no limit), got 0.0"),
    ("--top-p", "1.5", "top_p", 1.5, "must be in (0, 1] (or left out for no limit), got 1.5"),
])
def test_the_sampling_options_in_each_front_ends_words(capsys, flag, text, field, value, rule):
    """check_sampling's rule everywhere: the command line names --top-k, Python and a config top_k."""
    assert run_cli([flag, text], capsys) == (2, f"circuitlab generate: error: {flag} {rule}\n")
    with pytest.raises(InputError, match="^" + re.escape(f"{field} {rule}") + "$"):
        GenerateOptions(checkpoint="ck", **{field: value}).check()
    with pytest.raises(ConfigError, match="^" + re.escape(f"{field} {rule}") + "$"):
        GenerateOptions.from_dict({"checkpoint": "ck", field: value})
    rc, err = run_cli([flag, "warm"], capsys)   # not a number: argparse's own line, as before
    assert rc == 2 and f"argument {flag}: invalid" in err and len(err.strip().splitlines()) == 1
