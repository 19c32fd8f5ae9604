"""The bridges: to_transformer_lens (same logits and activations on every preset and architecture
switch TransformerLens can express) and nnsight tracing over a circuitlab model."""
import pytest
import torch

import helpers

from circuitlab import ModelConfig, Transformer, presets
from circuitlab.forge.adder import build_post_adder
from circuitlab.pretrained import BridgeError, every_hook_point, to_nnsight, to_transformer_lens

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SMALL = dict(d_vocab=48, n_ctx=24)
LAB = dict(n_layers=2, d_model=64, n_heads=4, d_mlp=96)  # the lab presets' architecture, shrunk


def preset_config(name: str) -> ModelConfig:
    return ModelConfig.from_preset(name, **SMALL, **(LAB if name in ("quick", "small", "medium") else {}))


VARIANTS = {
    "parallel-attn-mlp, partial rotary, gelu": dict(norm="layernorm", positional="rotary", rotary_dim=8,
                                                     parallel_attn_mlp=True, mlp="gelu"),
    "no positions, no norm, relu": dict(norm="none", positional="none", mlp="relu"),
    "rmsnorm, learned positions, no bias, tied": dict(norm="rmsnorm", bias=False, tied_embeddings=True),
    "layernorm without bias, linear rope scaling": dict(bias=False, positional="rotary",
                                                        rope_scaling={"type": "linear", "factor": 4.0}),
    "GQA, llama3 rope scaling, swiglu": dict(n_kv_heads=2, positional="rotary", mlp="swiglu", bias=False,
                                             norm="rmsnorm", rope_scaling={
                                                 "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    "unscaled scores, V-only heads": dict(use_attn_out=False, scale_scores=False, d_head=32, n_heads=2),
}


def assert_same(model: Transformer, ref, tokens: torch.Tensor) -> None:
    """Same logits (≤ 1e-4) and same activations under the same hook names."""
    logits, cache = model.run_with_cache(tokens)
    ref_logits, ref_cache = ref.run_with_cache(tokens)
    torch.testing.assert_close(ref_logits, logits, atol=1e-4, rtol=1e-5)
    names = ["hook_embed"] + [f"blocks.{l}.{n}" for l in range(model.cfg.n_layers)
                              for n in ("hook_resid_post", "attn.hook_z", "attn.hook_pattern")]
    for name in names:
        torch.testing.assert_close(ref_cache[name], cache[name], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("name", list(presets()))
def test_every_preset_round_trips_to_transformer_lens(name):
    model = helpers.random_model(preset_config(name), scale=2.0)
    tokens = torch.randint(0, SMALL["d_vocab"], (2, SMALL["n_ctx"]))
    assert_same(model, to_transformer_lens(model), tokens)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_architecture_switches_round_trip(variant):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_mlp=64, **SMALL).replace(**VARIANTS[variant])
    model = helpers.random_model(cfg, scale=2.0)
    tokens = torch.randint(0, SMALL["d_vocab"], (2, SMALL["n_ctx"]))
    assert_same(model, to_transformer_lens(model), tokens)


def test_hand_built_adder_in_transformer_lens_adds():
    """V-only heads with unscaled scores and a hand-set learned position: the post's adder, run by TL."""
    adder = build_post_adder()
    ref = to_transformer_lens(adder.model)
    prompt = adder.prompt(17, 25)[None]
    _, cache = ref.run_with_cache(prompt)
    acc, digit = cache["blocks.1.hook_resid_post"][0, -1, :2].tolist()
    assert round(10 * digit + acc) == 42


def test_float64_and_copies_not_shares():
    model = helpers.random_model(preset_config("gpt2-tiny")).double()
    ref = to_transformer_lens(model)
    assert ref.W_E.dtype == torch.float64
    tokens = torch.randint(0, SMALL["d_vocab"], (2, 8))
    torch.testing.assert_close(ref(tokens), model(tokens), atol=1e-10, rtol=1e-10)
    with torch.no_grad():
        ref.W_E.zero_()
    assert model.W_E.abs().sum() > 0


def test_what_transformer_lens_cannot_express_is_one_clear_error():
    model = helpers.random_model(ModelConfig(n_layers=1, d_model=32, n_heads=4, mlp="swiglu", bias=True, **SMALL))
    with pytest.raises(BridgeError, match="gated .SwiGLU / GeGLU. MLP with biases"):
        to_transformer_lens(model)
    with torch.no_grad():  # zero input biases (as a Qwen3 with attention biases has): expressible
        model.blocks[0].mlp.fc_in.bias.zero_()
    assert_same(model, to_transformer_lens(model), torch.randint(0, SMALL["d_vocab"], (2, 8)))
    post_only = ModelConfig(n_layers=1, d_model=32, n_heads=4, norm="rmsnorm", block_norms="post", **SMALL)
    with pytest.raises(BridgeError, match="post-only block norms only with q/k norms"):
        to_transformer_lens(Transformer(post_only))


def test_nnsight_trace_reads_and_patches_what_our_hooks_do():
    model = helpers.random_model(preset_config("gpt2-tiny"), scale=2.0)
    tokens = torch.randint(0, SMALL["d_vocab"], (2, 12))
    _, cache = model.run_with_cache(tokens)
    nn_model = to_nnsight(model)
    with nn_model.trace(tokens):  # nnsight 0.8 wants modules in the order they run
        resid = nn_model.blocks[0].hook_resid_post.output.save()
        z = nn_model.blocks[1].attn.hook_z.output.save()
    torch.testing.assert_close(z, cache["blocks.1.attn.hook_z"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(resid, cache["blocks.0.hook_resid_post"], atol=1e-5, rtol=1e-5)
    with every_hook_point(model), nn_model.trace(tokens):  # the pattern exists only on the hooked path
        pattern = nn_model.blocks[0].attn.hook_pattern.output.save()
    torch.testing.assert_close(pattern, cache["blocks.0.attn.hook_pattern"])
    with nn_model.trace(tokens):  # a patch written through nnsight = the same patch through our hooks
        nn_model.blocks[0].hook_resid_post.output[:, 3] = 0
        patched = nn_model.output.save()

    def zero_pos_3(x, hook):
        x = x.clone()
        x[:, 3] = 0
        return x

    expected = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", zero_pos_3)])
    torch.testing.assert_close(patched, expected, atol=1e-5, rtol=1e-5)
    assert not any(hp.active for hp in model.hook_points().values())  # nothing left attached
