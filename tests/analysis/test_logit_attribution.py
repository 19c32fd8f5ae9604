"""Residual decomposition, direct logit attribution, logit lens and MLP neurons."""
import json

import pytest
import torch

import helpers

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.logit_attribution import (
    direct_logit_attribution,
    neuron_output_tokens,
    residual_decomposition,
    top_activating_inputs,
)
from circuitlab.analysis.lens import logit_lens

SMALL = dict(d_vocab=40, n_ctx=16)
ARCHS = {
    "gpt2": ModelConfig.from_preset("gpt2-tiny", d_model=32, d_mlp=64, **SMALL),
    "llama": ModelConfig.from_preset("llama-tiny", d_model=32, d_mlp=48, **SMALL),
    "neox": ModelConfig.from_preset("gpt2-tiny", d_model=32, d_mlp=64, positional="rotary", rotary_dim=4,
                                    parallel_attn_mlp=True, tied_embeddings=False, **SMALL),
    "attn-only": ModelConfig.from_preset("attn-only-2l", d_model=32, bias=True, **SMALL),
}


def random_model(cfg: ModelConfig) -> Transformer:
    return helpers.random_model(cfg, scale=10.0, noise=0.5)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_decomposition_sums_to_the_final_residual_and_dla_to_the_logit(arch):
    model = random_model(ARCHS[arch])
    tokens = torch.randint(0, 40, (3, 10))
    logits, cache = model.run_with_cache(tokens)
    parts = residual_decomposition(model, cache)
    cfg = model.cfg
    n_expected = 1 + (cfg.positional == "learned") + cfg.n_layers * (cfg.n_heads + cfg.has_mlp) + 1
    assert len(parts.labels) == n_expected == parts.components.shape[0]
    final = cache["resid_post", cfg.n_layers - 1]
    torch.testing.assert_close(parts.total(), final, atol=1e-4, rtol=1e-5)
    # without hook_result in the cache, heads come from z @ W_O: the same parts
    _, small = model.run_with_cache(tokens, names_filter=lambda n: "hook_result" not in n)
    torch.testing.assert_close(residual_decomposition(model, small).components, parts.components, atol=1e-5, rtol=1e-5)
    for answer, wrong, pos in ((7, None, -1), ([1, 2, 3], [4, 4, 4], 5)):
        dla = direct_logit_attribution(model, cache, answer, wrong, pos=pos, decomposition=parts)
        answer_t = torch.tensor(answer).expand(3)
        expected = logits[torch.arange(3), pos, answer_t]
        if wrong is not None:
            expected = expected - logits[torch.arange(3), pos, torch.tensor(wrong)]
        torch.testing.assert_close(dla.logit, expected, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(dla.attributions.sum(0) + dla.constant, dla.logit, atol=1e-4, rtol=1e-5)
        assert dla.pos == pos % 10
    json.dumps(dla.to_dict())
    json.dumps(parts.to_dict())


def test_dla_of_one_head_equals_its_effect_under_a_frozen_norm_scale():
    """Removing a head's output from the final residual, with the final norm's scale held fixed,
    lowers the answer logit by exactly its attribution."""
    model = random_model(ARCHS["gpt2"])
    tokens = torch.randint(0, 40, (2, 9))
    _, cache = model.run_with_cache(tokens)
    dla = direct_logit_attribution(model, cache, answer=5)
    i = dla.labels.index("L1H2")
    head = cache["result", 1][:, -1, 2]  # [batch, d_model]
    final = cache["resid_post", 1][:, -1]
    scale = cache["ln_final.hook_scale"][:, -1]
    ln = model.ln_final

    def frozen(x):
        return ((x - x.mean(-1, keepdim=True)) / scale * ln.w + ln.b) @ model.W_U[:, 5]

    with torch.no_grad():
        torch.testing.assert_close(frozen(final) - frozen(final - head), dla.attributions[i], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "attn-only"])
