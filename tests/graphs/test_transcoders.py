"""Attribution graphs against truth: a forged model whose MLPs are planted sparse dictionaries (exact
transcoders: zero errors, scores 1.0, the planted path strongest, decoys pruned), and every edge of a
random model's graph checked as an effect in the frozen replacement model (float64, 1e-8).

(Split out of the flat test_graphs module, issue 38.)"""
import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.graphs import ReplacementModel, Transcoders, attribute

from graphs.test_attribution import random_transcoder, setup, measured_effect, real_clt  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("layout", ["circuitlab", "circuit-tracer", "sparsify"])
def test_transcoders_load_a_cross_layer_transcoder_folder_in_every_layout(setup, tmp_path, layout):
    model, tc, tokens, _ = setup
    dicts = [tc.dictionary(layer) for layer in range(3)]
    arch, k = ("topk", 4) if layout == "sparsify" else ("relu", None)   # sparsify's CLTs are TopK only
    clt = real_clt(dicts, cross=0.3, architecture=arch, k=k)
    want = attribute(model, Transcoders.cross_layer(model, clt), tokens, batch_size=16)
    clt.save(tmp_path / "clt", layout=layout)
    loaded = Transcoders.load(model, tmp_path / "clt")
    assert loaded.describe().startswith(f"a {arch} cross-layer transcoder")
    got = attribute(model, loaded, tokens, batch_size=16)
    assert torch.equal(got.active_features, want.active_features)
    torch.testing.assert_close(got.adjacency, want.adjacency, atol=1e-5 * float(want.adjacency.abs().max()), rtol=0)
    if layout == "circuitlab":  # a `sae train` run with kind: clt keeps it under dictionaries/
        clt.save(tmp_path / "run" / "dictionaries" / "clt")
        assert isinstance(Transcoders.load(model, tmp_path / "run"), type(loaded))
        dicts[0].save(tmp_path / "run" / "dictionaries" / "layer0")
        with pytest.raises(CircuitlabError, match="cross-layer"):
            Transcoders.load(model, tmp_path / "run")


def test_a_cross_layer_transcoder_for_another_model_is_refused_in_one_line(setup):
    model, tc, _, _ = setup
    dicts = [tc.dictionary(layer) for layer in range(3)]
    with pytest.raises(CircuitlabError, match="layers"):
        Transcoders.cross_layer(model, real_clt(dicts[:2]))
    clt = real_clt(dicts)
    clt.cfg.input_hook = "blocks.{layer}.hook_nonesuch"
    with pytest.raises(CircuitlabError, match="nonesuch"):
        Transcoders.cross_layer(model, clt)


def test_transcoders_load_from_circuit_tracers_layout_and_give_the_same_graph(setup, tmp_path):
    from circuitlab.dictionaries.published import save_transcoders

    model, tc, tokens, graph = setup
    save_transcoders([tc.dictionary(layer) for layer in range(3)], tmp_path / "set")
    loaded = Transcoders.load(model, tmp_path / "set")
    again = attribute(model, loaded, tokens, batch_size=16)   # the layout stores float32: equal to its precision
    assert float((again.adjacency - graph.adjacency).abs().max()) <= 1e-5 * float(graph.adjacency.abs().max())
    assert torch.equal(again.active_features, graph.active_features)


CT_FAMILIES = {  # a pre-norm LayerNorm model, Gemma-2's sandwich norms (RMSNorm), OLMo-2's post-norms only
    "pre-norm": dict(preset="gpt2-tiny"),
    "sandwich": dict(preset="llama-tiny", block_norms="sandwich", mlp="geglu", embed_scale=4.0),
    "post-only": dict(preset="llama-tiny", block_norms="post", qk_norm="full"),
}


