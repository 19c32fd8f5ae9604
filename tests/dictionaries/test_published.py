"""Published dictionary files (Gemma Scope, Gemma Scope 2, Llama Scope, circuit-tracer sets), written here in
exactly their layouts: each loads with the hooks its file names, encodes and decodes what a by-hand
computation from the file's tensors gives (float64, <= 1e-5), binds to a model (checked, gains folded),
saves back, and is refused in one line for another model."""
import json

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

import helpers
from circuitlab import ModelConfig, Transformer
from circuitlab.cli import main
from circuitlab.dictionaries import SparseDictionary, load_transcoders
from circuitlab.dictionaries.published import (
    our_hook, save_gemma_scope, save_gemma_scope_2, save_llama_scope, save_transcoders,
)
from circuitlab.dictionaries.splice import splice
from circuitlab.errors import CircuitlabError

pytestmark = pytest.mark.usefixtures("one_thread")
D, F = 16, 40  # d_model, d_sae


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=_g(seed), dtype=torch.float64) * scale


def _jumprelu(pre, thr):
    return pre * (pre > thr)


def _x(n=64, d=D, seed=99):
    return _rand(n, d, seed=seed)


def _close(ours, want, tol=1e-5):
    assert ours.shape == want.shape
    assert (ours.double() - want).abs().max().item() <= tol * max(1.0, want.abs().max().item())


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.from_preset("gpt2-tiny", d_model=D, n_heads=2, n_layers=2, d_vocab=50, n_ctx=16)
    torch.manual_seed(0)
    m = Transformer(cfg).eval()
    with torch.no_grad():  # a gain and bias that are not the identity, so folding them matters
        for b in m.blocks:
            b.ln2.w.copy_(1 + 0.5 * torch.randn(D))
            b.ln2.b.copy_(0.3 * torch.randn(D))
    return m


# ---------------------------------------------------------------------------- Gemma Scope

def _gemma_scope_file(root, site="res", layer=1, d_in=D, seed=0):
    folder = root / "models--google--gemma-scope-2b-pt-res".replace("res", site) / "snapshots" / "abc" / f"layer_{layer}" / "width_16k" / "average_l0_7"
    folder.mkdir(parents=True)
    t = {"W_enc": _rand(d_in, F, seed=seed, scale=0.3), "W_dec": _rand(F, d_in, seed=seed + 1, scale=0.3),
         "b_enc": _rand(F, seed=seed + 2, scale=0.1), "b_dec": _rand(d_in, seed=seed + 3, scale=0.1),
         "threshold": _rand(F, seed=seed + 4).abs() * 0.5}
    np.savez(folder / "params.npz", **{k: v.float().numpy() for k, v in t.items()})
    return folder, {k: torch.from_numpy(v.float().numpy()).double() for k, v in t.items()}


def test_gemma_scope_loads_with_its_hook_and_computes_the_files_jumprelu(tmp_path):
    folder, t = _gemma_scope_file(tmp_path)
    for path in (folder, folder / "params.npz"):
        sae = SparseDictionary.load(path)
        c = sae.cfg
        assert (c.architecture, c.hook_name, c.out_hook_name, c.apply_b_dec_to_input) == ("jumprelu", "blocks.1.hook_resid_post", None, False)
        assert c.base_model == {"name": "google/gemma-2-2b", "d_model": 2304}
        x = _x()
        acts = _jumprelu(x @ t["W_enc"] + t["b_enc"], t["threshold"])  # no b_dec on the input
        assert 0.1 < (acts > 0).double().mean() < 0.9
        _close(sae.encode(x.float()), acts)
        _close(sae.decode(acts.float()), acts @ t["W_dec"] + t["b_dec"])
    # saved back: the same arrays, bit for bit
    save_gemma_scope(sae, tmp_path / "back" / "gemma-scope-2b-pt-res" / "layer_1" / "w")
    with np.load(tmp_path / "back" / "gemma-scope-2b-pt-res" / "layer_1" / "w" / "params.npz") as z, \
            np.load(folder / "params.npz") as orig:
        assert sorted(z.files) == sorted(orig.files)
        assert all(np.array_equal(z[k], orig[k]) for k in z.files)


