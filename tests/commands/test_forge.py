"""Forge: the builder API, the hand-built heads, the adders (exhaustively), the comparison functions, the CLI.

(Split out of the flat test_forge module, issue 38.)"""
import pytest

from circuitlab.cli import main


# ---------------------------------------------------------------- CLI
def test_cli_check_and_explain(capsys):
    assert main(["forge", "adder", "--digits", "2", "--check"]) == 0
    assert "10000/10000 inputs correct" in capsys.readouterr().out
    assert main(["forge", "adder", "--a", "17", "--b", "25", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "EOS residual [12, 3, 1]" in out and "EOS attends" in out
    assert main(["forge", "adder", "--design", "carry", "--digits", "3", "--digits-b", "1", "--a", "995",
                 "--b", "7"]) == 0
    assert capsys.readouterr().out.strip() == "995 + 7 = 1002"


@pytest.mark.parametrize("argv, message", [
    (["--a", "123", "--b", "4"], "has 3 digits, but this adder was built for 2-digit a (use --digits 3)"),
    (["--a", "seven", "--b", "4"], "a must be a whole number"),
    (["--a", "3"], "give both --a and --b"),
    ([], "give --check, or two numbers"),
])
def test_cli_bad_input_is_one_clear_line(argv, message, capsys):
    assert main(["forge", "adder", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
