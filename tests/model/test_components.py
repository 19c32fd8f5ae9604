"""Core Transformer: config validation, hooks, cache, fast/eager agreement, per-head views.

(Split out of the flat test_model module, issue 38.)"""
import math

import pytest
import torch

from circuitlab import ModelConfig, Transformer

from model.test_transformer import SMALL, ARCHS, tokens  # noqa: F401 (shared with it)

torch.manual_seed(0)


# ---------------------------------------------------------------- fast vs eager, heads
@pytest.mark.parametrize("arch", list(ARCHS))
def test_sdpa_and_eager_paths_agree(arch):
    model = Transformer(ARCHS[arch])
    t = tokens()
    fast = model(t)
    eager = model.run_with_hooks(t, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: None)])
    assert (fast - eager).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", ["gpt2", "llama", "v-only"])
def test_sum_of_head_results_equals_concat_then_project(arch):
    model = Transformer(ARCHS[arch])
    _, cache = model.run_with_cache(tokens())
    for layer in range(model.cfg.n_layers):
        per_head = cache["result", layer].sum(dim=2) + model.b_O[layer]
        torch.testing.assert_close(per_head, cache["attn_out", layer], atol=1e-5, rtol=1e-5)
        # and by hand from z and the per-head W_O view
        by_hand = torch.einsum("bphd,hdm->bpm", cache["z", layer], model.W_O[layer]) + model.b_O[layer]
        torch.testing.assert_close(by_hand, cache["attn_out", layer], atol=1e-5, rtol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = Transformer(ARCHS["llama"])
    cfg = ARCHS["llama"].replace(n_kv_heads=None)
    mha = Transformer(cfg)
    H, K, D = cfg.n_heads, ARCHS["llama"].kv_heads, cfg.head_dim
    state = gqa.state_dict()
    for layer in range(cfg.n_layers):
        w = state[f"blocks.{layer}.attn.qkv.weight"]
        q, k, v = w.split([H * D, K * D, K * D])
        rep = lambda m: m.view(K, D, -1).repeat_interleave(H // K, dim=0).reshape(H * D, -1)  # noqa: E731
        state[f"blocks.{layer}.attn.qkv.weight"] = torch.cat([q, rep(k), rep(v)])
    mha.load_state_dict(state)
    t = tokens()
    torch.testing.assert_close(gqa(t), mha(t), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gqa.W_K, mha.W_K)


def test_rope_scores_depend_only_on_relative_offset():
    model = Transformer(ARCHS["llama"])
    attn = model.blocks[0].attn
    q = torch.randn(1, 1, 4, 32)
    k = torch.randn(1, 1, 2, 32)
    def score(i, j):
        qi = attn.rotary(q, offset=i)
        kj = attn.rotary(k, offset=j)
        return (qi[0, 0, 0] * kj[0, 0, 0]).sum()
    torch.testing.assert_close(score(5, 2), score(25, 22), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(score(9, 9), score(0, 0), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(score(5, 2), score(5, 4))
    # partial rotary leaves the tail untouched
    neox = Transformer(ARCHS["neox"]).blocks[0].attn.rotary
    x = torch.randn(1, 3, 4, 32)
    torch.testing.assert_close(neox(x, offset=7)[..., 16:], x[..., 16:])


def test_rotary_table_is_shared_by_all_layers_and_scaling_changes_frequencies():
    from circuitlab.model.components import rotary_frequencies

    cfg = ModelConfig.from_preset("llama-tiny", n_layers=3)
    model = Transformer(cfg)
    tables = {id(block.attn.rotary.cos) for block in model.blocks}
    assert len(tables) == 1 and len(list(model.buffers())) == 2  # one cos and one sin for the whole model
    plain = rotary_frequencies(cfg)
    linear = rotary_frequencies(cfg.replace(rope_scaling={"type": "linear", "factor": 4.0}))
    assert torch.allclose(linear, plain / 4)
    llama3 = rotary_frequencies(cfg.replace(rope_scaling={
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}))
    wavelength = 2 * math.pi / plain
    assert torch.equal(llama3[wavelength < 16], plain[wavelength < 16])            # short: kept
    assert torch.allclose(llama3[wavelength > 64], plain[wavelength > 64] / 8)     # long: slowed by factor
    middle = (wavelength > 16) & (wavelength < 64)
    assert middle.any() and ((llama3[middle] < plain[middle]) & (llama3[middle] > plain[middle] / 8)).all()