def ct_family_model(family: str, hook_in: str):
    """A 2-layer float64 model of CT_FAMILIES[family] with its norms and biases moved off their defaults (so a
    hook before or after a norm's gain differs); skips where the family has no norm before the MLP."""
    from circuitlab import Transformer

    spec = dict(CT_FAMILIES[family])
    if family == "post-only" and hook_in == "ln2.hook_normalized":
        pytest.skip("no norm before the MLP (OLMo-2): TransformerLens's ln2 there is the post-MLP norm")
    cfg = ModelConfig.from_preset(spec.pop("preset"), n_layers=2, d_model=16, n_heads=4, d_vocab=40, n_ctx=12, **spec)
    torch.manual_seed(0)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.3 * torch.randn_like(p)) if name.endswith((".w", ".b", ".bias")) else p.mul_(8)
    return model


def tl_point(model, cache, layer: int, name: str) -> torch.Tensor:
    """What circuit-tracer (on TransformerLens) reads or writes at blocks.{layer}.{name}, by hand from our cache."""
    block, pre = model.blocks[layer], f"blocks.{layer}."
    if name == "hook_resid_mid":
        return cache[pre + "hook_resid_mid"]
    if name in ("ln2.hook_normalized", "mlp.hook_in"):
        if model.cfg.block_norms == "post":   # no norm before the MLP: its input is the stream itself
            return cache[pre + "hook_resid_mid"]
        x = cache[pre + "ln2.hook_normalized"]   # ours: before the gain; TransformerLens's LayerNorm: after
        after = x * block.ln2.w + block.ln2.bias
        return after if name == "mlp.hook_in" or block.ln2.kind == "layernorm" else x
    if name == "hook_mlp_out":
        return cache[pre + "hook_mlp_out"]
    return block.mlp(block.ln2(cache[pre + "hook_resid_mid"]))   # mlp.hook_out: before any post-MLP norm


def replacement_matches_model_and_edges(model, tc, rm, tokens) -> None:
    """The replacement model (with its error nodes) gives the model's logits, and six sampled edges of the graph
    equal the effect measured by intervening on the source (float64)."""
    torch.testing.assert_close(rm.run().logits, model(tokens[None]), atol=1e-9, rtol=0)
    graph = attribute(model, tc, tokens, batch_size=8)
    nonzero = (graph.adjacency != 0).nonzero()
    for t, s in nonzero[torch.randperm(len(nonzero), generator=torch.Generator().manual_seed(0))[:6]].tolist():
        assert measured_effect(rm, graph, t, s) == pytest.approx(float(graph.adjacency[t, s]), abs=1e-8), \
            (graph.label(t), graph.label(s))


