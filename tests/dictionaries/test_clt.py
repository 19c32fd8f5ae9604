"""Cross-layer transcoders: the sparse training step against the dense one (float64), the splice's exact
logits, the field's folder layouts bit for bit, and bad input refused in one line.

(Its tests of other modules moved with issue 38: tests/commands/test_sae_clt.py,
tests/dictionaries/test_clt_train.py, tests/dictionaries/test_splice_clt.py.)"""
import json
from unittest import mock

import pytest
import torch

from circuitlab.dictionaries import clt_train
from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
from circuitlab.dictionaries.clt_train import CLTCoefficients, clt_training_step
from circuitlab.dictionaries.resample import resample_dead
from circuitlab.dictionaries.sparse_ops import DecodeKept
from circuitlab.errors import CircuitlabError, ConfigError

L, D, N = 3, 10, 24


def _clt(arch: str, tied: bool = False, skip: bool = False, dtype: str = "float64", seed: int = 1) -> CrossLayerTranscoder:
    cfg = CLTConfig(arch, n_layers=L, d_model=D, d_sae=N, k=3 if arch in ("topk", "batchtopk") else None,
                    tied=tied, skip=skip, dtype=dtype)
    clt = CrossLayerTranscoder(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # away from the initialisation: biases, skips, thresholds near the data
        for p in list(clt.b_enc) + list(clt.b_dec):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 - (0.3 if p.shape[0] == N else 0))
        for p in getattr(clt, "W_skip", []):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
        for p in getattr(clt, "threshold", []):
            p.fill_(0.4)
    return clt


def _step(clt, xs, ys, dead, sparse):
    saved = {k: v.clone() for k, v in clt.state_dict().items()}
    clt.zero_grad(set_to_none=True)
    coef = CLTCoefficients(sparsity=0.3, aux=0.5, bandwidth=0.2, threshold_decay=0.5, tanh_scale=2.0, preact=0.1)
    out = clt_training_step(clt, xs, ys, coef, dead, sparse=sparse)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in clt.named_parameters() if p.grad is not None}
    clt.load_state_dict(saved)
    return out, grads


