"""Architecture assumptions: analyses that hold only for some block layouts refuse the others in one line;
those that can hold for all (folding, the model's read-out) do, exactly."""
import pytest
import torch

from circuitlab import CircuitlabError, ConfigError, ModelConfig, Transformer
from circuitlab.analysis import logit_attribution, qk_ov
from circuitlab.analysis.edges.edge_graph import EdgeGraph
from circuitlab.analysis.folding import fold_layer_norm
from circuitlab.model.assumptions import ASSUMPTIONS, require, unmet

SMALL = dict(n_layers=2, d_vocab=40, n_ctx=16)
PRE = ModelConfig.from_preset("gpt2-tiny", **SMALL)
SANDWICH_CAPPED = ModelConfig.from_preset("llama-tiny", block_norms="sandwich", logit_softcap=3.0, **SMALL)
POST = ModelConfig.from_preset("llama-tiny", block_norms="post", qk_norm="full", **SMALL)


def model_of(cfg: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(cfg).double()
    with torch.no_grad():  # gains away from 1, so folding them is tested
        for n, p in model.named_parameters():
            if n.endswith(".w"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def test_the_properties_follow_the_switches():
    assert unmet(PRE, *ASSUMPTIONS) == []
    assert unmet(SANDWICH_CAPPED, *ASSUMPTIONS) == ["pre_norm", "additive_heads", "linear_readout", "learned_positions"]
    assert unmet(POST, "pre_norm", "additive_heads", "linear_readout", "learned_positions") == [
        "pre_norm", "additive_heads", "learned_positions"]
    with pytest.raises(ValueError, match="unknown architecture assumption"):
        unmet(PRE, "pre-norm")


@pytest.mark.parametrize("call, what", [
    (lambda m, c: logit_attribution.neuron_output_tokens(m, 0), "the neurons' output tokens"),
    (lambda m, c: qk_ov.ov_circuit(m), "the OV circuit"),
    (lambda m, c: qk_ov.copying_scores(m), "OV eigenvalues"),
    (lambda m, c: qk_ov.composition_scores(m, n_baseline=2), "composition scores"),
    (lambda m, c: qk_ov.k_composition_qk_circuit(m, (1, 0), (0, 0)), "K-composition"),
])
def test_analyses_refuse_post_norm_models_in_one_line(call, what):
    for cfg in (SANDWICH_CAPPED, POST):
        model = model_of(cfg)
        _, cache = model.run_with_cache(torch.randint(0, 40, (1, 5)))
        with pytest.raises(ConfigError, match=f"^{what}.*assumes .*; this model .*has (sandwich|post) norms") as e:
            call(model, cache)
        assert "\n" not in str(e.value)
    model = model_of(PRE)  # the same calls run on a pre-norm model
    _, cache = model.run_with_cache(torch.randint(0, 40, (1, 5)))
    call(model, cache)


def test_post_norm_models_get_a_decomposition_an_edge_graph_and_dla_of_the_logit_before_the_cap():
    """What holds for every layout: a head's share of a post-normed output (Block.attn_out_shares) makes
    the residual decomposition and the edge graph exact (tests/pretrained/test_families_analyses.py checks each family);
    under a logit soft-cap DLA explains the logit before the cap."""
    tokens = torch.randint(0, 40, (1, 5))
    for cfg in (SANDWICH_CAPPED, POST):
        model = model_of(cfg)
        _, cache = model.run_with_cache(tokens)
        parts = logit_attribution.residual_decomposition(model, cache)
        torch.testing.assert_close(parts.total(), cache["blocks.1.hook_resid_post"])
        assert len(EdgeGraph.of(model).sources) == 1 + cfg.n_layers * (cfg.n_heads + 1)
        dla = logit_attribution.direct_logit_attribution(model, cache, answer=3)
        raw = model.readout(cache["blocks.1.hook_resid_post"][:, -1], soft_cap=False)[:, 3]
        torch.testing.assert_close(dla.logit, raw)
        torch.testing.assert_close(dla.attributions.sum(0) + dla.constant, dla.logit)
    model = model_of(PRE)
    _, cache = model.run_with_cache(tokens)
    dla = logit_attribution.direct_logit_attribution(model, cache, answer=3)  # and pre-norm, uncapped: exact
    assert abs(float(dla.attributions.sum() + dla.constant.sum()) - float(dla.logit.sum())) < 1e-9


@pytest.mark.parametrize("cfg", [PRE, SANDWICH_CAPPED, POST], ids=["pre", "sandwich-capped", "post"])
def test_folding_holds_for_every_block_layout(cfg):
    """Only the norms that read the residual stream fold; the logits stay the same up to a per-position
    constant (exactly the same where a soft-cap forbids centering the unembedding)."""
    model = model_of(cfg)
    tokens = torch.randint(0, 40, (2, 7))
    want, got = model(tokens), fold_layer_norm(model)(tokens)
    diff = want - got
    if cfg.logit_softcap is not None:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(diff - diff.mean(-1, keepdim=True), torch.zeros_like(diff), rtol=0, atol=1e-12)
    if cfg.logit_softcap is not None:
        with pytest.raises(ConfigError, match="^center_unembed assumes logits that are the final norm"):
            fold_layer_norm(model, center_unembed=True)
    if cfg.block_norms != "pre":
        with pytest.raises(CircuitlabError, match="center_writing"):
            fold_layer_norm(model, center_writing=True)


def test_require_names_the_model():
    with pytest.raises(ConfigError, match="^x assumes learned position embeddings \\(W_pos\\); this model "
                                          "'llama-tiny' has 'rotary' positions$"):
        require(ModelConfig.from_preset("llama-tiny"), "x", "learned_positions")
