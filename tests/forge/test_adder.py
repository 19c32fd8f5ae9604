"""Forge: the builder API, the hand-built heads, the adders (exhaustively), the comparison functions, the CLI.

(Split out of the flat test_forge module, issue 38.)"""
import re

import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.forge import EOS, build_adder, build_carry_adder, build_post_adder
from circuitlab.forge.adder import parse_operand


# ---------------------------------------------------------------- the post's adder
def test_post_adder_is_exact_on_all_inputs_and_matches_the_post():
    adder = build_post_adder()
    result = adder.check(progress=False)
    assert (result.correct, result.total, result.exhaustive) == (10_000, 10_000, True)
    tokens = adder.prompt(17, 25)
    assert tokens.tolist() == [1, 7, 2, 5, EOS]
    _, cache = adder.model.run_with_cache(tokens[None])
    torch.testing.assert_close(cache["resid_post", 1][0, -1], torch.tensor([12.0, 3.0, 1.0]))
    torch.testing.assert_close(cache["pattern", 0][0, 0, -1], torch.tensor([0, 0.5, 0, 0.5, 0]))
    torch.testing.assert_close(cache["pattern", 1][0, 0, -1], torch.tensor([1, 0, 1, 0, 1]) / 3)
    assert adder.add(17, 25) == 42 and adder.add(99, 99) == 198
    text = adder.explain(17, 25)
    assert "EOS residual [12, 3, 1]" in text and "= 42" in text


def test_post_adder_needs_a_hard_softmax():
    # Scores differ by 2·s² between attended and ignored positions; at s = 1.5 (margin 4.5) the ignored
    # positions leak e^-4.5 ≈ 1% of their digits into the sum and the readout goes wrong.
    assert build_post_adder(qk_scale=3.0).check(progress=False).exact
    soft = build_post_adder(qk_scale=1.5).check(progress=False)
    assert not soft.exact and soft.failures


# ---------------------------------------------------------------- the exact adder
@pytest.mark.parametrize("n, m", [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1), (2, 3), (3, 2)])
def test_carry_adder_exact_on_every_input(n, m):
    result = build_carry_adder(n, m).check(progress=False)
    assert result.exhaustive and result.total == 10 ** (n + m)
    assert result.correct == result.total, result


@pytest.mark.slow
def test_carry_adder_exact_on_every_3_plus_3_digit_input():
    result = build_carry_adder(3, 3).check(progress=False)
    assert result.exhaustive and result.correct == result.total == 10 ** 6


@pytest.mark.parametrize("n, m", [(4, 7), (7, 4), (12, 12)])
def test_carry_adder_exact_on_10000_random_pairs(n, m):
    result = build_carry_adder(n, m).check(samples=10_000, seed=n * 100 + m, progress=False)
    assert not result.exhaustive and result.correct == result.total == 10_000, result


def _digits(x, n):
    return torch.tensor([[int(c) for c in str(v).zfill(n)] for v in x])


def test_carry_adder_long_carry_chains():
    # Uniform random digits rarely make long runs of 9s; these do (carries across every column).
    n = 12
    pairs = [(10 ** n - 1, 1), (10 ** n - 1, 10 ** n - 1), (5 * 10 ** (n - 1), 5 * 10 ** (n - 1)),
             (123456789012, 876543210988), (999999999990, 10), (499999999999, 500000000001), (0, 0)]
    adder = build_carry_adder(n, n)
    a, b = zip(*pairs)
    assert adder.correct_rows(_digits(a, n), _digits(b, n)).all()
    assert adder.add(10 ** n - 1, 1) == 10 ** n                     # and through greedy generation
    uneven = build_carry_adder(30, 2)
    a, b = [10 ** 30 - 1, 10 ** 30 - 1, 10 ** 29], [1, 99, 0]
    assert uneven.correct_rows(_digits(a, 30), _digits(b, 2)).all()
    assert build_carry_adder(2, 30).add(1, 10 ** 30 - 1) == 10 ** 30


def test_carry_adder_carries_live_in_the_model():
    adder = build_carry_adder(2, 2)
    tokens = torch.tensor([[1, 7, 2, 5, EOS, 0, 4]])    # 17 + 25 with the answer 042 fed back
    logits, cache = adder.model.run_with_cache(tokens)
    final = cache["resid_post", 1][0]
    carry = adder.layout.read(final, "carry")[4:, 0]   # answer positions predict hundreds, tens, units
    torch.testing.assert_close(carry, torch.tensor([0.0, 1.0, 0.0]))
    wrap = adder.layout.read(final, "wrap")[4:, 0]
    torch.testing.assert_close(wrap, torch.tensor([0.0, 0.0, 1.0]))
    # the answer is read through the unembedding: logits are a linear map of the final residual
    torch.testing.assert_close(logits[0], final @ adder.model.W_U)
    assert logits[0, 4:].argmax(-1).tolist() == [0, 4, 2]
    # heads a and b fetch the column's digits with (numerically) hard attention
    pattern = cache["pattern", 0][0]
    assert pattern[0, 6, 1] > 0.999 and pattern[1, 6, 3] > 0.999      # units: 7 and 5
    assert pattern[0, 4, 4] > 0.999 and pattern[1, 4, 4] > 0.999      # hundreds: neither number has one (EOS)
    assert "17 + 25 = 42" in adder.explain(17, 25)


