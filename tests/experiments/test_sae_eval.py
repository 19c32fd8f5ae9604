"""`circuitlab sae eval`'s options (DictionaryEvalOptions): its flags, the class's defaults, from_dict and check()
agree, and a bad value is one line by every route, refused before any work (the evaluation itself:
tests/commands/test_sae.py and test_sae_clt.py)."""
import pytest

from circuitlab.cli import build_parser, main
from circuitlab.errors import ConfigError, InputError
from circuitlab.experiments.sae_eval import DictionaryEvalOptions, evaluate_dictionary

NEEDED = {"dictionary": "runs/d", "checkpoint": "runs/m"}


def parse(*argv: str) -> DictionaryEvalOptions:
    return DictionaryEvalOptions.from_args(build_parser().parse_args(["sae", "eval", *argv]))


def test_the_flags_the_class_and_from_dict_agree():
    plain = parse("--dictionary", "runs/d", "--checkpoint", "runs/m")
    assert plain == DictionaryEvalOptions(**NEEDED) == DictionaryEvalOptions.from_dict(NEEDED)
    assert (plain.data, plain.batches, plain.seq_len, plain.json) == ("stories", 64, 64, None)
    given = parse("--dictionary", "runs/d", "--model", "runs/m", "--batches", "3", "--seq-len", "2", "--data",
                  "file:x.txt", "--json", "m.json")
    assert given == DictionaryEvalOptions.from_dict({**NEEDED, "batches": 3, "seq_len": 2, "data": "file:x.txt",
                                                     "json": "m.json"})


@pytest.mark.parametrize("flag, value, rule", [("--seq-len", "1", "a whole number >= 2"),
                                               ("--batches", "0", "a whole number >= 1")])
def test_a_bad_value_is_refused_by_the_command_line_check_and_from_dict_alike(flag, value, rule, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["sae", "eval", "--dictionary", "runs/d", "--checkpoint", "runs/m", flag, value])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1
    assert f"argument {flag}: must be {rule}, got '{value}'" in err, err
    name = flag[2:].replace("-", "_")
    with pytest.raises(InputError, match=f"^{name} must be {rule}, got {value}$"):
        DictionaryEvalOptions(**NEEDED, **{name: int(value)}).check()
    with pytest.raises(ConfigError, match=f"^{name} must be {rule}"):
        DictionaryEvalOptions.from_dict({**NEEDED, name: int(value)})


def test_the_python_api_checks_before_it_reads_anything(tmp_path):
    """Neither the dictionary nor the checkpoint exists: the bad value is what is said."""
    with pytest.raises(InputError, match="^batches must be a whole number >= 1, got 0$"):
        evaluate_dictionary(DictionaryEvalOptions(dictionary=str(tmp_path / "d"), checkpoint=str(tmp_path / "m"),
                                                  batches=0))
    with pytest.raises(InputError, match="^checkpoint is required$"):
        evaluate_dictionary(DictionaryEvalOptions(dictionary=str(tmp_path / "d")))
