"""Storage dtype apart from compute dtype (model/storage.py): float32 storage is today's arithmetic bit for bit;
half-precision storage with float32 arithmetic is float32 on the rounded weights (exactly the same products)
and within the measured tolerances of docs/pretrained.md of float32 on the original weights, for the forward
pass, the cache, activation patching and an attribution graph, on three families (GPT-2, LLaMA, Gemma-2)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from circuitlab import ModelConfig
from circuitlab.analysis.patching import activation_patching
from circuitlab.analysis.patching.metrics import logit_diff
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.graphs import Transcoders, attribute
from circuitlab.model import storage
from circuitlab.pretrained.catalog import model_config_from_hf
from helpers import random_model

pytestmark = pytest.mark.usefixtures("one_thread")

GEMMA2 = {"model_type": "gemma2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 60,
          "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 8,
          "sliding_window": 4, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}


def family(name: str) -> ModelConfig:
    if name == "gemma2":
        return model_config_from_hf(GEMMA2)
    return ModelConfig.from_preset(f"{name}-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=32, d_vocab=60)


FAMILIES = ["gpt2", "llama", "gemma2"]
# Half storage with float32 arithmetic against float32 on the unrounded weights, as a share of the largest |value|
# compared: measured (docs/pretrained.md; max over the three families, seeds 0-2: the cache 1.2e-2 in bfloat16,
# 1.8e-3 in float16) with ~2x room.
TOL = {torch.bfloat16: 2.5e-2, torch.float16: 4e-3}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def pair(name: str, storage_dtype: torch.dtype, seed: int = 0):
    """(float32 model, the same model held in storage_dtype computing in float32, float32 on the rounded weights)."""
    full = random_model(family(name), seed=seed, scale=1.0).eval()
    half = copy.deepcopy(full).set_dtypes(storage_dtype)
    rounded = copy.deepcopy(half).set_dtypes(torch.float32)
    return full, half, rounded


def tokens(seed: int = 1, n: int = 12) -> torch.Tensor:
    return torch.randint(0, 60, (2, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------- float32: unchanged

def test_float32_storage_is_plain_f_linear_bit_for_bit(monkeypatch):
    """The float32 model runs exactly nn.Linear's arithmetic: swapping storage.Linear back changes no bit of the
    logits, the cache or the gradients."""
    for name in FAMILIES:
        model = random_model(family(name), scale=1.0).eval()
        assert model.storage_dtype == model.compute_dtype == torch.float32
        ids = tokens()
        logits, cache = model.run_with_cache(ids, incl_bwd=True)
        monkeypatch.setattr(storage.Linear, "forward", nn.Linear.forward)
        ref_logits, ref_cache = model.run_with_cache(ids, incl_bwd=True)
        monkeypatch.undo()
        assert torch.equal(logits, ref_logits)
        assert all(torch.equal(cache[k], ref_cache[k]) for k in ref_cache.acts)
        assert all(torch.equal(cache.grads[k], ref_cache.grads[k]) for k in ref_cache.grads)


def test_float32_set_dtypes_changes_nothing():
    model = random_model(family("llama"), scale=1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.set_dtypes("float32")
    assert model._compute_dtype is None and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---------------------------------------------------------------------------- half storage

@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_storage_forward_and_cache(name, dtype):
    full, half, rounded = pair(name, dtype)
    assert half.storage_dtype == dtype and half.compute_dtype == torch.float32
    assert half.embed.weight.dtype == dtype and half.ln_final.w.dtype == torch.float32  # vectors: compute dtype
    ids = tokens()
    logits, cache = half.run_with_cache(ids)
    ref, ref_cache = rounded.run_with_cache(ids)
    full_logits, full_cache = full.run_with_cache(ids)
    assert logits.dtype == torch.float32 and all(v.dtype == torch.float32 for v in cache.acts.values())
    # The same float32 products as the rounded weights (the upcast is exact): equal up to summation order.
    assert rel(logits, ref) < 1e-5 and max(rel(cache[k], ref_cache[k]) for k in ref_cache.acts) < 1e-5
    assert rel(logits, full_logits) < TOL[dtype]
    worst = max(rel(cache[k], full_cache[k]) for k in full_cache.acts if "hook_attn_scores" not in k)
    assert worst < TOL[dtype]
    # The weight views are in the compute dtype and hold the stored values.
    assert half.W_U.dtype == torch.float32 and torch.equal(half.W_U, rounded.W_U)
    assert torch.equal(half.W_Q, rounded.W_Q) and torch.equal(half.W_out, rounded.W_out)


@pytest.mark.parametrize("name", FAMILIES)
def test_half_storage_gradients(name):
    full, half, rounded = pair(name, torch.bfloat16)
    ids = tokens()
    _, cache = half.run_with_cache(ids, incl_bwd=True)
    _, ref = rounded.run_with_cache(ids, incl_bwd=True)
    _, ref_full = full.run_with_cache(ids, incl_bwd=True)
    assert max(rel(cache.grads[k], ref.grads[k]) for k in ref.grads) < 1e-5
    assert max(rel(cache.grads[k], ref_full.grads[k]) for k in ref_full.grads) < 5 * TOL[torch.bfloat16]
    assert all(p.grad is None for p in half.parameters())


@pytest.mark.parametrize("name", FAMILIES)
def test_half_storage_activation_patching(name):
    full, half, rounded = pair(name, torch.bfloat16)
    clean, corrupt = tokens(1, 8)[:1], tokens(2, 8)[:1]
    metric = logit_diff(3, 7)
    got = activation_patching(half, clean, corrupt, metric, "resid_pre", progress=False).values
    ref = activation_patching(rounded, clean, corrupt, metric, "resid_pre", progress=False).values
    ref_full = activation_patching(full, clean, corrupt, metric, "resid_pre", progress=False).values
    assert rel(got, ref) < 1e-5
    assert rel(got, ref_full) < TOL[torch.bfloat16]


def transcoders(model, seed: int = 0) -> list[SparseDictionary]:
    out = []
    for layer in range(model.cfg.n_layers):
        hook = f"blocks.{layer}.ln2.hook_normalized"
        cfg = DictionaryConfig("relu", d_in=32, d_sae=48, hook_name=hook, out_hook_name=f"blocks.{layer}.hook_mlp_out")
        d = SparseDictionary(cfg, seed=seed + layer)
        g = torch.Generator().manual_seed(100 + seed + layer)
        with torch.no_grad():
            d.W_enc.copy_(torch.randn(d.W_enc.shape, generator=g) / 32**0.5)
            d.b_enc.copy_(-0.8 + 0.1 * torch.randn(48, generator=g))
        out.append(d)
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_half_storage_attribution_graph(name):
    """Model and transcoders both held in bfloat16: the same active features and the adjacency within the
    tolerance of float32 on the same weights (exactly those of the rounded weights)."""
    full, half, rounded = pair(name, torch.bfloat16)
    dicts = transcoders(full)
    ids = tokens(3, 10)[0]
    g_full = attribute(full, Transcoders.per_layer(full, [copy.deepcopy(d) for d in dicts]), ids, batch_size=16)
    tc_half = Transcoders.per_layer(half, [copy.deepcopy(d).set_dtypes("bfloat16") for d in dicts])
    assert tc_half.dictionary(0).W_enc.dtype == torch.bfloat16 and tc_half.dictionary(0).compute_dtype == torch.float32
    g_half = attribute(half, tc_half, ids, batch_size=16)
    tc_round = Transcoders.per_layer(rounded, [copy.deepcopy(d).set_dtypes("bfloat16").set_dtypes("float32")
                                               for d in dicts])
    g_round = attribute(rounded, tc_round, ids, batch_size=16)
    assert torch.equal(g_half.active_features, g_round.active_features)
    assert rel(g_half.adjacency, g_round.adjacency) < 1e-5
    assert g_half.adjacency.dtype == torch.float32
    if torch.equal(g_half.active_features, g_full.active_features):  # a feature at its threshold may flip
        assert rel(g_half.adjacency, g_full.adjacency) < 5 * TOL[torch.bfloat16]


def test_dictionary_half_storage_matches_rounded_float32():
    d = transcoders(random_model(family("gpt2"), scale=1.0))[0]
    half = copy.deepcopy(d).set_dtypes("bfloat16")
    rounded = copy.deepcopy(half).set_dtypes("float32")
    x = torch.randn(5, 7, 32, generator=torch.Generator().manual_seed(0))
    (y, a), (y_ref, a_ref) = half(x), rounded(x)
    assert y.dtype == a.dtype == torch.float32 and rel(y, y_ref) < 1e-6 and rel(a, a_ref) < 1e-6
    assert half.for_inference().W_dec.dtype == torch.bfloat16  # copies keep the storage


def test_big_weights_are_upcast_a_block_at_a_time(monkeypatch):
    """Many row blocks (the tile and the chunk paths, forward and backward) give F.linear's numbers."""
    monkeypatch.setattr(storage, "_TILE_BYTES", 3 * 32 * 4)
    monkeypatch.setattr(storage, "_CHUNK_BYTES", 5 * 32 * 4)
    w = torch.randn(23, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    b = torch.randn(23)
    for rows in (4, 300):
        x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = storage.stored_linear(x, w, b)
        ref = F.linear(x, w.float(), b)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        (g,) = torch.autograd.grad(out.square().sum(), x)
        (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------------------- bad input

def test_unknown_and_impossible_dtypes_are_one_line(monkeypatch):
    model = random_model(family("gpt2"), scale=1.0)
    with pytest.raises(CircuitlabError, match="unknown storage dtype 'int8'; use one of float32, bfloat16"):
        model.set_dtypes("int8")
    with pytest.raises(CircuitlabError, match="stored in float32 computes in float32"):
        model.set_dtypes("float32", "bfloat16")
    real_linear = F.linear

    def no_half(x, w, b=None):  # a device without float16 kernels
        if x.dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return real_linear(x, w, b)

    monkeypatch.setattr(storage, "_CHECKED", {})
    monkeypatch.setattr(storage.F, "linear", no_half)
    with pytest.raises(CircuitlabError, match=r"this cpu device cannot compute in float16 \(.*not implemented") as e:
        model.set_dtypes("float16", "float16")
    assert "\n" not in str(e.value)
    assert model.storage_dtype == torch.float32  # refused before anything changed


def test_graph_command_dtypes(tmp_path, capsys):
    from circuitlab.cli import main

    out = tmp_path / "g"
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", str(out), "--dtype", "bfloat16",
                 "--dashboard-tokens", "0"]) == 0
    assert "strongest path" in capsys.readouterr().out
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", str(tmp_path / "h"), "--dtype", "float32",
                 "--compute-dtype", "bfloat16", "--dashboard-tokens", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "computes in float32" in err and "\n" not in err and not (tmp_path / "h").exists()


