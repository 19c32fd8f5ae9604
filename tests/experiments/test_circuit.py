"""CircuitOptions (experiments/circuit.py): `circuitlab circuit`'s flags, the class's defaults, from_dict, the
explorer's request and find_circuit's keyword defaults are one declaration; a bad value is refused by the command
line and by check() with the same rule; the checks between fields say the same line to each front end."""
import argparse
import inspect
import re
from dataclasses import fields

import pytest

from circuitlab.analysis.edges import edge_scores, find_circuit
from circuitlab.analysis.edges.scoring import EAP_IG_STEPS, edge_estimate
from circuitlab.cli import main
from circuitlab.commands import circuit as circuit_command
from circuitlab.errors import ConfigError, InputError
from circuitlab.experiments.circuit import CircuitOptions
from circuitlab.serve.circuits import CircuitBrowser, RunRequest
from circuitlab.spec import schema

REQUIRED = dict(checkpoint="ck", task="induction")
ARGV = ["--model", "ck", "--task", "induction"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    circuit_command.add_arguments(p)
    return p


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """`circuitlab circuit argv` (refused before the checkpoint is read): its exit status and its stderr."""
    try:
        rc = main(["circuit", *argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def test_the_flags_the_class_and_a_config_agree():
    """Every flag but --memory / --estimate is a field; no flag given is the class's defaults, and so is a config
    with the required fields; the schema's defaults are the class's; --refine alone means batched."""
    p = parser()
    assert {a.dest for a in p._actions} - {"help", "memory", "estimate"} == {f.name for f in fields(CircuitOptions)}
    defaults = CircuitOptions(**REQUIRED).check()
    assert CircuitOptions.from_args(p.parse_args(ARGV)) == defaults == CircuitOptions.from_dict(REQUIRED)
    assert (defaults.metric, defaults.method, defaults.intervention, defaults.steps) == (
        "logit-diff", "eap-ig", "counterfactual", 5)
    assert defaults.refine is None and defaults.progress and not defaults.greedy and not defaults.overwrite
    props = schema(CircuitOptions)["properties"]
    for f in fields(CircuitOptions):
        if f.name != "checkpoint":
            assert props[f.name]["default"] == f.default, f.name
    assert props["steps"]["maximum"] == EAP_IG_STEPS.high and props["task"]["anyOf"][0]["enum"] == ["induction"]
    assert props["refine"]["anyOf"][0] == {"type": "string"}   # one value (nargs "?"), not a list
    got = CircuitOptions.from_args(p.parse_args(["--model", "ck", "--clean", "a.txt", "--corrupt", "b.txt",
                                                 "--metric", "kl", "--method", "eap", "--steps", "8", "--edges", "12",
                                                 "--greedy", "--refine", "--no-progress", "--overwrite"]))
    assert got == CircuitOptions(checkpoint="ck", clean="a.txt", corrupt="b.txt", metric="kl", method="eap", steps=8,
                                 edges=12, greedy=True, refine="batched", progress=False, overwrite=True).check()
    assert CircuitOptions.from_dict(got.to_dict()) == got
    assert CircuitOptions.from_args(p.parse_args(ARGV + ["--refine", "acdc"])).refine == "acdc"
    with pytest.raises(InputError, match=r"^checkpoint is required$"):
        CircuitOptions(task="induction").check()
    with pytest.raises(ConfigError, match="unknown CircuitOptions option.*edge.*did you mean 'edges'"):
        CircuitOptions.from_dict({**REQUIRED, "edge": 3})


def test_find_circuit_and_the_explorer_default_to_the_class():
    """The Python API's keywords and the explorer's request read the defaults the class reads."""
    d = CircuitOptions(**REQUIRED)

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    assert [default(find_circuit, k) for k in ("metric", "method", "intervention", "steps")] == [
        d.metric, d.method, d.intervention, d.steps]
    assert default(edge_scores, "steps") == default(edge_estimate, "steps") == d.steps
    assert default(edge_scores, "intervention") == d.intervention and default(edge_estimate, "method") == d.method
    assert [default(CircuitBrowser.run, k) for k in ("method", "metric", "steps")] == [d.method, d.metric, d.steps]
    request = RunRequest()
    assert (request.method, request.metric, request.steps) == (d.method, d.metric, d.steps)


@pytest.mark.parametrize("flag, text, field, value, rule", [
    ("--steps", "0", "steps", 0, "must be a whole number from 1 to 10000"),
    ("--steps", "20000", "steps", 20000, "must be a whole number from 1 to 10000 (each point is a forward and "
                                         "backward pass"),
    ("--edges", "0", "edges", 0, "must be a whole number >= 1"),
    ("--threshold", "-1", "threshold", -1.0, "must be a finite number >= 0"),
    ("--threshold", "nan", "threshold", float("nan"), "must be a finite number >= 0"),
])
def test_a_bad_value_is_refused_by_the_command_line_and_check_with_one_rule(capsys, flag, text, field, value, rule):
    rc, err = run_cli([*ARGV, flag, text], capsys)
    assert rc == 2 and f"argument {flag}: {rule}" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(InputError, match=re.escape(f"{field} {rule}")):
        CircuitOptions(**{**REQUIRED, field: value}).check()
    with pytest.raises(ConfigError, match=re.escape(f"{field} {rule}")):
        CircuitOptions.from_dict({**REQUIRED, field: value})


@pytest.mark.parametrize("argv, given, said", [
    (["--model", "ck"], dict(checkpoint="ck"), "give --clean and --corrupt prompt files, or a built-in --task "
                                               "(induction)"),
    ([*ARGV, "--clean", "a.txt"], dict(REQUIRED, clean="a.txt"), "--task and --clean/--corrupt are alternatives: "
                                                                 "give one of them"),
    (["--model", "ck", "--clean", "a", "--corrupt", "b", "--corruption", "first-copy"],
     dict(checkpoint="ck", clean="a", corrupt="b", corruption="first-copy"),
     "--corruption chooses the built-in task's corrupted rows; with prompt files, the --corrupt file is the "
     "corruption"),
    ([*ARGV, "--metric", "nope"], dict(REQUIRED, metric="nope"), "unknown metric 'nope'; choose one of logit-diff, "
                                                                 "logprob, kl (or pass any function of the logits to "
                                                                 "edge_scores from Python)"),
    ([*ARGV, "--method", "nope"], dict(REQUIRED, method="nope"), "unknown method 'nope'; choose one of eap, eap-ig, "
                                                                 "exact"),
    ([*ARGV, "--intervention", "x"], dict(REQUIRED, intervention="x"), "unknown intervention 'x'; choose one of "
                                                                       "counterfactual, zero, mean, position-mean"),
    ([*ARGV, "--refine", "x"], dict(REQUIRED, refine="x"), "unknown refinement 'x'; choose batched or acdc"),
])
def test_the_checks_between_fields_and_of_names_are_one_line_to_each_front_end(capsys, argv, given, said):
    assert run_cli(argv, capsys) == (2, f"circuitlab circuit: error: {said}\n")
    with pytest.raises(InputError, match="^" + re.escape(said) + "$"):
        CircuitOptions(**given).check()
    with pytest.raises(ConfigError, match="^" + re.escape(said) + "$"):
        CircuitOptions.from_dict(given)
