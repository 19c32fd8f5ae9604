"""Core Transformer: config validation, hooks, cache, fast/eager agreement, per-head views."""
import json
import math
import re

import pytest
import torch

from circuitlab import CircuitlabError, ConfigError, ModelConfig, Transformer, presets
from circuitlab.model.hooks import HookError

torch.manual_seed(0)

SMALL = dict(d_vocab=50, n_ctx=32)
ARCHS = {
    "attn-only": ModelConfig.from_preset("attn-only-2l", **SMALL),
    "gpt2": ModelConfig.from_preset("gpt2-tiny", **SMALL),
    "llama": ModelConfig.from_preset("llama-tiny", **SMALL),
    "neox": ModelConfig.from_preset("gpt2-tiny", positional="rotary", rotary_dim=16, parallel_attn_mlp=True,
                                     tied_embeddings=False, **SMALL),
    "v-only": ModelConfig(n_layers=2, d_model=8, n_heads=2, d_head=8, use_attn_out=False, attn_only=True,
                          norm="none", scale_scores=False, **SMALL),
}


def tokens(batch=3, pos=12, vocab=50):
    return torch.randint(0, vocab, (batch, pos))


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("bad, field", [
    (dict(d_model=100, n_heads=3), "d_model"),
    (dict(n_heads=4, n_kv_heads=3), "n_heads"),
    (dict(d_model=0), "d_model"),
    (dict(n_ctx=-1), "n_ctx"),
    (dict(norm="batchnorm"), "norm"),
    (dict(d_model="128"), "d_model"),
    (dict(use_attn_out=False), "use_attn_out"),
])
def test_invalid_config_names_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**bad)


def test_unknown_field_suggests_closest():
    with pytest.raises(ConfigError, match="n_layer.*did you mean 'n_layers'"):
        ModelConfig.from_dict({"n_layer": 2})


@pytest.mark.parametrize("name", list(presets()))
def test_presets_roundtrip_json_and_yaml(name, tmp_path):
    cfg = ModelConfig.from_preset(name)
    assert ModelConfig.from_dict(json.loads(cfg.to_json())) == cfg
    cfg.save(tmp_path / "c.yaml")
    assert ModelConfig.load(tmp_path / "c.yaml") == cfg


def test_quick_preset_size():
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_preset("quick"))
    assert 4.3e6 < model.num_params(include_embeddings=False) < 4.5e6
    assert model.num_params(include_embeddings=True) > model.num_params(include_embeddings=False)


# ---------------------------------------------------------------- hooks
@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_hook_fires_once_with_documented_shape(arch):
    cfg = ARCHS[arch]
    model = Transformer(cfg)
    B, T = 2, 7
    counts = {}

    def count(x, hook):
        counts[hook.name] = counts.get(hook.name, 0) + 1

    model.run_with_hooks(tokens(B, T), fwd_hooks=[(lambda n: True, count)])
    assert counts == {name: 1 for name in model.hook_names()}
    _, cache = model.run_with_cache(tokens(B, T))
    H, K, D, M = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_model
    expected = {"hook_q": (B, T, H, D), "hook_k": (B, T, K, D), "hook_v": (B, T, K, D), "hook_z": (B, T, H, D),
                "hook_pattern": (B, H, T, T), "hook_attn_scores": (B, H, T, T), "hook_result": (B, T, H, M),
                "hook_resid_pre": (B, T, M), "hook_resid_post": (B, T, M), "hook_attn_out": (B, T, M),
                "hook_embed": (B, T, M), "hook_scale": (B, T, 1), "hook_post": (B, T, cfg.mlp_dim)}
    for name, act in cache.items():
        short = name.split(".")[-1]
        if short in expected:
            assert tuple(act.shape) == expected[short], name
    assert cache["pattern", 0].shape == (B, H, T, T)
    torch.testing.assert_close(cache["pattern", 0].sum(-1), torch.ones(B, H, T))


def test_hook_replacement_changes_output():
    model = Transformer(ARCHS["gpt2"])
    t = tokens()
    clean = model(t)
    patched = model.run_with_hooks(t, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x * 0)])
    assert not torch.allclose(clean, patched)
    # zeroing one head's pattern changes the output too, and only via that hook
    def kill_head(p, hook):
        p = p.clone()
        p[:, 1] = 0
        return p
    patched = model.run_with_hooks(t, fwd_hooks=[("blocks.1.attn.hook_pattern", kill_head)])
    assert not torch.allclose(clean, patched)
    torch.testing.assert_close(model(t), clean)


def test_hooks_removed_after_exception():
    model = Transformer(ARCHS["llama"])
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[(lambda n: True, lambda x, hook: None)],
                         bwd_hooks=[("hook_embed", lambda g, hook: None)]):
            points = model.hook_points().values()
            assert all(len(hp.fwd_fns) == 1 for hp in points)  # every hook point got the forward hook
            assert model.hook_points()["hook_embed"].bwd_fns and all(hp.active for hp in points)
            raise RuntimeError("boom")
    assert not any(hp.active for hp in model.hook_points().values())