def _data(seed=3, rows=40):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, L, D, generator=g, dtype=torch.float64), torch.randn(rows, L, D, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("tied,skip", [(False, False), (True, True)], ids=["untied", "tied-skip"])
@pytest.mark.parametrize("arch", ["topk", "batchtopk", "jumprelu", "relu"])
def test_sparse_step_is_the_dense_step(arch, tied, skip):
    clt = _clt(arch, tied, skip)
    xs, ys = _data()
    dead = torch.zeros(L * N, dtype=torch.bool)
    dead[::5] = True  # AuxK for the TopK family
    dense, dense_grads = _step(clt, xs, ys, dead, sparse=False)
    sparse, sparse_grads = _step(clt, xs, ys, dead, sparse=True)
    assert 0 < sparse.l0 < N and (arch not in ("topk", "batchtopk") or float(sparse.aux) > 0)
    assert arch in ("topk", "batchtopk") or float(sparse.sparsity) > 0
    torch.testing.assert_close(sparse.loss, dense.loss, rtol=0, atol=1e-10)
    assert torch.equal(sparse.fires, dense.fires)
    assert sparse_grads.keys() == dense_grads.keys() and {"W_enc.0", "W_dec.2", "b_dec.1"} <= set(sparse_grads)
    assert (arch == "jumprelu") == ("threshold.0" in sparse_grads)
    for name in dense_grads:
        torch.testing.assert_close(sparse_grads[name], dense_grads[name], rtol=0, atol=1e-9, msg=name)


def test_a_wrong_sparse_decoder_gradient_is_caught():
    """The comparison above can fail: a sparse decoder gradient that drops one kept pair differs from the dense one."""
    clt = _clt("topk")
    xs, ys = _data()
    _, dense_grads = _step(clt, xs, ys, None, sparse=False)
    real = DecodeKept.backward

    def dropping_one(ctx, grad):
        d_values, d_W, _ = real(ctx, grad)
        d_values = d_values.clone()
        d_values[0] = 0.0
        return d_values, d_W, None

    with mock.patch.object(DecodeKept, "backward", staticmethod(dropping_one)):
        _, sparse_grads = _step(clt, xs, ys, None, sparse=True)
    assert max(float((sparse_grads[n] - dense_grads[n]).abs().max()) for n in dense_grads) > 1e-6


# ---------------------------------------------------------------------------- formats

@pytest.mark.parametrize("layout,arch,tied,skip", [
    ("circuitlab", "topk", False, True), ("circuitlab", "batchtopk", True, False),
    ("circuit-tracer", "jumprelu", False, True), ("circuit-tracer", "relu", True, False),
    ("sparsify", "topk", False, True), ("sparsify", "topk", True, False)])
def test_round_trip_is_bitwise(tmp_path, layout, arch, tied, skip):
    clt = _clt(arch, tied, skip, dtype="float32").for_inference()
    clt.cfg.base_model = {"name": "m", "config_sha": "abc", "weights_sha": "def", "d_model": D, "n_layers": L}
    clt.save(tmp_path / "c", layout=layout)
    back = CrossLayerTranscoder.load(tmp_path / "c")
    assert back.cfg == clt.cfg
    a, b = clt.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_circuit_tracer_files_have_its_layout(tmp_path):
    clt = _clt("jumprelu", skip=True, dtype="float32")
    clt.save(tmp_path / "ct", layout="circuit-tracer")
    from safetensors.torch import load_file
    import yaml
    for i in range(L):
        enc = load_file(str(tmp_path / "ct" / f"W_enc_{i}.safetensors"))
        assert {k: tuple(v.shape) for k, v in enc.items()} == {f"W_enc_{i}": (N, D), f"b_enc_{i}": (N,), f"b_dec_{i}": (D,),
                                                               f"threshold_{i}": (N,), f"W_skip_{i}": (D, D)}
        assert torch.equal(enc[f"W_enc_{i}"], clt.W_enc[i].detach().T)
        assert torch.equal(enc[f"W_skip_{i}"], clt.W_skip[i].detach())  # no transpose
        dec = load_file(str(tmp_path / "ct" / f"W_dec_{i}.safetensors"))
        assert tuple(dec[f"W_dec_{i}"].shape) == (N, L - i, D)
    meta = yaml.safe_load((tmp_path / "ct" / "config.yaml").read_text())
    assert meta["model_kind"] == "cross_layer_transcoder" and meta["feature_output_hook"] == "hook_mlp_out"
    # a foreign folder (no circuitlab key) loads from its tensors alone, and decodes the same
    meta.pop("circuitlab")
    (tmp_path / "ct" / "config.yaml").write_text(yaml.safe_dump(meta))
    back = CrossLayerTranscoder.load(tmp_path / "ct")
    xs = _data()[0].float()
    torch.testing.assert_close(back(xs)[0], clt(xs)[0], rtol=0, atol=0)


def test_sparsify_sums_biases_and_fills_a_short_reach(tmp_path):
    clt = _clt("topk", dtype="float32")
    clt.save(tmp_path / "sp", layout="sparsify")
    assert sorted(p.name for p in (tmp_path / "sp").iterdir()) == [f"blocks.{i}.mlp" for i in range(L)]
    from safetensors.torch import load_file, save_file
    f = tmp_path / "sp" / "blocks.0.mlp"
    t = load_file(str(f / "sae.safetensors"))
    meta = json.loads((f / "cfg.json").read_text())
    assert meta["n_targets"] == L and tuple(t["W_decs.1"].shape) == (N, D) and tuple(t["encoder.weight"].shape) == (N, D)
    # a foreign sparsify CLT: layer 0 writes only 2 layers ahead, with a bias into layer 1
    for sub in (tmp_path / "sp").iterdir():
        m = json.loads((sub / "cfg.json").read_text())
        m.pop("circuitlab")
        (sub / "cfg.json").write_text(json.dumps(m))
    extra = torch.full((D,), 0.25)
    t["b_decs.1"] = extra
    del t["W_decs.2"], t["b_decs.2"], t["post_encs.2"]
    meta.pop("circuitlab")
    meta["n_targets"] = 2
    save_file(t, str(f / "sae.safetensors"))
    (f / "cfg.json").write_text(json.dumps(meta))
    back = CrossLayerTranscoder.load(tmp_path / "sp")
    assert torch.equal(back.decoder(0, 2), torch.zeros(N, D))
    torch.testing.assert_close(back.b_dec[1], clt.b_dec[1].detach() + extra)


def test_layouts_refuse_what_they_cannot_hold(tmp_path):
    with pytest.raises(CircuitlabError, match="circuit-tracer's CLTs are ReLU or JumpReLU"):
        _clt("topk", dtype="float32").save(tmp_path / "x", layout="circuit-tracer")
    with pytest.raises(CircuitlabError, match="sparsify's CLTs are TopK"):
        _clt("jumprelu", dtype="float32").save(tmp_path / "x", layout="sparsify")
    assert not (tmp_path / "x").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(CircuitlabError, match="holds no CLT"):
        CrossLayerTranscoder.load(tmp_path / "empty")


def test_a_bad_decoder_shape_is_refused_in_one_line(tmp_path):
    clt = _clt("jumprelu", dtype="float32")
    clt.save(tmp_path / "ct", layout="circuit-tracer")
    from safetensors.torch import save_file
    save_file({"W_dec_1": torch.zeros(N, L, D)}, str(tmp_path / "ct" / "W_dec_1.safetensors"))
    with pytest.raises(CircuitlabError, match=r"W_dec_1 has shape \(24, 3, 10\), expected \(24, 2, 10\)") as e:
        CrossLayerTranscoder.load(tmp_path / "ct")
    assert "\n" not in str(e.value)


def test_config_refuses_k_above_d_sae():
    with pytest.raises(ConfigError, match="k=30 is larger than d_sae=24"):
        CLTConfig("topk", n_layers=2, d_model=4, d_sae=24, k=30)


# ---------------------------------------------------------------------------- spliced into a model

@pytest.fixture(scope="module")
def model():
    from circuitlab import ModelConfig
    from helpers import random_model

    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=L, d_model=D * 2, n_heads=4, d_mlp=48, n_ctx=16, d_vocab=50)
    return random_model(cfg, scale=1.0).eval()


