"""`circuitlab sae export`: a run's dictionaries in every layout circuitlab reads, round-tripped: exported, then
read by our published-format readers (SparseDictionary.load, load_transcoders, CrossLayerTranscoder.load) as a
user would, they compute the source's latents and reconstructions (float64, 1e-6); ours keeps every tensor
exactly. A layout that cannot hold an item is one line, and nothing is written."""
import copy
import json

import pytest
import torch

from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder

D = 16


def _noisy(module, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if "threshold" in name:
                p.abs_()
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run's dictionaries/ as `sae train` writes them: two CLTs, a per-layer set, a JumpReLU SAE (one threshold
    for all latents, as Llama Scope needs) and a TopK SAE."""
    root = tmp_path_factory.mktemp("export") / "run"
    dicts = root / "dictionaries"
    _noisy(CrossLayerTranscoder(CLTConfig("batchtopk", n_layers=2, d_model=D, d_sae=12, k=3), seed=0), 1).save(dicts / "clt-batchtopk")
    _noisy(CrossLayerTranscoder(CLTConfig("topk", n_layers=2, d_model=D, d_sae=12, k=3), seed=1), 2).save(dicts / "clt-topk")
    for layer in range(2):
        _noisy(SparseDictionary(DictionaryConfig("relu", d_in=D, d_sae=20, skip=True, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                                                 out_hook_name=f"blocks.{layer}.hook_mlp_out"), seed=layer), 3 + layer
               ).save(dicts / f"transcoders-{layer}")
    sae = _noisy(SparseDictionary(DictionaryConfig("jumprelu", d_in=D, d_sae=20, hook_name="blocks.1.hook_resid_post"), seed=5), 6)
    with torch.no_grad():
        sae.threshold.fill_(0.05)
    sae.save(dicts / "sae-res")
    _noisy(SparseDictionary(DictionaryConfig("topk", d_in=D, d_sae=20, k=4, hook_name="blocks.0.hook_resid_pre"), seed=7), 8
           ).save(dicts / "sae-topk")
    return root


def same(a, b, where):
    a, b = copy.deepcopy(a.for_inference()).double(), copy.deepcopy(b.for_inference()).double()
    shape = (9, a.cfg.n_layers, a.cfg.d_model) if isinstance(a, CrossLayerTranscoder) else (9, a.cfg.d_in)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        (ya, fa), (yb, fb) = a(x), b(x)
    torch.testing.assert_close(fb, fa, atol=1e-6, rtol=1e-6, msg=f"{where}: latents")
    torch.testing.assert_close(yb, ya, atol=1e-6, rtol=1e-6, msg=f"{where}: reconstructions")


# layout -> the items it holds of the run above
HELD = {"circuitlab": ["clt-batchtopk", "clt-topk", "sae-res", "sae-topk", "transcoders"],
        "saelens": ["sae-res", "sae-topk", "transcoders"],
        "circuit-tracer": ["clt-batchtopk", "transcoders"],
        "sparsify": ["clt-topk"],
        "gemma-scope": ["sae-res"],
        "gemma-scope-2": ["sae-res"],
        "llama-scope": ["sae-res"]}


@pytest.mark.parametrize("layout", list(HELD))
def test_export_then_our_readers_give_the_same_dictionaries(run, layout, tmp_path, capsys):
    from circuitlab.cli import main
    from circuitlab.dictionaries import load_transcoders
    from circuitlab.dictionaries.sets import dictionary_sets

    source = dictionary_sets(run)
    out = tmp_path / layout
    assert main(["sae", "export", str(run), "--layout", layout, "--out", str(out), "--only", *HELD[layout]]) == 0
    written = json.loads((out / "export.json").read_text())["written"]
    assert sorted(written) == HELD[layout]
    for name, folders in written.items():
        found = source[name]
        if isinstance(found, CrossLayerTranscoder):
            back = CrossLayerTranscoder.load(out / folders[0])
            same(found, back, f"{layout} {name}")
            if layout == "circuitlab":
                assert all(torch.equal(a, b) for a, b in zip(found.state_dict().values(), back.state_dict().values()))
        elif isinstance(found, dict) and layout == "circuit-tracer":
            for d, b in zip(found.values(), load_transcoders(out / folders[0]), strict=True):
                same(d, b, f"{layout} {name}")
        else:
            members = found if isinstance(found, dict) else {name: found}
            for (member, d), folder in zip(members.items(), folders, strict=True):
                back = SparseDictionary.load(out / folder)
                same(d, back, f"{layout} {member}")
                assert (back.cfg.hook_name, back.cfg.out_hook_name) == (d.cfg.hook_name, d.cfg.out_hook_name)
                if layout == "circuitlab":
                    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    if layout == "circuitlab":  # ours reads back as the same sets, so graph --transcoder-set names them alike
        assert list(dictionary_sets(out)) == list(source)


@pytest.mark.parametrize("layout,only,said", [
    ("sparsify", ["transcoders"], "sparsify's layout is read for CLTs only"),
    ("gemma-scope", ["sae-topk"], "reads blocks.0.hook_resid_pre: Gemma Scope's paths name resid_post"),
    ("llama-scope", ["sae-topk"], "Llama Scope files hold JumpReLU dictionaries; a topk one cannot"),
    ("gemma-scope", ["transcoders"], "no skip connection"),
    ("circuit-tracer", ["sae-res"], "an SAE: circuit-tracer's layouts hold per-layer transcoder sets and CLTs"),
    ("saelens", ["clt-topk"], "is a cross-layer transcoder: saelens files hold one layer's dictionary"),
    ("circuit-tracer", ["clt-topk"], "a topk CLT cannot be written in its layout"),
    ("circuitlab", ["nope"], "holds no nope; it holds clt-batchtopk (a cross-layer transcoder)"),
])
def test_what_a_layout_cannot_hold_is_one_line_and_nothing_is_written(run, layout, only, said, tmp_path, capsys):
    from circuitlab.cli import main

    out = tmp_path / "out"
    assert main(["sae", "export", str(run), "--layout", layout, "--out", str(out), "--only", *only]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_an_earlier_export_is_set_aside_only_when_the_new_one_is_complete(run, tmp_path, capsys):
    from circuitlab.cli import main

    out = tmp_path / "out"
    args = ["sae", "export", str(run), "--layout", "saelens", "--out", str(out), "--only", "sae-res"]
    assert main(args) == 0
    assert main([*args[:-1], "sae-topk", "--layout", "gemma-scope"]) == 2  # refused: the earlier one stays in place
    assert sorted(json.loads((out / "export.json").read_text())["written"]) == ["sae-res"]
    capsys.readouterr()
    assert main([*args[:-1], "sae-topk"]) == 0
    kept = capsys.readouterr().out.split("kept the earlier export as ")[1].split()[0]
    assert sorted(json.loads((out / "export.json").read_text())["written"]) == ["sae-topk"]
    assert sorted(json.loads((tmp_path / kept.split("/")[-1] / "export.json").read_text())["written"]) == ["sae-res"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main([*args[:4], "saelens", "--out", str(tmp_path / "other")]) == 2
    assert "already holds other files" in capsys.readouterr().err


def test_the_export_flags_the_options_class_and_from_dict_agree(capsys):
    """`sae export`'s arguments are ExportOptions' fields: the same defaults, and a bad layout refused by the
    command line and by check() alike (before any work)."""
    from circuitlab.cli import build_parser, main
    from circuitlab.dictionaries.export import LAYOUTS, ExportOptions
    from circuitlab.errors import ConfigError, InputError

    def parse(*argv):
        return ExportOptions.from_args(build_parser().parse_args(["sae", "export", *argv]))

    needed = {"source": "runs/x", "layout": "saelens", "out": "o"}
    assert parse("runs/x", "--layout", "saelens", "--out", "o") == ExportOptions(**needed) == \
        ExportOptions.from_dict(needed)
    assert ExportOptions(**needed).only is None and not ExportOptions(**needed).overwrite
    given = parse("runs/x", "--layout", "saelens", "--out", "o", "--only", "a", "b", "--overwrite")
    assert given == ExportOptions.from_dict({**needed, "only": ["a", "b"], "overwrite": True})
    assert given.only == ("a", "b")
    with pytest.raises(SystemExit) as stop:
        main(["sae", "export", "runs/x", "--layout", "nope", "--out", "o"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "argument --layout: invalid choice: 'nope'" in err
    with pytest.raises(InputError, match=f"^layout must be one of {', '.join(LAYOUTS)}, got 'nope'$"):
        ExportOptions(**{**needed, "layout": "nope"}).check()
    with pytest.raises(ConfigError, match="^out is required$"):
        ExportOptions.from_dict({"source": "runs/x", "layout": "saelens"})