def test_logit_lens_ends_at_the_model_output(arch):
    model = random_model(ARCHS[arch])
    tokens = torch.randint(0, 40, (11,))
    tok = type("Tok", (), {"decode": lambda self, ids: f"t{ids[0]}"})()
    lens = logit_lens(model, tokens, k=4, tokenizer=tok)
    assert lens.labels == ["embed", "L0", "L1"]
    assert lens.top_tokens.shape == (3, 11, 4) and lens.entropy.shape == (3, 11)
    with torch.no_grad():
        probs = model(tokens[None])[0].softmax(-1)
    torch.testing.assert_close(lens.top_probs[-1], probs.topk(4).values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lens.final_top_probs[-1], probs.max(-1).values, atol=1e-5, rtol=1e-5)
    assert lens.top_strs[-1][0][0] == f"t{int(probs[0].argmax())}" and lens.token_strs[2] == f"t{int(tokens[2])}"
    assert (lens.top_probs[..., :-1] >= lens.top_probs[..., 1:]).all()
    json.dumps(lens.to_dict())
    with pytest.raises(CircuitlabError, match="one sequence"):
        logit_lens(model, tokens.expand(2, -1))


def test_logit_lens_of_a_zero_layer_model():
    model = Transformer(ModelConfig.from_preset("attn-only-0l", **SMALL))
    tokens = torch.randint(0, 40, (6,))
    lens = logit_lens(model, tokens)
    with torch.no_grad():
        torch.testing.assert_close(lens.top_probs[0, :, 0], model(tokens[None])[0].softmax(-1).max(-1).values)


def test_neuron_output_tokens_and_top_activating_inputs():
    model = random_model(ARCHS["gpt2"])
    tokens = torch.randint(0, 40, (5, 12))
    nt = neuron_output_tokens(model, 1, [3, 17], k=4)
    with torch.no_grad():
        d = model.W_out[1, [3, 17]]
        logits = ((d - d.mean(-1, keepdim=True)) * model.ln_final.w) @ model.W_U
    assert torch.equal(nt.top_tokens, logits.topk(4).indices)
    assert torch.equal(nt.bottom_tokens, logits.topk(4, largest=False).indices)
    ex = top_activating_inputs(model, [tokens[:2], tokens[2:4], tokens[4:]], layer=0, neurons=[1, 9], k=3, context=4)
    _, cache = model.run_with_cache(tokens)
    acts = cache["post", 0][..., [1, 9]]  # [seq, pos, neuron]
    for i in range(2):
        torch.testing.assert_close(ex.values[i], acts[..., i].flatten().topk(3).values)
        for j in range(3):
            s, p = int(ex.seq[i, j]), int(ex.pos[i, j])
            assert acts[s, p, i] == pytest.approx(float(ex.values[i, j]))
            assert ex.contexts[i][j] == tokens[s, max(0, p - 4):p + 1].tolist()
    json.dumps(ex.to_dict())
    json.dumps(nt.to_dict())


def test_bad_inputs_raise_clear_errors():
    attn_only = random_model(ARCHS["attn-only"])
    with pytest.raises(CircuitlabError, match="attention-only"):
        neuron_output_tokens(attn_only, 0)
    model = random_model(ARCHS["gpt2"])
    with pytest.raises(CircuitlabError, match=r"neuron indices must be in \[0, 64\)"):
        neuron_output_tokens(model, 0, [64])
    tokens = torch.randint(0, 40, (2, 6))
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(CircuitlabError, match="one per sequence"):
        direct_logit_attribution(model, cache, answer=[1, 2, 3])
    with pytest.raises(CircuitlabError, match=r"in \[0, 40\)"):
        direct_logit_attribution(model, cache, answer=40)
    with pytest.raises(CircuitlabError, match="outside the sequence"):
        direct_logit_attribution(model, cache, answer=1, pos=6)
    _, partial = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.0"))
    with pytest.raises(CircuitlabError, match="the cache lacks"):
        residual_decomposition(model, partial)