def test_checkpoint_in_half_precision_loads_half(tmp_path):
    from circuitlab.training import load_checkpoint, save_checkpoint

    full, half, rounded = pair("llama", torch.bfloat16)
    save_checkpoint(tmp_path / "m", half)
    loaded, _, _ = load_checkpoint(tmp_path / "m")
    assert loaded.storage_dtype == torch.bfloat16 and loaded.compute_dtype == torch.float32
    assert torch.equal(loaded(tokens()), half(tokens()))
    as_fp32, _, _ = load_checkpoint(tmp_path / "m", dtype="float32")
    assert as_fp32.storage_dtype == torch.float32 and rel(as_fp32(tokens()), rounded(tokens())) < 1e-6
    save_checkpoint(tmp_path / "f", full)
    assert load_checkpoint(tmp_path / "f")[0].storage_dtype == torch.float32  # float32 files: as before


# ---------------------------------------------------------------------------- memory-mapped dictionaries

def saved_transcoders(root, dtype: str = "bfloat16") -> tuple:
    model = random_model(family("gpt2"), scale=1.0).eval()
    dicts = [d.set_dtypes(dtype) for d in transcoders(model)]
    for layer, d in enumerate(dicts):
        d.save(root / f"layer{layer}")
    return model, dicts


def test_mapped_dictionaries_are_the_saved_ones_read_from_disk(tmp_path):
    model, dicts = saved_transcoders(tmp_path)
    tc = Transcoders.load(model, tmp_path, mmap=True)
    d = tc.dictionary(0)
    assert d._mapped is not None and d.W_enc.dtype == torch.bfloat16 and d.compute_dtype == torch.float32
    start, size = d._mapped._map.ctypes.data, d._mapped._map.size
    for p in (d.W_enc, d.W_dec):  # the matrices are the file's pages, not copies
        assert start <= p.data_ptr() and p.data_ptr() + p.nbytes <= start + size
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    (y, a), (y_ref, a_ref) = d(x), dicts[0](x)
    assert torch.equal(y, y_ref) and torch.equal(a, a_ref)
    ids = tokens(3, 10)[0]
    mapped_graph = attribute(model, tc, ids, batch_size=16)
    held_graph = attribute(model, Transcoders.per_layer(model, dicts), ids, batch_size=16)
    assert torch.equal(mapped_graph.adjacency, held_graph.adjacency)