@pytest.mark.parametrize("family", list(CT_FAMILIES))
@pytest.mark.parametrize("hook_in", ["hook_resid_mid", "ln2.hook_normalized", "mlp.hook_in"])
@pytest.mark.parametrize("hook_out", ["hook_mlp_out", "mlp.hook_out"])
def test_every_circuit_tracer_hook_is_read_on_every_family(family, hook_in, hook_out, tmp_path):
    """A circuit-tracer set naming each feature_input_hook / feature_output_hook its configs use, read through our
    importer bound to the model: the encoder reads what TransformerLens names so, the error node is what the MLP
    wrote at the output hook minus the transcoder's rebuild, the replacement model computes the model, and sampled
    edges are measured effects (float64). (tests/graphs/test_attribution_circuit_tracer.py: the same graphs as circuit-tracer.)"""
    import yaml
    from safetensors.torch import save_file

    from circuitlab.dictionaries import load_transcoders
    from circuitlab.dictionaries.published import bind

    model = ct_family_model(family, hook_in)
    g = torch.Generator().manual_seed(5)
    for layer in range(2):
        save_file({"W_enc": torch.randn(24, 16, generator=g) / 4, "W_dec": 0.3 * torch.randn(24, 16, generator=g),
                   "b_enc": torch.zeros(24), "b_dec": 0.1 * torch.randn(16, generator=g),
                   "W_skip": 0.1 * torch.randn(16, 16, generator=g)}, str(tmp_path / f"layer_{layer}.safetensors"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model_kind": "transcoder_set", "activation": "relu",
                                                          "feature_input_hook": hook_in,
                                                          "feature_output_hook": hook_out}))
    raw = [d.to(torch.float64) for d in load_transcoders(tmp_path)]   # unbound: the file's weights, as circuit-tracer's
    tc = Transcoders.per_layer(model, [bind(d, model) for d in raw])  # load_transcoders(..., model=), in float64
    tokens = torch.randint(0, 40, (7,), generator=torch.Generator().manual_seed(3))
    _, cache = model.run_with_cache(tokens[None])
    rm = ReplacementModel(model, tc, tokens)
    for layer in range(2):
        x = tl_point(model, cache, layer, hook_in)[0].double()
        by_hand = (x @ raw[layer].W_enc + raw[layer].b_enc).relu()
        torch.testing.assert_close(rm.acts[layer], by_hand, atol=1e-10, rtol=1e-10)
        rebuilt = by_hand @ raw[layer].W_dec + raw[layer].b_dec + x @ raw[layer].W_skip
        out = tl_point(model, cache, layer, hook_out)[0].double()
        torch.testing.assert_close(rm.errors[layer], out - rebuilt, atol=1e-9, rtol=1e-9)
    replacement_matches_model_and_edges(model, tc, rm, tokens)


@pytest.mark.parametrize("family", list(CT_FAMILIES))
@pytest.mark.parametrize("hook_in,hook_out", [("mlp.hook_in", "mlp.hook_out"), ("ln2.hook_normalized", "hook_mlp_out"),
                                              ("hook_resid_mid", "mlp.hook_out")])
def test_a_circuit_tracer_cross_layer_transcoder_reads_its_hooks_on_every_family(family, hook_in, hook_out, tmp_path):
    """The same for circuit-tracer's cross_layer_transcoder layout (W_enc_i / W_dec_i files), read by hand."""
    import yaml
    from safetensors.torch import save_file

    from circuitlab.dictionaries.clt import CrossLayerTranscoder
    from circuitlab.graphs.transcoders import CrossLayerTranscoders

    model = ct_family_model(family, hook_in)
    g, L, d, n = torch.Generator().manual_seed(6), 2, 16, 20
    files = []
    for i in range(L):
        enc = {f"W_enc_{i}": torch.randn(n, d, generator=g) / 4, f"b_enc_{i}": torch.zeros(n),
               f"b_dec_{i}": 0.1 * torch.randn(d, generator=g), f"W_skip_{i}": 0.1 * torch.randn(d, d, generator=g)}
        dec = {f"W_dec_{i}": 0.3 * torch.randn(n, L - i, d, generator=g)}
        save_file(enc, str(tmp_path / f"W_enc_{i}.safetensors"))
        save_file(dec, str(tmp_path / f"W_dec_{i}.safetensors"))
        files.append({k.rsplit("_", 1)[0]: v.double() for k, v in {**enc, **dec}.items()})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model_kind": "cross_layer_transcoder",
                                                          "feature_input_hook": hook_in,
                                                          "feature_output_hook": hook_out}))
    assert isinstance(Transcoders.load(model, tmp_path), CrossLayerTranscoders)   # the command's path (float32)
    tc = Transcoders.cross_layer(model, CrossLayerTranscoder.load(tmp_path).double())   # bound in float64
    tokens = torch.randint(0, 40, (7,), generator=torch.Generator().manual_seed(3))
    _, cache = model.run_with_cache(tokens[None])
    rm = ReplacementModel(model, tc, tokens)
    xs = [tl_point(model, cache, layer, hook_in)[0].double() for layer in range(L)]
    acts = [(xs[s] @ files[s]["W_enc"].T + files[s]["b_enc"]).relu() for s in range(L)]
    for t in range(L):
        torch.testing.assert_close(rm.acts[t], acts[t], atol=1e-10, rtol=1e-10)
        rebuilt = files[t]["b_dec"] + xs[t] @ files[t]["W_skip"] + sum(acts[s] @ files[s]["W_dec"][:, t - s]
                                                                          for s in range(t + 1))
        out = tl_point(model, cache, t, hook_out)[0].double()
        torch.testing.assert_close(rm.errors[t], out - rebuilt, atol=1e-9, rtol=1e-9)
    replacement_matches_model_and_edges(model, tc, rm, tokens)