def test_adder_token_format_matches_the_addition_task():
    from circuitlab.data.synthetic import AdditionTask

    task = AdditionTask(3, 2)
    adder = build_carry_adder(3, 2)
    assert adder.prompt(507, 98).tolist() == task.encode(507, 98)[: task.prompt_len]
    assert task.seq_len - 1 <= adder.model.cfg.n_ctx and EOS == task.EOS


@pytest.mark.parametrize("value, message", [
    ("1x", "whole number"), ("", "whole number"), (2.5, "whole number"), (True, "whole number"),
    (-3, "not be negative"), ("-3", "not be negative"), (123, "has 3 digits"), ("100", "has 3 digits"),
])
def test_bad_operands_are_clear_errors(value, message):
    with pytest.raises(CircuitlabError, match=message):
        parse_operand(value, "a", 2)
    with pytest.raises(CircuitlabError, match=message):
        build_carry_adder(2).add(value, 1)


def test_bad_adder_shapes_are_clear_errors():
    with pytest.raises(CircuitlabError, match="n_digits_a must be an integer from 1"):
        build_carry_adder(0)
    with pytest.raises(CircuitlabError, match="post's design adds two 2-digit numbers"):
        build_adder("post", 3)
    with pytest.raises(CircuitlabError, match="unknown adder design"):
        build_adder("magic", 2)


# ---------------------------------------------------------------- `forge adder`'s options, declared once
def _subparser(name: str):
    import argparse

    from circuitlab.commands import forge as forge_command

    p = argparse.ArgumentParser(exit_on_error=False)
    forge_command.add_arguments(p)
    return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def test_adder_flags_the_class_a_config_and_the_check_keywords_agree():
    import inspect
    from dataclasses import fields

    from circuitlab.forge.adder import Adder, AdderOptions
    from circuitlab.spec import schema

    p = _subparser("adder")
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(AdderOptions)}
    checked = AdderOptions(check_all=True).check()
    assert AdderOptions.from_args(p.parse_args(["--check"])) == checked == AdderOptions.from_dict({"check_all": True})
    props = schema(AdderOptions)["properties"]
    assert all(props[f.name]["default"] == f.default for f in fields(AdderOptions))
    keywords = inspect.signature(Adder.check).parameters   # the check's keywords are the flags' defaults
    assert (keywords["samples"].default, keywords["seed"].default) == (checked.samples, checked.seed)
    got = AdderOptions.from_args(p.parse_args(["--design", "carry", "--digits", "3", "--digits-b", "1", "--a", "995",
                                               "--b", "7", "--explain", "--check", "--samples", "5", "--seed", "2",
                                               "--json"]))
    assert got == AdderOptions("carry", 3, 1, True, 5, 2, "995", "7", True, True)
    assert AdderOptions.from_dict(got.to_dict()) == got and got.digit_counts == (3, 1) and got.design_name == "carry"
    assert AdderOptions(a="1", b="2").design_name == "post" and AdderOptions(digits=3).design_name == "carry"


@pytest.mark.parametrize("options, said", [
    (dict(check_all=True, samples=0), "samples must be a whole number >= 1, got 0"),
    (dict(check_all=True, design="exact"), "design must be one of auto, post, carry"),
    (dict(), "give --check, or two numbers with --a and --b"),
    (dict(a="3"), "give both --a and --b"),
    (dict(explain=True), "give --check, or two numbers with --a and --b"),
    (dict(check_all=True, explain=True), "--explain walks through one sum: give --a and --b"),
])
def test_a_bad_adder_option_is_refused_by_check_a_config_and_run_adder(options, said):
    from circuitlab.errors import ConfigError, InputError
    from circuitlab.forge.adder import AdderOptions, run_adder

    with pytest.raises(InputError, match="^" + re.escape(said)):
        AdderOptions(**options).check()
    with pytest.raises(ConfigError, match="^" + re.escape(said)):
        AdderOptions.from_dict(options)
    with pytest.raises(InputError, match="^" + re.escape(said)):
        next(run_adder(AdderOptions(**options)))


def test_adder_command_line_refuses_what_check_refuses_and_prints_what_run_adder_yields(capsys):
    from circuitlab.cli import main
    from circuitlab.forge.adder import AdderOptions, run_adder

    with pytest.raises(SystemExit) as exited:   # the same rule (checks.COUNT) as argparse's one line
        main(["forge", "adder", "--check", "--samples", "0"])
    assert exited.value.code == 2 and "argument --samples: must be a whole number >= 1" in capsys.readouterr().err
    assert main(["forge", "adder", "--check", "--explain"]) == 2
    assert "--explain walks through one sum: give --a and --b" in capsys.readouterr().err
    argv = ["--design", "carry", "--digits", "3", "--digits-b", "1", "--a", "995", "--b", "7", "--explain"]
    assert main(["forge", "adder", *argv]) == 0
    expected = "\n".join(run_adder(AdderOptions("carry", 3, 1, a="995", b="7", explain=True))) + "\n"
    assert capsys.readouterr().out == expected