def test_a_mapped_file_truncated_or_changed_while_open_is_one_line(tmp_path):
    model, dicts = saved_transcoders(tmp_path)
    tc = Transcoders.load(model, tmp_path, mmap=True)
    x = torch.randn(3, 32)
    file = tmp_path / "layer0" / "dictionary.safetensors"
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)
    with pytest.raises(CircuitlabError, match=r"dictionary.safetensors was truncated from \d+ to \d+ bytes while in "
                                              "use; load the dictionary again") as e:
        tc.encode(0, x)
    assert "\n" not in str(e.value)
    dicts[1].save(tmp_path / "layer1")  # rewritten in place (atomically: a new file under the same name)
    with pytest.raises(CircuitlabError, match="was changed while in use"):
        tc.decoder_vectors(1, torch.tensor([0, 1]))
    with pytest.raises(CircuitlabError, match="is truncated: its header describes"):
        Transcoders.load(model, tmp_path, mmap=True)


def test_mapping_refuses_what_it_cannot_map(tmp_path):
    model, dicts = saved_transcoders(tmp_path, "float32")
    with pytest.raises(CircuitlabError, match="held in its file's dtype, not bfloat16"):
        SparseDictionary.load(tmp_path / "layer0", mmap=True, dtype="bfloat16")
    from circuitlab.dictionaries.published import save_transcoders

    save_transcoders(dicts, tmp_path / "ct")
    with pytest.raises(CircuitlabError, match="only circuitlab's own transcoder folders can be memory-mapped"):
        Transcoders.load(model, tmp_path / "ct", mmap=True)


