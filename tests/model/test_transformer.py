"""Core Transformer: config validation, hooks, cache, fast/eager agreement, per-head views.

(Its tests of other modules moved with issue 38: tests/model/test_components.py, tests/model/test_hooks.py,
tests/test_config.py.)"""
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