def test_a_partial_circuit_tracer_set_is_bound_to_the_model(setup, tmp_path):
    """--partial with circuit-tracer's names (mlp.hook_in, mlp.hook_out): each layer bound to the model, as a
    whole set is (before, a partial set was not bound and its names were refused)."""
    import yaml

    from circuitlab.dictionaries.published import save_transcoders

    model, tc, tokens, _ = setup
    save_transcoders([tc.dictionary(layer) for layer in range(2)], tmp_path / "set")
    raw = yaml.safe_load((tmp_path / "set" / "config.yaml").read_text())
    raw.update(feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out")
    raw.pop("hook_names", None)
    (tmp_path / "set" / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(CircuitlabError, match="2 layers but the model has 3"):
        Transcoders.load(model, tmp_path / "set")
    part = Transcoders.load(model, tmp_path / "set", allow_partial=True)
    assert part.layers == [0, 1]
    assert [part.input_hook(i) for i in (0, 1)] == [f"blocks.{i}.ln2.hook_normalized" for i in (0, 1)]
    assert [part.output_hook(i) for i in range(3)] == [f"blocks.{i}.hook_mlp_out" for i in range(3)]
    rm = ReplacementModel(model, part, tokens)
    torch.testing.assert_close(rm.run().logits, model(tokens[None]), atol=1e-5, rtol=0)


def test_transcoder_configs_that_are_not_utf8_are_one_line(tmp_path, monkeypatch, capsys):
    """`graph --transcoders` reads each layout's config through circuitlab.textfile: a Latin-1 byte in our
    dictionary's config.json, circuit-tracer's config.yaml (a per-layer set or a CLT) or sparsify's cfg.json
    is one line naming the file and the byte, exit 2."""
    import shutil

    from circuitlab.cli import main
    from circuitlab.dictionaries.published import save_transcoders
    from helpers import saved_graph_run

    model, tok, tc, _ = saved_graph_run(tmp_path, n_layers=2, d_sae=24)
    dicts = [tc.dictionary(layer) for layer in range(2)]
    save_transcoders(dicts, tmp_path / "ct-set")
    real_clt([d.to(torch.float64) for d in dicts], cross=0.3).save(tmp_path / "ct-clt", layout="circuit-tracer")
    real_clt([d.to(torch.float64) for d in dicts], cross=0.3, architecture="topk", k=4).save(
        tmp_path / "sp-clt", layout="sparsify")
    shutil.copytree(tmp_path / "transcoders", tmp_path / "ours")
    spoiled = {"ours": tmp_path / "ours" / "layer0" / "config.json", "ct-set": tmp_path / "ct-set" / "config.yaml",
               "ct-clt": tmp_path / "ct-clt" / "config.yaml",
               "sp-clt": next((tmp_path / "sp-clt").rglob("cfg.json"))}
    for file in spoiled.values():
        file.write_bytes(file.read_bytes() + b"\n# caf\xe9\n")
    monkeypatch.chdir(tmp_path)
    for name, file in spoiled.items():
        code = main(["graph", "--checkpoint", "model/checkpoint", "--transcoders", name, "--prompt", "Lily saw",
                     "--dashboard-tokens", "0", "--out", f"g-{name}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (name, err)
        assert f"{file.name} is not UTF-8 text: byte" in err and "0xe9" in err, (name, err)
