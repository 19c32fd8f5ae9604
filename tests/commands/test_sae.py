"""circuitlab sae train / eval end to end on a tiny checkpoint, and their one-line errors."""
import json

import pytest
import yaml

import helpers
from circuitlab.cli import main
from circuitlab.config import ModelConfig
from circuitlab.model import Transformer
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("sae_cli")
    helpers.save_char_checkpoint(root / "model", n_layers=2)
    return root


def _config(root, **changes):
    data = {"model": str(root / "model"), "data": {"source": "stories", "n_stories": 200, "tokenizer": "char"},
            "store": {"seq_len": 16, "seqs_per_chunk": 16, "cache": str(root / "cache")},
            "dictionaries": [{"architecture": "topk", "hook_name": "blocks.0.hook_resid_post", "d_sae": 32, "k": 4},
                             {"architecture": "relu", "hook_name": "blocks.1.ln2.hook_normalized", "d_sae": 32,
                              "out_hook_name": "blocks.1.hook_mlp_out", "skip": True}],
            "train": {"steps": 30, "batch_size": 64, "eval_batches": 2, "ckpt_every": 10}}
    data.update(changes)
    path = root / "sae.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_sae_train_then_eval(tiny_checkpoint, capsys):
    root = tiny_checkpoint
    out = root / "run"
    assert main(["sae", "train", "--config", str(_config(root)), "--out", str(out), "--no-progress", "--target-l0", "6"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["dictionaries"]) == 2
    assert "ce_recovered" in results["dictionaries"][0]["metrics"]["spliced"]
    assert (root / "cache" / "cache.json").is_file()
    folder = out / "dictionaries" / "blocks.1.ln2.hook_normalized-relu"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["out_hook_name"] == "blocks.1.hook_mlp_out" and cfg["normalisation"]["folded"]
    assert cfg["metadata"]["target_l0"] == 6.0 and cfg["metadata"]["sparsity_coeff"] > 0  # --target-l0: ReLU steered
    topk = json.loads((out / "dictionaries" / "blocks.0.hook_resid_post-topk" / "config.json").read_text())
    assert "target_l0" not in topk["metadata"]  # TopK keeps its k
    capsys.readouterr()
    assert main(["sae", "eval", "--dictionary", str(folder), "--checkpoint", str(root / "model"), "--batches", "2",
                 "--seq-len", "16", "--json", str(root / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "CE recovered" in out
    assert "MSE" in out and "(model units, summed over dims; sae train logs the same)" in out   # one labelled scale
    assert "dead" in out and "fired on none of the 32 tokens: a rate below 1/32 reads as dead" in out  # 2 x 16
    assert json.loads((root / "m.json").read_text())["spliced"]["ce_clean"] > 0
    # a dictionary recorded for another base model
    other = root / "other"
    save_checkpoint(other, Transformer(ModelConfig.from_preset("gpt2-tiny", d_model=16, n_heads=2, n_layers=2,
                                                               d_vocab=60, n_ctx=32)))
    assert main(["sae", "eval", "--dictionary", str(folder), "--checkpoint", str(other)]) == 2
    assert "was trained on" in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ({"dictionaries": [{"architecture": "topk", "hook_name": "blocks.0.hook_resid_pots", "d_sae": 32, "k": 4}]},
     "closest: blocks.0.hook_resid_post"),
    ({"dictionaries": [{"architecture": "topk", "hook_name": "blocks.0.hook_resid_post", "d_sae": 32, "k": 64}]},
     "k=64 is larger than d_sae=32"),
    ({"dictionaries": [{"architecture": "relu", "hook_name": "blocks.0.hook_resid_post", "d_sae": 32, "d_in": 10}]},
     "d_in mismatch"),
])
def test_sae_train_bad_input_is_one_line_and_writes_nothing(tiny_checkpoint, capsys, change, message):
    root = tiny_checkpoint
    out = root / "bad"
    assert main(["sae", "train", "--config", str(_config(root, store={"seq_len": 16}, **change)), "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


def test_sae_eval_refuses_a_truncated_dictionary(tmp_path, capsys, tiny_checkpoint):
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary

    folder = SparseDictionary(DictionaryConfig("relu", d_in=16, d_sae=8, hook_name="blocks.0.hook_resid_post")).save(tmp_path / "d")
    weights = folder / "dictionary.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["sae", "eval", "--dictionary", str(folder), "--checkpoint", str(tiny_checkpoint / "model")]) == 2
    assert "corrupt or truncated" in capsys.readouterr().err


def test_bundled_transcoder_config_trains_a_transcoder_that_replaces_the_mlp(tiny_checkpoint, capsys):
    """configs/transcoder-demo.yaml (made for the features demo's model), pointed at a tiny model."""
    root = tiny_checkpoint
    out = root / "transcoder"
    sets = [f"model={root / 'model'}", "data.n_stories=200", "data.tokenizer=char", "store.seq_len=16",
            "store.seqs_per_chunk=16", "train.steps=4", "train.batch_size=64", "train.eval_batches=1", "train.ckpt_every=0"]
    assert main(["sae", "train", "--config", "transcoder-demo", "--out", str(out), "--no-progress",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    entries = json.loads((out / "results.json").read_text())["dictionaries"]  # one per layer: transcoders-L
    assert [e["name"] for e in entries] == ["transcoders-0", "transcoders-1"]
    for layer, entry in enumerate(entries):
        assert entry["config"]["hook_name"] == f"blocks.{layer}.ln2.hook_normalized"
        assert entry["config"]["out_hook_name"] == f"blocks.{layer}.hook_mlp_out" and entry["config"]["skip"]
        assert entry["metrics"]["spliced"]["ce_zero"] != entry["metrics"]["spliced"]["ce_clean"]  # the MLP was replaced
