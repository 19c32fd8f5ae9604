"""`circuitlab lens show`'s pipeline from Python, and its options declared once (LensShowOptions, circuitlab.spec):
the command line, the class and a config agree; a bad value is refused by each with the same words; show_lens
reads what the command prints."""
import argparse
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
from circuitlab.experiments.lens_show import LensShowOptions, show_lens
from circuitlab.spec import schema
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "Once upon a time, Lily"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    lens_command._show_args(p)
    return p


def test_the_flags_the_class_and_a_config_agree():
    p = parser()
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(LensShowOptions)}
    defaults = LensShowOptions("ck", prompt=PROMPT).check()
    assert LensShowOptions.from_args(p.parse_args(["--model", "ck", "--prompt", PROMPT])) == defaults
    assert LensShowOptions.from_dict({"checkpoint": "ck", "prompt": PROMPT}) == defaults
    assert defaults.lens is None and defaults.out is None
    assert schema(LensShowOptions)["required"] == ["checkpoint", "prompt"]
    got = LensShowOptions.from_args(p.parse_args(["--checkpoint", "ck", "--prompt", "x", "--lens", "l", "--out", "o"]))
    assert got == LensShowOptions("ck", "l", "x", "o") and LensShowOptions.from_dict(got.to_dict()) == got


@pytest.mark.parametrize("prompt, said", [("   ", "the prompt is empty: give some text to read"),
                                          (None, "prompt is required")])
def test_a_bad_prompt_is_refused_by_the_command_line_check_and_a_config(prompt, said, tmp_path, capsys):
    argv = ["lens", "show", "--checkpoint", str(tmp_path / "none")] + ([] if prompt is None else ["--prompt", prompt])
    if prompt is None:   # argparse requires the flag
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and "the following arguments are required: --prompt" in capsys.readouterr().err
    else:                # refused before anything is read: no "holds no tuned lens" for the missing checkpoint
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1
    with pytest.raises(InputError, match=f"^{said}"):
        LensShowOptions(tmp_path / "none", prompt=prompt).check()
    with pytest.raises(ConfigError, match=f"^{said}"):
        LensShowOptions.from_dict({"checkpoint": "ck", "prompt": prompt})


def test_show_lens_reads_what_the_command_prints(tmp_path, capsys):
    tokenizer = CharTokenizer.from_texts([stories_text(300, seed=1)])
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=32))
    save_checkpoint(tmp_path / "run" / "checkpoint", model, tokenizer)
    batches = tuned.story_batches(tokenizer, n_batches=1, batch_size=2, seq_len=16)
    tuned.train_tuned_lens(model, batches, steps=2).save(tmp_path / "run" / "tuned_lens")
    shown = show_lens(LensShowOptions(tmp_path / "run", prompt=PROMPT, out=tmp_path / "show.html"))
    assert shown.folder == tmp_path / "run" / "tuned_lens" and shown.report == tmp_path / "show.html"
    assert shown.n_tokens == len(tokenizer.encode(PROMPT)) and shown.both.logit.labels == shown.both.tuned.labels
    assert shown.summary and shown.report.is_file()
    assert main(["lens", "show", "--checkpoint", str(tmp_path / "run"), "--prompt", PROMPT]) == 0
    out = capsys.readouterr().out
    assert f"mean over its {shown.n_tokens} tokens" in out and shown.both.table() in out
    assert "wrote" not in out   # no --out: nothing written