def test_gemma_scope_transcoders_and_attention_sites(tmp_path):
    sae = SparseDictionary.load(_gemma_scope_file(tmp_path, site="transcoders", layer=3)[0])
    assert (sae.cfg.hook_name, sae.cfg.out_hook_name) == ("blocks.3.ln2.hook_normalized", "blocks.3.hook_mlp_out")
    assert not sae.cfg.apply_b_dec_to_input
    sae = SparseDictionary.load(_gemma_scope_file(tmp_path, site="att", layer=0, d_in=8)[0])
    assert (sae.cfg.hook_name, sae.cfg.d_in) == ("blocks.0.attn.hook_z", 8)


def test_gemma_scope_for_another_model_is_refused_in_one_line(tmp_path, model, capsys):
    folder, _ = _gemma_scope_file(tmp_path)
    with pytest.raises(CircuitlabError, match="made for google/gemma-2-2b, not for this model") as e:
        SparseDictionary.load(folder, model=model)
    assert "\n" not in str(e.value)
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "params.npz").write_bytes((folder / "params.npz").read_bytes())
    with pytest.raises(CircuitlabError, match="names no hook"):
        SparseDictionary.load(loose)


# ---------------------------------------------------------------------------- Gemma Scope 2

def _gemma_scope_2(root, transcoder=True, name="tiny", layer=0, seed=10):
    folder = root / ("transcoder" if transcoder else "resid_post") / f"layer_{layer}_width_16k_l0_small"
    folder.mkdir(parents=True)
    t = {"w_enc": _rand(D, F, seed=seed, scale=0.3), "w_dec": _rand(F, D, seed=seed + 1, scale=0.3),
         "b_enc": _rand(F, seed=seed + 2, scale=0.1), "b_dec": _rand(D, seed=seed + 3, scale=0.1),
         "threshold": _rand(F, seed=seed + 4).abs() * 0.5}
    if transcoder:
        t["affine_skip_connection"] = _rand(D, D, seed=seed + 5, scale=0.2)
    save_file({k: v.float().contiguous() for k, v in t.items()}, str(folder / "params.safetensors"))
    hf_out = f"model.layers.{layer}.post_feedforward_layernorm.output"
    hf_in = f"model.layers.{layer}.pre_feedforward_layernorm.output" if transcoder else f"model.layers.{layer}.output"
    (folder / "config.json").write_text(json.dumps({
        "architecture": "jump_relu", "model_name": name, "hf_hook_point_in": hf_in,
        "hf_hook_point_out": hf_out if transcoder else hf_in, "affine_connection": transcoder}))
    return folder, {k: v.float().double() for k, v in t.items()}


def _gs2_by_hand(t, x):
    acts = _jumprelu(x @ t["w_enc"] + t["b_enc"], t["threshold"])
    return acts, acts @ t["w_dec"] + t["b_dec"] + x @ t["affine_skip_connection"]


