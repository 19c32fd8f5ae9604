"""`circuitlab lens train`'s pipeline from Python, and its options declared once (LensTrainOptions,
circuitlab.spec): the command line, the class's defaults, a config and the analysis keywords agree; a bad value is
refused by each with the same rule; the Python API trains the lens the command trains."""
import argparse
import inspect
import re
from dataclasses import fields

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.analysis.lens import tuned
from circuitlab.cli import main
from circuitlab.commands import lens as lens_command
from circuitlab.data.stories import stories_text
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.errors import ConfigError, InputError
from circuitlab.experiments.lens_train import LensTrainOptions, lens_train_estimate, train_lens
from circuitlab.spec import schema
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    lens_command._train_args(p)
    return p


def test_the_flags_the_class_a_config_and_the_analysis_keywords_agree():
    p = parser()
    assert {a.dest for a in p._actions} - {"help", "memory", "estimate"} == {f.name for f in fields(LensTrainOptions)}
    defaults = LensTrainOptions("ck").check()
    assert LensTrainOptions.from_args(p.parse_args(["--model", "ck"])) == defaults
    assert LensTrainOptions.from_dict({"checkpoint": "ck"}) == defaults
    props = schema(LensTrainOptions)["properties"]
    assert all(props[f.name]["default"] == f.default for f in fields(LensTrainOptions) if f.name != "checkpoint")
    # training's defaults are analysis/lens/tuned.py's: its keywords and the command's flags are one value each
    keywords = {**inspect.signature(tuned.train_tuned_lens).parameters, **inspect.signature(tuned.story_batches).parameters}
    for name in ("steps", "lr", "save_every", "batch_size", "seq_len"):
        assert keywords[name].default == getattr(defaults, name), name
    got = LensTrainOptions.from_args(p.parse_args(["--checkpoint", "ck", "--steps", "7", "--lr", "0.5", "--resume",
                                                   "--no-progress", "--text", "t.txt", "--out", "o"]))
    assert got == LensTrainOptions("ck", "o", steps=7, lr=0.5, text="t.txt", resume=True, progress=False).check()
    assert LensTrainOptions.from_dict(got.to_dict()) == got


@pytest.mark.parametrize("flag, text, field, value, rule", [
    ("--steps", "0", "steps", 0, "must be a whole number >= 1"),
    ("--lr", "0", "lr", 0, "must be a finite number > 0"),
    ("--lr", "nan", "lr", float("nan"), "must be a finite number > 0"),
    ("--batches", "1.5", "batches", 1.5, "must be a whole number >= 1"),
    ("--batch-size", "0", "batch_size", 0, "must be a whole number >= 1"),
    ("--seq-len", "-4", "seq_len", -4, "must be a whole number >= 1"),
    ("--save-every", "x", "save_every", "x", "must be a whole number >= 1"),
])
def test_a_bad_value_is_refused_by_the_command_line_check_and_the_pipeline(capsys, tmp_path, flag, text, field, value,
                                                                           rule):
    with pytest.raises(SystemExit) as exited:
        main(["lens", "train", "--checkpoint", "ck", flag, text])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {flag}: {rule}" in err and len(err.strip().splitlines()) == 1
    said = f"^{field} must be " + re.escape(rule.removeprefix("must be "))
    with pytest.raises(InputError, match=said):
        LensTrainOptions("ck", **{field: value}).check()
    with pytest.raises(ConfigError, match=said):
        LensTrainOptions.from_dict({"checkpoint": "ck", field: value})
    for call in (train_lens, lens_train_estimate):   # refused before anything is read or written
        with pytest.raises(InputError, match=said):
            call(LensTrainOptions(tmp_path / "no-checkpoint", tmp_path / "lens", **{field: value}))
    assert not (tmp_path / "lens").exists()


def test_the_python_api_trains_the_lens_the_command_trains(tmp_path, capsys):
    tokenizer = CharTokenizer.from_texts([stories_text(300, seed=1)])
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=32))
    save_checkpoint(tmp_path / "run" / "checkpoint", model, tokenizer)
    sizes = dict(steps=3, batches=2, batch_size=2, seq_len=16)
    found = train_lens(LensTrainOptions(tmp_path / "run", tmp_path / "api", progress=False, **sizes))
    assert found.folder == tmp_path / "api" and found.labels == ["embed", "L0"]   # the translated points
    assert len(found.logit_kl) == len(found.tuned_kl) == 3 and found.tuned_kl[-1] == 0   # and the output itself
    assert found.lens.model_info["checkpoint"] == str(tmp_path / "run")
    flags = [a for k, v in sizes.items() for a in ("--" + k.replace("_", "-"), str(v))]
    assert main(["lens", "train", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "cli"),
                 "--no-progress", *flags]) == 0
    assert "KL to the final distribution" in capsys.readouterr().out
    cli = tuned.TunedLens.load(tmp_path / "cli")
    assert torch.equal(cli.weight, found.lens.weight) and torch.equal(cli.bias, found.lens.bias)
    assert cli.train_info == found.lens.train_info


def test_init_lstsq_reaches_the_analysis_and_is_kept_with_the_lens(tmp_path):
    """`--init lstsq` reaches train_tuned_lens's init: its lens differs from the identity-started one on the same
    data and records its start; an unknown start is refused."""
    tokenizer = CharTokenizer.from_texts([stories_text(300, seed=1)])
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=32))
    save_checkpoint(tmp_path / "run" / "checkpoint", model, tokenizer)
    sizes = dict(steps=2, batches=2, batch_size=2, seq_len=16, progress=False)
    fit = train_lens(LensTrainOptions(tmp_path / "run", tmp_path / "lstsq", init="lstsq", **sizes)).lens
    plain = train_lens(LensTrainOptions(tmp_path / "run", tmp_path / "identity", **sizes)).lens
    assert fit.train_info.get("init") == "lstsq" and "init" not in plain.train_info
    assert not torch.allclose(fit.weight, plain.weight)
    with pytest.raises((ConfigError, InputError)):
        LensTrainOptions(tmp_path / "run", init="zeros").check()
