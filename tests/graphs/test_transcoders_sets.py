"""A run holding several transcoder sets (what `sae train --config clt-demo` writes: a CLT beside a transcoder per
layer, and maybe SAEs) is graphed set by set: `--transcoder-set NAME` picks one, without it the run is refused
naming its sets; one transcoder's own folder is a partial set."""
import pytest
import torch

import helpers
from circuitlab import ModelConfig


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """root/model (a 2-layer MLP model, char tokenizer) and root/run/dictionaries/ as clt-demo writes it:
    clt-batchtopk, transcoders-0, transcoders-1, plus an SAE beside them."""
    from circuitlab.data.stories import stories_text
    from circuitlab.data.tokenizers import CharTokenizer
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary, base_model_id
    from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
    from circuitlab.training import save_checkpoint

    root = tmp_path_factory.mktemp("sets")
    tok = CharTokenizer.from_texts([stories_text(50)])
    model = helpers.random_model(ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64,
                                                         n_ctx=32, d_vocab=tok.vocab_size), scale=1.0).eval()
    save_checkpoint(root / "model", model, tok)
    dicts = root / "run" / "dictionaries"
    base = base_model_id(model)
    CrossLayerTranscoder(CLTConfig("jumprelu", n_layers=2, d_model=32, d_sae=24, base_model=base),
                         seed=0).save(dicts / "clt-batchtopk")
    for layer in range(2):
        SparseDictionary(DictionaryConfig("relu", d_in=32, d_sae=24, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                                          out_hook_name=f"blocks.{layer}.hook_mlp_out", base_model=base),
                         seed=layer).save(dicts / f"transcoders-{layer}")
    SparseDictionary(DictionaryConfig("relu", d_in=32, d_sae=24, hook_name="blocks.1.hook_resid_pre", base_model=base),
                     seed=5).save(dicts / "blocks.1.hook_resid_pre-relu")
    return root, model


def test_a_run_with_two_sets_is_refused_naming_them(run):
    from circuitlab.errors import InputError
    from circuitlab.graphs import Transcoders

    root, model = run
    with pytest.raises(InputError, match=r"holds 2 transcoder sets: clt-batchtopk \(a cross-layer transcoder\), "
                                         r"transcoders \(2 per-layer transcoders\); name one \(--transcoder-set"):
        Transcoders.load(model, root / "run")
    with pytest.raises(InputError, match="no transcoder set 'nope'; it holds clt-batchtopk"):
        Transcoders.load(model, root / "run", set_name="nope")


def test_each_set_is_picked_by_name(run):
    from circuitlab.graphs import Transcoders
    from circuitlab.graphs.transcoders import CrossLayerTranscoders

    root, model = run
    clt = Transcoders.load(model, root / "run", set_name="clt-batchtopk")
    assert isinstance(clt, CrossLayerTranscoders) and list(clt.writes(0)) == [0, 1]
    per = Transcoders.load(model, root / "run" / "dictionaries", set_name="transcoders")
    assert not isinstance(per, CrossLayerTranscoders) and per.layers == [0, 1]
    for layer in (0, 1):  # the very dictionaries saved as transcoders-<layer>
        from circuitlab.dictionaries import SparseDictionary

        saved = SparseDictionary.load(root / "run" / "dictionaries" / f"transcoders-{layer}")
        assert torch.equal(per.dictionary(layer).W_dec, saved.W_dec)


def test_one_transcoders_folder_is_a_partial_set(run):
    from circuitlab.errors import InputError
    from circuitlab.graphs import Transcoders

    root, model = run
    one = root / "run" / "dictionaries" / "transcoders-1"
    with pytest.raises(InputError, match=r"cover layers \[1\] but not \[0\].*--partial"):
        Transcoders.load(model, one)
    assert Transcoders.load(model, one, allow_partial=True).layers == [1]
    with pytest.raises(InputError, match="is one transcoder set: drop the set name"):
        Transcoders.load(model, one, set_name="transcoders")


@pytest.mark.parametrize("name,kind", [("clt-batchtopk", "cross-layer"), ("transcoders", "2 per-layer")])
def test_graph_command_names_either_set(run, name, kind, tmp_path, capsys, one_thread):
    import json

    from circuitlab.cli import main

    root, _ = run
    out = tmp_path / name
    assert main(["graph", "--checkpoint", str(root / "model"), "--transcoders", str(root / "run"),
                 "--transcoder-set", name, "--prompt", "Lily saw a cat.", "--dashboard-tokens", "0",
                 "--out", str(out)]) == 0
    assert kind in json.dumps(json.loads((out / "results.json").read_text()))
    capsys.readouterr()
    assert main(["graph", "--checkpoint", str(root / "model"), "--transcoders", str(root / "run"),
                 "--prompt", "Lily saw a cat.", "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "holds 2 transcoder sets" in err and len(err.strip().splitlines()) == 1


def test_the_explorer_takes_either_set(run):
    """`circuitlab serve --transcoders RUN --transcoder-set NAME`: the explorer's interventions use the named set."""
    from circuitlab.errors import InputError
    from circuitlab.serve.app import create_app

    root, _ = run
    for name in ("clt-batchtopk", "transcoders"):
        create_app(root / "model", transcoders=root / "run", transcoder_set=name)
    with pytest.raises(InputError, match="holds 2 transcoder sets"):
        create_app(root / "model", transcoders=root / "run")