def test_unknown_hook_name_lists_closest():
    model = Transformer(ARCHS["gpt2"])
    with pytest.raises(HookError, match="blocks.0.attn.hook_pattern"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: None)])
    with pytest.raises(CircuitlabError, match="not in the cache"):
        _, cache = model.run_with_cache(tokens(), names_filter=["blocks.0.hook_resid_post"])
        cache["pattern", 0]


def test_backward_hooks_give_gradients():
    model = Transformer(ARCHS["gpt2"])
    t = tokens()
    _, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("resid_post"), incl_bwd=True)
    assert set(cache.grads) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    # the gradient wrt the final residual equals autograd's on a leaf copy
    resid = cache["resid_post", 1].clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model.unembed(model.ln_final(resid))[:, :-1].flatten(0, 1),
                                             t[:, 1:].flatten())
    loss.backward()
    torch.testing.assert_close(cache.grads["blocks.1.hook_resid_post"], resid.grad)


def test_gradient_cache_leaves_parameters_alone_and_works_frozen():
    """incl_bwd takes activation gradients with autograd.grad: no parameter .grad is filled, frozen
    weights work, and the values equal backward hooks' on a trainable copy."""
    model = Transformer(ARCHS["llama"])
    t = tokens()
    names = ["hook_embed", "blocks.0.attn.hook_z", "blocks.1.hook_resid_mid"]
    reference: dict[str, torch.Tensor] = {}
    with model.hooks(bwd_hooks=[(n, lambda g, hook: reference.__setitem__(hook.name, g)) for n in names]):
        logits = model(t)
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), t[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.requires_grad_(False)
    _, cache = model.run_with_cache(t, names_filter=names, incl_bwd=True)
    assert all(p.grad is None for p in model.parameters())
    for n in names:
        torch.testing.assert_close(cache.grads[n], reference[n])
        assert not cache[n].requires_grad
    with pytest.raises(CircuitlabError, match="gradient"):
        model.run_with_cache(t, incl_bwd=True, loss_fn=lambda logits: 1.0)


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


def test_zero_layer_logits_are_bigram_WE_WU():
    cfg = ModelConfig.from_preset("attn-only-0l", d_vocab=50, n_ctx=64, positional="none")
    model = Transformer(cfg)
    t = torch.arange(50)[None]
    torch.testing.assert_close(model(t)[0], model.W_E @ model.W_U + model.b_U)


def test_weight_views_match_hooked_activations():
    model = Transformer(ARCHS["gpt2"])
    t = tokens()
    _, cache = model.run_with_cache(t)
    x = cache["blocks.0.ln1.hook_normalized"] * model.blocks[0].ln1.w + model.blocks[0].ln1.b
    q = torch.einsum("bpm,hmd->bphd", x, model.W_Q[0]) + model.b_Q[0]
    torch.testing.assert_close(q, cache["q", 0], atol=1e-5, rtol=1e-5)
    v = torch.einsum("bpm,hmd->bphd", x, model.W_V[0]) + model.b_V[0]
    torch.testing.assert_close(v, cache["v", 0], atol=1e-5, rtol=1e-5)
    assert model.W_QK.shape == (2, 4, 128, 128) and model.W_OV.shape == (2, 4, 128, 128)
    torch.testing.assert_close(model.W_OV[1, 2], model.W_V[1, 2] @ model.W_O[1, 2])


def test_loss_and_context_limit():
    model = Transformer(ARCHS["gpt2"])
    loss = model.loss(tokens(2, 10))
    assert abs(loss.item() - torch.log(torch.tensor(50.0)).item()) < 0.5
    with pytest.raises(CircuitlabError, match="exceeds the model's context"):
        model(tokens(1, 40))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_kv_cache_generation_equals_uncached_greedy(arch):
    model = Transformer(ARCHS[arch])
    prompt = tokens(2, 5)
    cached = model.generate(prompt, 40, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 40, temperature=0, use_cache=False)
    assert cached.shape == (2, 45)
    assert torch.equal(cached, uncached)


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


@pytest.mark.parametrize("scaling, message", [
    ({"type": "yarn", "factor": 2.0}, "rope_scaling['type'] must be one of"),
    ({"type": "linear"}, "needs exactly the keys"),
    ({"type": "linear", "factor": -1.0}, "must be a positive number"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 64}, "high_freq_factor must be above"),
])
def test_bad_rope_scaling_names_the_rule(scaling, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelConfig.from_preset("llama-tiny", rope_scaling=scaling)


def test_rope_scaling_round_trips_through_yaml(tmp_path):
    cfg = ModelConfig.from_preset("llama-tiny", rope_scaling={"type": "linear", "factor": 2.0})
    cfg.save(tmp_path / "c.yaml")
    assert ModelConfig.load(tmp_path / "c.yaml") == cfg