def test_gemma_scope_2_transcoder_with_affine_skip(tmp_path):
    folder, t = _gemma_scope_2(tmp_path)
    sae = SparseDictionary.load(folder)
    c = sae.cfg
    assert (c.hook_name, c.out_hook_name, c.skip, c.base_model["name"]) == (
        "blocks.0.mlp.hook_in", "blocks.0.hook_mlp_out", True, "google/tiny")
    x = _x()
    acts, out = _gs2_by_hand(t, x)
    _close(sae.encode(x.float()), acts)
    _close(sae.decode(acts.float(), x.float()), out)
    save_gemma_scope_2(sae, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == json.loads((folder / "config.json").read_text()) | {"model_name": "google/tiny"}
    back, orig = load_file(str(tmp_path / "back" / "params.safetensors")), load_file(str(folder / "params.safetensors"))
    assert back.keys() == orig.keys() and all(torch.equal(back[k], orig[k]) for k in orig)


def test_binding_folds_ln2s_gain_and_bias_so_the_hook_of_ours_gives_the_files_computation(tmp_path, model):
    """The file reads the MLP input after ln2 (x̂·w + b); bound, the transcoder reads ln2.hook_normalized (x̂)."""
    folder, t = _gemma_scope_2(tmp_path, name=model.cfg.name, layer=1)
    with pytest.raises(CircuitlabError, match="load it with the model"):  # unbound: not a hook of ours
        with splice(model, SparseDictionary.load(folder)):
            pass
    sae = SparseDictionary.load(folder, model=model)
    assert (sae.cfg.hook_name, sae.cfg.out_hook_name) == ("blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out")
    tokens = torch.randint(0, 50, (2, 8), generator=_g(1))
    _, cache = model.run_with_cache(tokens)
    xhat = cache["blocks.1.ln2.hook_normalized"].double().reshape(-1, D)
    ln2 = model.blocks[1].ln2
    mlp_in = xhat * ln2.w.double() + ln2.b.double()
    acts, out = _gs2_by_hand(t, mlp_in)
    assert 0.05 < (acts > 0).double().mean() < 0.95
    _close(sae.encode(xhat.float()), acts)
    _close(sae.decode(acts.float(), xhat.float()), out)
    with splice(model, sae):  # spliced with its error term, the model is unchanged
        assert torch.equal(model(tokens), model.run_with_hooks(tokens))


# ---------------------------------------------------------------------------- Llama Scope

def _llama_scope(root, thr=0.7, norm_in=3.0, seed=20):
    folder = root / "Llama3_1-8B-Base-L1R-8x"
    (folder / "checkpoints").mkdir(parents=True)
    t = {"encoder.weight": _rand(F, D, seed=seed, scale=0.3), "encoder.bias": _rand(F, seed=seed + 1, scale=0.1),
         "decoder.weight": _rand(D, F, seed=seed + 2, scale=0.3), "decoder.bias": _rand(D, seed=seed + 3, scale=0.1)}
    save_file({k: v.float().contiguous() for k, v in t.items()}, str(folder / "checkpoints" / "final.safetensors"))
    (folder / "hyperparams.json").write_text(json.dumps({
        "d_model": D, "d_sae": F, "hook_point_in": "blocks.1.hook_resid_post", "hook_point_out": "blocks.1.hook_resid_post",
        "act_fn": "jumprelu", "jump_relu_threshold": thr, "norm_activation": "dataset-wise",
        "dataset_average_activation_norm": {"in": norm_in, "out": norm_in}, "top_k": 50}))
    return folder, {k: v.float().double() for k, v in t.items()}


def test_llama_scope_reads_as_saelens_reads_it_with_one_threshold(tmp_path):
    folder, t = _llama_scope(tmp_path)
    sae = SparseDictionary.load(folder)
    assert (sae.cfg.hook_name, sae.cfg.base_model) == ("blocks.1.hook_resid_post", {"name": "meta-llama/Llama-3.1-8B", "d_model": D})
    s = D**0.5 / 3.0  # trained on x·s; SAELens folds s into the weights and the threshold
    x = _x()
    pre = (x * s) @ t["encoder.weight"].T + t["encoder.bias"]
    acts = _jumprelu(pre, 0.7 * s)
    assert 0.05 < (acts > 0).double().mean() < 0.95
    _close(sae.encode(x.float()), acts)
    _close(sae.decode(acts.float()), (acts @ t["decoder.weight"].T + t["decoder.bias"]) / s)
    save_llama_scope(sae, tmp_path / "back")
    again = SparseDictionary.load(tmp_path / "back")
    _close(again.encode(x.float()), acts)
    _close(again.decode(acts.float()), (acts @ t["decoder.weight"].T + t["decoder.bias"]) / s)


def test_llama_scope_matches_saelens_own_loader(tmp_path, monkeypatch):
    """The peer: sae-lens's llama_scope loader on the same files (its hub download pointed at them)."""
    from sae_lens.loading import pretrained_sae_loaders as L

    folder, _ = _llama_scope(tmp_path)
    monkeypatch.setattr(L, "hf_hub_download", lambda repo_id, filename, subfolder=None, **kw:
                        str(tmp_path / (f"{subfolder}/{filename}" if subfolder else filename)))
    cfg, state, _ = L.llama_scope_sae_huggingface_loader("fnlp/x", folder.name, device="cpu", cfg_overrides={"dtype": "float32"})
    state = {k: v.double() for k, v in state.items()}
    sae = SparseDictionary.load(folder)
    x = _x()
    s = D**0.5 / 3.0  # the norm folded into the weights as SAELens folds it (sae.fold_activation_norm_scaling_factor)
    acts = _jumprelu(x @ (state["W_enc"] * s) + state["b_enc"], state["threshold"])
    _close(sae.encode(x.float()), acts)
    _close(sae.decode(acts.float()), acts @ (state["W_dec"] / s) + state["b_dec"] / s)


def test_llama_scope_needs_one_threshold_to_save(tmp_path):
    folder, _ = _llama_scope(tmp_path)
    sae = SparseDictionary.load(folder)
    with torch.no_grad():
        sae.threshold[0] += 1
    with pytest.raises(CircuitlabError, match="one JumpReLU threshold"):
        save_llama_scope(sae, tmp_path / "no")


# ---------------------------------------------------------------------------- circuit-tracer sets

def _ct_set(root, n_layers=2, name="gpt2-tiny", hook_in="ln2.hook_normalized", activation=None, skip=True, seed=30):
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n_layers):
        t = {"W_enc": _rand(F, D, seed=seed + 10 * i, scale=0.3), "W_dec": _rand(F, D, seed=seed + 10 * i + 1, scale=0.3),
             "b_enc": _rand(F, seed=seed + 10 * i + 2, scale=0.1), "b_dec": _rand(D, seed=seed + 10 * i + 3, scale=0.1)}
        if activation is None:
            t["activation_function.threshold"] = _rand(F, seed=seed + 10 * i + 4).abs() * 0.5
        if skip:
            t["W_skip"] = _rand(D, D, seed=seed + 10 * i + 5, scale=0.2)
        save_file({k: v.float().contiguous() for k, v in t.items()}, str(root / f"layer_{i}.safetensors"))
        files.append({k: v.float().double() for k, v in t.items()})
    cfg = {"model_name": name, "model_kind": "transcoder_set", "feature_input_hook": hook_in,
           "feature_output_hook": "hook_mlp_out", "scan": name}
    if activation:
        cfg.update(activation=activation, **({"k": 5} if activation == "topk" else {}))
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    return files