def _model_clt(model, arch="jumprelu", skip=True, dtype="float32"):
    from circuitlab.dictionaries import base_model_id

    cfg = CLTConfig(arch, n_layers=L, d_model=model.cfg.d_model, d_sae=N, k=3 if arch == "topk" else None, skip=skip,
                    dtype=dtype, base_model=base_model_id(model, "tiny"))
    clt = CrossLayerTranscoder(cfg, seed=4)
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        for p in list(clt.b_enc) + list(clt.b_dec) + list(getattr(clt, "W_skip", [])):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for p in getattr(clt, "threshold", []):
            p.fill_(0.2)
    return clt


def test_a_clt_for_another_model_is_refused(model):
    from circuitlab.dictionaries.splice import splice

    clt = _model_clt(model)
    other = CrossLayerTranscoder(clt.cfg.replace(n_layers=2))
    with pytest.raises(CircuitlabError, match="has 2 layers but the model has 3"):
        with splice(model, other):
            pass
    narrow = CrossLayerTranscoder(clt.cfg.replace(d_model=D))
    with pytest.raises(CircuitlabError, match="reads width 10 but the model's d_model is 20"):
        with splice(model, narrow):
            pass
    foreign = CrossLayerTranscoder(clt.cfg.replace(base_model={**clt.cfg.base_model, "weights_sha": "0" * 16}))
    with pytest.raises(CircuitlabError, match="was trained on tiny"):
        with splice(model, foreign):
            pass


# ---------------------------------------------------------------------------- the command


@pytest.mark.parametrize("layout,arch", [("circuit-tracer", "jumprelu"), ("sparsify", "topk"), ("circuitlab", "topk")])
def test_load_transcoders_returns_a_clt(tmp_path, model, layout, arch):
    from circuitlab.dictionaries import load_transcoders

    clt = _model_clt(model, arch=arch)
    clt.save(tmp_path / "c", layout=layout)
    got = load_transcoders(tmp_path / "c", model=model)
    assert isinstance(got, CrossLayerTranscoder) and torch.equal(got.W_dec[1], clt.W_dec[1].detach())
    other = CrossLayerTranscoder(clt.cfg.replace(n_layers=2, base_model={}))
    other.save(tmp_path / "two", layout=layout)
    with pytest.raises(CircuitlabError, match="has 2 layers but the model has 3"):
        load_transcoders(tmp_path / "two", model=model)


def test_a_damaged_clt_folder_is_one_line(tmp_path):
    """Our CLT layout shares the dictionaries' reader: truncated weights, a config.json from another save, a
    config that is not a CLT's, a missing file: each one line naming the folder."""
    folder = _clt("jumprelu").save(tmp_path / "clt")
    weights = folder / "clt.safetensors"
    data, text = weights.read_bytes(), (folder / "config.json").read_text()
    cfg = json.loads(text)
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CircuitlabError, match=f"CLT {folder} is corrupt or truncated"):
        CrossLayerTranscoder.load(folder)
    weights.write_bytes(data)
    (folder / "config.json").write_text(json.dumps({**cfg, "d_sae": 2 * cfg["d_sae"]}))
    with pytest.raises(CircuitlabError, match="config.json does not match clt.safetensors"):
        CrossLayerTranscoder.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "format": "something-else"}))
    with pytest.raises(CircuitlabError, match="has a bad config: its config.json is not a CLT's"):
        CrossLayerTranscoder.load(folder)
    (folder / "config.json").write_text(text)                       # the saved one again: loads
    assert all(torch.equal(a, b) for a, b in zip(CrossLayerTranscoder.load(folder).state_dict().values(),
                                                 _clt("jumprelu").for_inference().state_dict().values()))