def test_stored_matmul_blocks_of_rows(monkeypatch):
    """x @ w with w [a, b] stored in half precision (a dictionary's W_enc, W_dec), contiguous or a transposed
    view, few or many rows, forward and backward: x @ w.float()."""
    monkeypatch.setattr(storage, "_TILE_BYTES", 3 * 40 * 4)
    monkeypatch.setattr(storage, "_CHUNK_BYTES", 5 * 40 * 4)
    w = torch.randn(32, 40, generator=torch.Generator().manual_seed(0)).bfloat16()
    for stored in (w, w.T.contiguous().T):
        for rows in (4, 300):
            x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
            out, ref = storage.stored_matmul(x, stored), x @ w.float()
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            (g,), (g_ref,) = torch.autograd.grad(out.square().sum(), x), torch.autograd.grad(ref.square().sum(), x)
            torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-5)


def test_analyses_that_read_weights_run_on_half_storage():
    """Folding works on a half-precision model (in the compute dtype, the result held as the model was); the
    weight-product analyses see the stored values in float32."""
    from circuitlab.analysis.folding import fold_layer_norm
    from circuitlab.analysis.qk_ov import ov_circuit

    _, half, rounded = pair("gpt2", torch.bfloat16)
    folded = fold_layer_norm(half)
    assert folded.storage_dtype == torch.bfloat16 and folded.compute_dtype == torch.float32
    ids = tokens()
    # the folded weights are rounded to bfloat16 again: the log-probabilities move by that rounding only
    assert rel(folded(ids).log_softmax(-1), fold_layer_norm(rounded)(ids).log_softmax(-1)) < TOL[torch.bfloat16]
    assert torch.equal(ov_circuit(half, 0).AB, ov_circuit(rounded, 0).AB)
