"""Norm folding and centering: a new model with the same predictions; the original untouched."""
import pytest
import torch

import helpers

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.folding import fold_layer_norm

SMALL = dict(d_vocab=40, n_ctx=16)
ARCHS = {
    "gpt2 (layernorm, tied)": ModelConfig.from_preset("gpt2-tiny", d_model=32, d_mlp=64, **SMALL),
    "llama (rmsnorm, GQA, SwiGLU, rotary)": ModelConfig.from_preset("llama-tiny", d_model=32, d_mlp=48, **SMALL),
    "neox (parallel, partial rotary)": ModelConfig.from_preset(
        "gpt2-tiny", d_model=32, d_mlp=64, positional="rotary", rotary_dim=4, parallel_attn_mlp=True,
        tied_embeddings=False, **SMALL),
    "attn-only (no norm)": ModelConfig.from_preset("attn-only-2l", d_model=32, bias=True, **SMALL),
    "v-only with layernorm": ModelConfig(n_layers=2, d_model=8, n_heads=2, d_head=8, use_attn_out=False,
                                         attn_only=True, scale_scores=False, **SMALL),
}


def random_model(cfg: ModelConfig) -> Transformer:
    return helpers.random_model(cfg, scale=10.0, noise=0.5)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_folding_keeps_predictions(arch):
    model = random_model(ARCHS[arch])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 40, (3, 12))
    with torch.no_grad():
        logits = model(tokens)
        folded = fold_layer_norm(model)
        shifted = folded(tokens)
        exact = fold_layer_norm(model, center_unembed=False)(tokens)
    torch.testing.assert_close(exact, logits, atol=1e-4, rtol=1e-4)
    # centering W_U shifts all logits at a position by one constant: probabilities are unchanged
    shift = shifted - logits
    assert (shift - shift[..., :1]).abs().max() < 1e-4
    torch.testing.assert_close(shifted.log_softmax(-1), logits.log_softmax(-1), atol=1e-4, rtol=1e-4)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # original untouched
    assert model.cfg.tied_embeddings == ARCHS[arch].tied_embeddings


def test_folded_weights_have_the_promised_form():
    model = random_model(ARCHS["gpt2 (layernorm, tied)"])
    folded = fold_layer_norm(model)
    assert model.unembed.weight is model.embed.weight
    assert folded.unembed.weight is not folded.embed.weight and not folded.cfg.tied_embeddings
    for norm in [b.ln1 for b in folded.blocks] + [b.ln2 for b in folded.blocks] + [folded.ln_final]:
        assert torch.equal(norm.w, torch.ones_like(norm.w)) and torch.equal(norm.b, torch.zeros_like(norm.b))
    zero = dict(atol=1e-5, rtol=0)
    torch.testing.assert_close(folded.W_Q.sum(dim=2), torch.zeros_like(folded.W_Q.sum(dim=2)), **zero)  # reading
    torch.testing.assert_close(folded.W_E.mean(-1), torch.zeros(40), **zero)  # writing
    torch.testing.assert_close(folded.W_O.mean(-1), torch.zeros_like(folded.W_O.mean(-1)), **zero)
    torch.testing.assert_close(folded.W_U.mean(-1), torch.zeros(32), **zero)  # unembedding
    assert torch.equal(folded.b_V, torch.zeros_like(folded.b_V))  # value biases moved into b_O
    assert not torch.allclose(folded.b_O, model.b_O)


def test_rmsnorm_folding_multiplies_gains_in_and_does_not_center():
    model = random_model(ARCHS["llama (rmsnorm, GQA, SwiGLU, rotary)"])
    folded = fold_layer_norm(model, center_unembed=False)
    w = model.blocks[0].ln1.w
    torch.testing.assert_close(folded.W_Q[0], model.W_Q[0] * w[None, :, None])
    torch.testing.assert_close(folded.W_E, model.W_E)
    with pytest.raises(CircuitlabError, match="center_writing needs LayerNorm"):
        fold_layer_norm(model, center_writing=True)
