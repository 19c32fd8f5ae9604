"""Cross-layer transcoders: the sparse training step against the dense one (float64), the splice's exact
logits, the field's folder layouts bit for bit, and bad input refused in one line.

(Split out of the flat test_dictionaries_clt module, issue 38.)"""
import json

import pytest
import torch

from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder

import helpers
from dictionaries.test_clt import N, L, D, model  # noqa: F401 (shared with it)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("clt_cli")
    helpers.save_char_checkpoint(root / "model", n_layers=3)
    return root


def _cli_config(root, clt: dict, transcoders: dict | None = None, **train):
    import yaml

    per_layer = {"kind": "transcoders", "architecture": "batchtopk", "d_sae": 32, "k": 4, **(transcoders or {})}
    data = {"model": str(root / "model"), "data": {"source": "stories", "n_stories": 200, "tokenizer": "char"},
            "store": {"seq_len": 16, "seqs_per_chunk": 16},
            "dictionaries": [{"kind": "clt", "architecture": "batchtopk", "d_sae": 32, "k": 4, **clt}, per_layer],
            "train": {"steps": 20, "batch_size": 64, "eval_batches": 2, "ckpt_every": 10, **train}}
    path = root / "clt.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.usefixtures("one_thread")
def test_sae_train_trains_a_clt_beside_per_layer_transcoders(tiny_checkpoint, capsys):
    from circuitlab.cli import main

    root = tiny_checkpoint
    assert main(["sae", "train", "--config", str(_cli_config(root, {})), "--out", str(root / "run"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "every MLP replaced at once" in printed and "per layer" in printed
    results = json.loads((root / "run" / "results.json").read_text())
    names = [d["name"] for d in results["dictionaries"]]
    assert names == ["clt-batchtopk", "transcoders-0", "transcoders-1", "transcoders-2"]
    m = results["dictionaries"][0]["metrics"]
    assert len(m["layer_explained_variance"]) == 3 and len(m["layer_l0"]) == 3 and "ce_recovered" in m["spliced"]
    assert results["replacements"][0]["dictionaries"] == names[1:]
    clt = CrossLayerTranscoder.load(root / "run" / "dictionaries" / "clt-batchtopk")
    assert clt.cfg.architecture == "jumprelu" and clt.cfg.normalisation["folded"] and clt.cfg.base_model["n_layers"] == 3
    # sae eval takes it too: per layer, and with every MLP replaced
    assert main(["sae", "eval", "--dictionary", str(root / "run" / "dictionaries" / "clt-batchtopk"), "--checkpoint",
                 str(root / "model"), "--batches", "2", "--seq-len", "16", "--json", str(root / "clt-eval.json")]) == 0
    printed = capsys.readouterr().out
    assert "layer 2: explained variance" in printed and "every MLP replaced" in printed
    assert len(json.loads((root / "clt-eval.json").read_text())["layer_l0"]) == 3


@pytest.mark.usefixtures("one_thread")
def test_sae_train_takes_a_target_per_layer(tiny_checkpoint):
    """--target-l0 3,2,1: the ReLU CLT is steered and saved with a target per layer, and each ReLU transcoder of
    the per-layer set with its own layer's; a wrong count is refused in one line and writes nothing."""
    from circuitlab.cli import main

    root = tiny_checkpoint
    config = _cli_config(root, {"architecture": "relu"}, transcoders={"architecture": "relu"})
    assert main(["sae", "train", "--config", str(config), "--out", str(root / "steered"), "--no-progress",
                 "--target-l0", "3,2,1"]) == 0
    saved = lambda name: json.loads((root / "steered" / "dictionaries" / name / "config.json").read_text())["metadata"]  # noqa: E731
    assert saved("clt-relu")["target_l0"] == [3.0, 2.0, 1.0] and len(saved("clt-relu")["sparsity_coeff"]) == 3
    assert [saved(f"transcoders-{l}")["target_l0"] for l in range(3)] == [3.0, 2.0, 1.0]


@pytest.mark.parametrize("target,message", [
    ("3,2", "train.target_l0 names 2 L0s but the CLT has 3 layers"),
    ("3,-1,2", "train.target_l0 must be a finite number >= 0, or a non-empty list of finite numbers > 0 (item 1 is -1.0)"),
    ("3,inf,2", "(item 1 is inf)"),
])
@pytest.mark.usefixtures("one_thread")
def test_sae_train_refuses_bad_per_layer_targets_in_one_line(tiny_checkpoint, capsys, target, message):
    from circuitlab.cli import main

    root = tiny_checkpoint
    out = root / "bad-target"
    config = _cli_config(root, {"architecture": "relu"})
    assert main(["sae", "train", "--config", str(config), "--out", str(out), "--no-progress", "--target-l0", target]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("change,message", [
    ({"n_layers": 2}, "the CLT config says n_layers=2 but the model has 3 layers"),
    ({"k": 40}, "k=40 is larger than d_sae=32"),
    ({"d_model": 8}, "the CLT config says d_model=8 but the model's d_model is 16"),
])
@pytest.mark.usefixtures("one_thread")
def test_sae_train_refuses_a_bad_clt_in_one_line_and_writes_nothing(tiny_checkpoint, capsys, change, message):
    from circuitlab.cli import main

    root = tiny_checkpoint
    out = root / "bad"
    assert main(["sae", "train", "--config", str(_cli_config(root, change)), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.usefixtures("one_thread")
def test_bundled_clt_config_trains_on_a_model(tiny_checkpoint):
    """configs/clt-demo.yaml (made for mlp-4l's model), pointed at a tiny 3-layer model."""
    from circuitlab.cli import main

    root = tiny_checkpoint
    sets = [f"model={root / 'model'}", "data.n_stories=200", "data.tokenizer=char", "store.seq_len=16",
            "store.seqs_per_chunk=16", "train.steps=3", "train.batch_size=64", "train.eval_batches=1", "train.ckpt_every=0"]
    assert main(["sae", "train", "--config", "clt-demo", "--out", str(root / "demo"), "--no-progress",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    results = json.loads((root / "demo" / "results.json").read_text())
    assert results["dictionaries"][0]["config"]["n_layers"] == 3 and len(results["dictionaries"]) == 4
    spliced = results["dictionaries"][0]["metrics"]["spliced"]
    assert spliced["ce_zero"] != spliced["ce_clean"]  # every MLP was replaced


@pytest.mark.usefixtures("one_thread")
def test_dashboards_of_a_clt_layer_name_the_layers_its_features_write_to(tiny_checkpoint, capsys):
    from circuitlab.cli import main
    from circuitlab.dictionaries import base_model_id
    from circuitlab.training import load_checkpoint

    root = tiny_checkpoint
    model, _, _ = load_checkpoint(str(root / "model"))
    clt = CrossLayerTranscoder(CLTConfig("jumprelu", n_layers=3, d_model=16, d_sae=8,
                                         base_model=base_model_id(model, "tiny")), seed=0)
    with torch.no_grad():
        for t in clt.threshold:
            t.fill_(0.01)
        clt.W_dec[1][:, 1] *= 0  # layer 1's features write only into layer 1
    clt.save(root / "clt-dash", layout="circuit-tracer")
    args = ["sae", "dashboards", "--dictionary", str(root / "clt-dash"), "--checkpoint", str(root / "model"),
            "--tokens", "256", "--no-progress"]
    assert main(args) == 2 and "choose its layer (--layer 0..2)" in capsys.readouterr().err
    assert main(args + ["--layer", "1"]) == 0
    folder = root / "clt-dash" / "dashboards-layer1"
    writes = json.loads((folder / "clt_writes.json").read_text())
    assert writes["layer"] == 1 and len(writes["write_norms"]) == 8 and len(writes["write_norms"][0]) == 2
    report = (folder / "report.html").read_text()
    assert "Writes into the MLP outputs of layers 1 (" in report and "layers 1 (1.00), 2" not in report
    view = clt.residual_view(1)
    x = torch.randn(5, 16)
    torch.testing.assert_close(view.encode(x), clt.encode_layer(x, 1))
    torch.testing.assert_close(view.W_dec, clt.decoder(1, 1) + clt.decoder(1, 2))
