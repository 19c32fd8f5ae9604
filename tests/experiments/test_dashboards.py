"""`circuitlab sae dashboards`'s options (DashboardOptions): its flags, the class's defaults, from_dict and check()
agree, and a bad value is one line by every route, refused before any work (the dashboards themselves:
tests/dictionaries/test_features.py and tests/commands/test_sae_clt.py)."""
from pathlib import Path

import pytest

from circuitlab.cli import build_parser, main
from circuitlab.errors import ConfigError, InputError
from circuitlab.experiments.dashboards import TOKENS, DashboardOptions, build_dashboards

NEEDED = {"dictionary": "runs/d", "checkpoint": "runs/m"}


def parse(*argv: str):
    return build_parser().parse_args(["sae", "dashboards", *argv])


def test_the_flags_the_class_and_from_dict_agree():
    args = parse("--dictionary", "runs/d", "--checkpoint", "runs/m")
    plain = DashboardOptions.from_args(args)
    assert plain == DashboardOptions(**NEEDED) == DashboardOptions.from_dict(NEEDED)
    assert (plain.n_tokens, plain.data, plain.out, plain.features, plain.progress, plain.overwrite) == \
        (32_768, "stories", None, None, True, False)
    assert args.device == DashboardOptions.device == "cpu"   # --device: written in the command, from the class
    given = DashboardOptions.from_args(parse("--dictionary", "runs/d", "--checkpoint", "runs/m", "--tokens", "512",
                                             "--features", "3", "1", "--layer", "0", "--no-progress", "--overwrite",
                                             "--out", "o"))
    assert given == DashboardOptions.from_dict({**NEEDED, "n_tokens": 512, "features": [3, 1], "layer": 0,
                                                "progress": False, "overwrite": True, "out": "o"})
    assert given.features == (3, 1)
    assert DashboardOptions(Path("runs/d"), Path("runs/m")) == DashboardOptions(**NEEDED)   # Paths are text


def test_a_bad_value_is_refused_by_the_command_line_check_and_from_dict_alike(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["sae", "dashboards", "--dictionary", "runs/d", "--checkpoint", "runs/m", "--tokens", "0"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1
    assert f"argument --tokens: must be {TOKENS.rule()}, got '0'" in err, err
    with pytest.raises(InputError, match=f"^n_tokens must be {TOKENS.rule()}, got 0$"):
        DashboardOptions(**NEEDED, n_tokens=0).check()
    with pytest.raises(ConfigError, match="^n_tokens must be"):
        DashboardOptions.from_dict({**NEEDED, "n_tokens": TOKENS.high + 1})
    with pytest.raises(InputError, match="^seq_len must be a whole number >= 1, got 0$"):   # no flag, the same rule
        DashboardOptions(**NEEDED, seq_len=0).check()


def test_the_python_api_checks_before_it_reads_anything(tmp_path):
    out = tmp_path / "dash"
    with pytest.raises(InputError, match="^n_tokens must be"):
        build_dashboards(DashboardOptions(tmp_path / "none", tmp_path / "none", out=out, n_tokens=0))
    assert not out.exists()

