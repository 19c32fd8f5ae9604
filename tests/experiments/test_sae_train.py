"""`circuitlab sae train`'s run options (SaeTrainOptions): its flags, the class's defaults and from_dict agree; --set
and --target-l0 reach the config; a bad value is one line (training itself: tests/commands/test_sae.py)."""
import pytest

from circuitlab.cli import build_parser, main
from circuitlab.errors import ConfigError, InputError
from circuitlab.experiments.sae_train import SaeTrainOptions


def parse(*argv: str):
    return build_parser().parse_args(["sae", "train", *argv])


def test_the_flags_the_class_and_from_dict_agree():
    args = parse("--config", "sae-demo")
    plain = SaeTrainOptions.from_args(args)
    assert plain == SaeTrainOptions("sae-demo") == SaeTrainOptions.from_dict({"config": "sae-demo"})
    assert (plain.parallel, plain.progress, plain.resume, plain.overwrite, plain.out, plain.target_l0) == \
        ("data", True, False, False, None, None)
    assert args.device == SaeTrainOptions.device and args.overrides == [] and plain.overrides == ()
    given = SaeTrainOptions.from_args(parse("--config", "c.yaml", "--target-l0", "8,8,4", "--out", "o", "--resume",
                                            "--no-progress", "--parallel", "modules"))
    assert given == SaeTrainOptions.from_dict({"config": "c.yaml", "target_l0": "8,8,4", "out": "o", "resume": True,
                                               "progress": False, "parallel": "modules"})


def test_set_and_target_l0_reach_the_config_and_out_defaults_to_its_name():
    opts = SaeTrainOptions("sae-demo", overrides=("train.steps=7",), target_l0="5")
    data = opts.load_config()
    assert data["train"]["steps"] == 7 and data["train"]["target_l0"] == 5
    assert str(opts.out_folder(data)) == f"runs/{data['name']}" and str(SaeTrainOptions("x", out="o").out_folder(data)) == "o"


def test_a_bad_value_is_refused_by_the_command_line_check_and_from_dict_alike(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["sae", "train", "--config", "sae-demo", "--parallel", "rows"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "argument --parallel: invalid choice: 'rows'" in err
    with pytest.raises(InputError, match="^parallel must be one of data, modules, got 'rows'$"):
        SaeTrainOptions("sae-demo", parallel="rows").check()
    with pytest.raises(ConfigError, match="^config is required$"):
        SaeTrainOptions.from_dict({"out": "o"})
