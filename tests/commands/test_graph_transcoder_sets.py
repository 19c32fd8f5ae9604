"""Transcoder sets for a model that has none: `circuitlab graph` without them names the `sae train` command that
makes them, that command (the bundled transcoders-quick recipe) trains a transcoder per MLP from one forward pass
of the model per chunk of text and states its cost beside its estimate, the graph then reads the set, and a set
made for another model, or whose transcoder reads another layer's hook, is refused in one line naming it."""
import json
import re
import shlex
import shutil

import pytest

import helpers
from circuitlab.cli import main

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]   # ~4 s idle (16 s on 2 loaded cores)
SMALL = ["data.n_stories=200", "data.tokenizer=char", "store.seq_len=16", "store.seqs_per_chunk=8",
         "train.steps=6", "train.batch_size=32", "train.eval_batches=1", "train.ckpt_every=0"]


def _one_line_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A 3-layer checkpoint, and the set the graph's message says to make for it, made as it says (with test
    sizes), counting the model's forward passes and the hooks each served."""
    root = tmp_path_factory.mktemp("tc_sets")
    helpers.save_char_checkpoint(root / "model", n_layers=3)
    return root


def test_a_graph_without_transcoders_names_the_command_that_makes_them_and_that_command_works(made, capsys,
                                                                                             monkeypatch):
    from circuitlab.dictionaries.store import ModelActivations

    monkeypatch.chdir(made)
    err = _one_line_error(["graph", "--checkpoint", "model", "--prompt", "Lily saw"], capsys)
    command = re.search(r"(circuitlab sae train .*?), then give --transcoders (\S+)", err)
    assert command, err
    argv, out = shlex.split(command.group(1))[1:], command.group(2)
    assert argv[:4] == ["sae", "train", "--config", "transcoders-quick"] and "model=model" in argv and out == \
        "runs/transcoders-model"
    served = []
    forward = ModelActivations._forward

    def counted(self, tokens):
        got = forward(self, tokens)
        served.append(sorted(got))
        return got

    monkeypatch.setattr(ModelActivations, "_forward", counted)
    assert main([*argv, "--no-progress", *[a for s in SMALL for a in ("--set", s)]]) == 0
    printed = capsys.readouterr().out
    hooks = sorted(f"blocks.{layer}.{h}" for layer in range(3) for h in ("ln2.hook_normalized", "hook_mlp_out"))
    passes = len(served) - 1   # the first is the probe that reads the hooks' widths
    assert all(s == hooks for s in served), served   # one forward serves all three layers' inputs and outputs
    # the first chunk again for the input scales, 6 steps x 32 rows over chunks of 8 x 15 rows, one held-out
    # evaluation batch: what was estimated, done
    assert passes == 1 + 2 + 1
    assert re.search(rf"^cost: {passes} model passes \([\d.]+ MFLOP, each serving all 6 hooks\) \+ [\d.]+ [MG]FLOP in "
                     r"the dictionaries \(6 steps\) in \d+ s \(estimated \d+ s\)$", printed, re.M), printed
    assert main([*argv, "--estimate", "--out", "elsewhere", *[a for s in SMALL for a in ("--set", s)]]) == 0
    assert re.search(rf"estimate: .*cost: {passes} model passes \([\d.]+ MFLOP, one pass serving all 6 hooks\) \+ [\d.]+ [MG]FLOP in the dictionaries\) holds",
                     capsys.readouterr().out)
    results = json.loads((made / out / "results.json").read_text())
    assert [d["name"] for d in results["dictionaries"]] == ["transcoders-0", "transcoders-1", "transcoders-2"]
    assert "ce_recovered" in results["replacements"][0]["spliced"]
    assert main(["graph", "--checkpoint", "model", "--transcoders", out, "--prompt", "Lily saw", "--out", "g",
                 "--dashboard-tokens", "0"]) == 0
    assert (made / "g" / "graph.json").is_file()


def test_a_set_for_another_model_or_another_layers_hook_is_refused_in_one_line(made, capsys, monkeypatch):
    monkeypatch.chdir(made)
    if not (made / "runs" / "transcoders-model" / "results.json").is_file():
        pytest.skip("needs the set the test above makes")
    helpers.save_char_checkpoint(made / "other", n_layers=3, seed=1)   # the same shape, other weights
    err = _one_line_error(["graph", "--checkpoint", "other", "--transcoders", "runs/transcoders-model", "--prompt",
                           "Lily saw", "--out", "g2"], capsys)
    assert "the transcoder for layer 0 was trained on model" in err and "the same configuration with other weights" \
        in err, err
    helpers.save_char_checkpoint(made / "deeper", n_layers=4)
    err = _one_line_error(["graph", "--checkpoint", "deeper", "--transcoders", "runs/transcoders-model", "--prompt",
                           "Lily saw", "--out", "g3"], capsys)
    assert "(d_model 16, 3 layers), not on this model: this one has d_model 16 and 4 layers" in err, err
    # layer 1's transcoder pointed at layer 0's MLP input: its config names the hook it reads
    moved = made / "moved"
    shutil.copytree(made / "runs" / "transcoders-model" / "dictionaries", moved)
    from circuitlab.dictionaries import SparseDictionary

    tc = SparseDictionary.load(moved / "transcoders-1")
    tc.cfg = tc.cfg.replace(hook_name="blocks.0.ln2.hook_normalized")
    tc.save(moved / "transcoders-1")
    err = _one_line_error(["graph", "--checkpoint", "model", "--transcoders", "moved", "--prompt", "Lily saw",
                           "--out", "g4"], capsys)
    assert "the transcoder for layer 1 reads blocks.0.ln2.hook_normalized, not a hook of its own layer" in err, err