def _ct_by_hand(t, x, activation=None):
    pre = x @ t["W_enc"].T + t["b_enc"]
    if activation is None:
        acts = _jumprelu(pre, t["activation_function.threshold"])
    elif activation == "relu":
        acts = pre.relu()
    else:
        top = pre.topk(5, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    out = acts @ t["W_dec"] + t["b_dec"] + (x @ t["W_skip"].T if "W_skip" in t else 0)
    return acts, out


@pytest.mark.parametrize("activation", [None, "relu", "topk"])
def test_circuit_tracer_set_loads_one_transcoder_per_layer(tmp_path, activation):
    files = _ct_set(tmp_path / "set", activation=activation, skip=activation != "relu")
    tcs = load_transcoders(tmp_path / "set")
    assert [(c.cfg.hook_name, c.cfg.out_hook_name) for c in tcs] == [
        (f"blocks.{i}.ln2.hook_normalized", f"blocks.{i}.hook_mlp_out") for i in range(2)]
    assert {c.cfg.architecture for c in tcs} == {activation or "jumprelu"}
    x = _x()
    for tc, t in zip(tcs, files):
        acts, out = _ct_by_hand(t, x, activation)
        _close(tc.encode(x.float()), acts)
        _close(tc.decode(acts.float(), x.float()), out)
    one = SparseDictionary.load(tmp_path / "set" / "layer_1.safetensors")
    assert one.cfg.hook_name == "blocks.1.ln2.hook_normalized"
    save_transcoders(tcs, tmp_path / "back")
    assert yaml.safe_load((tmp_path / "back" / "config.yaml").read_text()) == yaml.safe_load((tmp_path / "set" / "config.yaml").read_text())
    for i in range(2):
        back, orig = load_file(str(tmp_path / "back" / f"layer_{i}.safetensors")), load_file(str(tmp_path / "set" / f"layer_{i}.safetensors"))
        orig.pop("k", None), back.pop("k", None)
        assert back.keys() == orig.keys() and all(torch.equal(back[k], orig[k]) for k in orig)


def test_circuit_tracer_set_bound_to_the_model_splices_exactly(tmp_path, model):
    files = _ct_set(tmp_path / "set", hook_in="mlp.hook_in")
    tcs = load_transcoders(tmp_path / "set", model=model)
    assert [tc.cfg.hook_name for tc in tcs] == ["blocks.0.ln2.hook_normalized", "blocks.1.ln2.hook_normalized"]
    tokens = torch.randint(0, 50, (2, 8), generator=_g(2))
    _, cache = model.run_with_cache(tokens)
    for i, (tc, t) in enumerate(zip(tcs, files)):
        xhat = cache[f"blocks.{i}.ln2.hook_normalized"].double().reshape(-1, D)
        mlp_in = xhat * model.blocks[i].ln2.w.double() + model.blocks[i].ln2.b.double()
        acts, out = _ct_by_hand(t, mlp_in)
        _close(tc.encode(xhat.float()), acts)
        _close(tc.decode(acts.float(), xhat.float()), out)
    with splice(model, tcs):
        assert torch.equal(model(tokens), model.run_with_hooks(tokens))


def test_our_hook_names_the_published_points():
    assert our_hook("model.layers.4.output") == "blocks.4.hook_resid_post"
    assert our_hook("model.layers.4.self_attn.o_proj.input") == "blocks.4.attn.hook_z"
    assert our_hook("model.layers.4.post_feedforward_layernorm.output") == "blocks.4.hook_mlp_out"
    assert our_hook("hook_resid_mid", 2) == "blocks.2.hook_resid_mid"
    assert our_hook("blocks.2.hook_mlp_in") == "blocks.2.hook_resid_mid"  # TransformerLens's: before ln2
    with pytest.raises(CircuitlabError, match="no circuitlab hook"):
        our_hook("model.layers.1.input_layernorm.output")


def test_bad_sets_are_refused_in_one_line(tmp_path, model):
    _ct_set(tmp_path / "three", n_layers=3)
    with pytest.raises(CircuitlabError, match="3 layers but the model has 2"):
        load_transcoders(tmp_path / "three", model=model)
    _ct_set(tmp_path / "typo", hook_in="ln2.hook_normalised")
    with pytest.raises(CircuitlabError, match="closest: blocks.0.ln2.hook_normalized"):
        load_transcoders(tmp_path / "typo", model=model)
    _ct_set(tmp_path / "other", name="google/gemma-2-2b")
    with pytest.raises(CircuitlabError, match="made for google/gemma-2-2b"):
        load_transcoders(tmp_path / "other", model=model)
    with pytest.raises(CircuitlabError, match="load_transcoders"):
        SparseDictionary.load(tmp_path / "other")
    (tmp_path / "three" / "layer_1.safetensors").unlink()
    with pytest.raises(CircuitlabError, match="without gaps"):
        load_transcoders(tmp_path / "three")


def test_sae_eval_reads_a_published_layer_file(tmp_path, capsys):
    helpers.save_char_checkpoint(tmp_path / "model", n_layers=2, d_model=D)
    _ct_set(tmp_path / "set", hook_in="mlp.hook_in")
    args = ["sae", "eval", "--dictionary", str(tmp_path / "set" / "layer_1.safetensors"), "--checkpoint",
            str(tmp_path / "model"), "--batches", "2", "--seq-len", "8"]
    assert main(args) == 0
    assert "blocks.1.ln2.hook_normalized" in capsys.readouterr().out
    _gemma_scope_file(tmp_path)
    args[3] = str(next(tmp_path.glob("models--google--gemma-scope-2b-pt-res/**/params.npz")))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "google/gemma-2-2b" in err and "\n" not in err
