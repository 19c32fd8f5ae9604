"""Head detectors and classification on a model whose heads were set by hand.

The planted model is a 2-layer attention-only transformer whose residual stream has one-hot
subspaces: TOK (the token), POS (the position), PREV (the previous token, written by L0H0),
OUT (read by the unembedding) and ONE (a constant 1). Its heads:

    L0H0 previous-token: query position i matches key position i - 1; copies TOK into PREV.
    L0H1 first-token (attention sink): every query matches key 0; writes nothing.
    L0H2 dead: all zero (uniform attention).
    L1H0 induction: query token v matches keys whose PREV is v (K-composition with L0H0) and
         copies their TOK into OUT, so the unembedding predicts it.
    L1H1 current-token: query position i matches key position i; writes nothing.
    L1H2 dead.
"""
import json

import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.circuits import k_composition_qk_circuit, ov_circuit, pos_qk_circuit, top_token_pairs
from circuitlab.analysis.heads import (
    classify_heads,
    detect_heads,
    detection_masks,
    in_context_learning_score,
    induction_test_tokens,
)

V, N, C = 16, 32, 20.0  # vocabulary, context, attention sharpness
TOK, POS, PREV, OUT, ONE = 0, V, V + N, 2 * V + N, 3 * V + N
D_MODEL = 3 * V + N + 1


def set_head(model, layer, head, W_Q=None, W_K=None, W_V=None, W_O=None):
    """Write per-head weights ([d_model, d_head] for Q/K/V, [d_head, d_model] for O) into the fused ones."""
    attn = model.blocks[layer].attn
    H, D = attn.n_heads, attn.d_head
    with torch.no_grad():
        for i, W in enumerate((W_Q, W_K, W_V)):
            if W is not None:
                start = (i * H + head) * D
                attn.qkv.weight[start:start + D] = W.T
        if W_O is not None:
            attn.out.weight[:, head * D:(head + 1) * D] = W_O.T


def planted_model(ov_sign: float = 1.0) -> Transformer:
    """ov_sign=-1 makes the induction head anti-copy: same attention, opposite effect on the logits."""
    cfg = ModelConfig(n_layers=2, d_model=D_MODEL, n_heads=3, d_head=N, d_vocab=V, n_ctx=N, attn_only=True,
                      norm="none", bias=False, scale_scores=False)
    model = Transformer(cfg)
    eye = torch.eye
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight[:, TOK:TOK + V] = eye(V)
        model.embed.weight[:, ONE] = 1.0
        model.pos_embed.weight[:, POS:POS + N] = eye(N)
        model.unembed.weight[:, OUT:OUT + V] = 10 * eye(V)  # confident predictions, for the ICL score

    def zeros():
        return torch.zeros(D_MODEL, N), torch.zeros(D_MODEL, N), torch.zeros(D_MODEL, N), torch.zeros(N, D_MODEL)

    W_Q, W_K, W_V, W_O = zeros()  # L0H0 previous token
    W_Q[POS:POS + N] = C * eye(N)
    W_K[POS:POS + N - 1, 1:] = eye(N - 1)
    W_V[TOK:TOK + V, :V] = eye(V)
    W_O[:V, PREV:PREV + V] = eye(V)
    set_head(model, 0, 0, W_Q, W_K, W_V, W_O)

    W_Q, W_K, _, _ = zeros()  # L0H1 first token
    W_Q[ONE, 0] = C
    W_K[POS, 0] = 1.0
    set_head(model, 0, 1, W_Q, W_K)

    W_Q, W_K, W_V, W_O = zeros()  # L1H0 induction
    W_Q[TOK:TOK + V, :V] = C * eye(V)
    W_K[PREV:PREV + V, :V] = eye(V)
    W_Q[ONE, V] = C  # every query avoids key 0, whose PREV slot holds key 0's own token
    W_K[POS, V] = -1.0
    W_V[TOK:TOK + V, :V] = eye(V)
    W_O[:V, OUT:OUT + V] = ov_sign * eye(V)
    set_head(model, 1, 0, W_Q, W_K, W_V, W_O)

    W_Q, W_K, _, _ = zeros()  # L1H1 current token
    W_Q[POS:POS + N] = C * eye(N)
    W_K[POS:POS + N] = eye(N)
    set_head(model, 1, 1, W_Q, W_K)
    return model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.fixture(scope="module")
def classes(planted):
    return classify_heads(planted, seed=1, batch=8)


def test_detector_scores_of_planted_heads(planted):
    tokens = induction_test_tokens(8, N, V, torch.Generator().manual_seed(0))
    _, cache = planted.run_with_cache(tokens)
    scores = detect_heads(cache, tokens)
    expected = {"previous_token": (0, 0), "first_token": (0, 1), "induction": (1, 0), "current_token": (1, 1)}
    for name, head in expected.items():
        assert scores[name][head] > 0.999, name
        others = scores[name].clone()
        others[head] = 0
        assert others.max() < 0.25, name  # the dead (uniform) heads score 1/(keys seen), the others ~0
    assert scores["entropy"][0, 2] == pytest.approx(1.0, abs=1e-5)  # a dead head attends uniformly
    assert scores["entropy"][0, 0] < 1e-3
    assert scores["duplicate_token"].max() < 0.25
    assert scores.top("induction", 1)[0][:2] == (1, 0)


def test_classification_finds_exactly_the_planted_heads(classes):
    assert classes.heads_with("previous-token") == [(0, 0)]
    assert classes.heads_with("first-token") == [(0, 1)]
    assert classes.heads_with("induction") == [(1, 0)]
    assert classes.heads_with("current-token") == [(1, 1)]
    assert classes.heads_with("copying") == [(1, 0)]
    assert classes.heads_with("duplicate-token") == []
    assert set(classes.heads_with("diffuse")) == {(0, 2), (1, 2)}
    assert classes.rejected == []
    induction = next(lab for lab in classes.labels if lab.label == "induction")
    checks = {e.name: e for e in induction.evidence}
    assert set(checks) == {"induction score", "copying score", "K-composition with previous-token head L0H0"}
    assert checks["copying score"].value == pytest.approx(1.0, abs=1e-5)
    k_comp = checks["K-composition with previous-token head L0H0"]
    assert k_comp.value > k_comp.threshold == pytest.approx(classes.composition.threshold)
    assert "L1H0 induction" in "\n".join(classes.summary())
    json.dumps(classes.to_dict())


def test_induction_behaviour_without_copying_is_not_labelled():
    anti = classify_heads(planted_model(ov_sign=-1.0), seed=1, batch=8)
    assert anti.heads_with("induction") == []
    [rejected] = anti.rejected
    assert (rejected.layer, rejected.head, rejected.label) == (1, 0, "induction")
    failed = [e.name for e in rejected.evidence if not e.passed]
    assert failed == ["copying score"]
    assert anti.copying.scores[1, 0] == pytest.approx(-1.0, abs=1e-5)


def test_planted_circuits_read_off_the_weights(planted):
    # the induction head's QK circuit through the previous-token head is C times the identity
    qk = k_composition_qk_circuit(planted, (1, 0), (0, 0))
    torch.testing.assert_close(qk.AB, C * torch.eye(V))
    ov = ov_circuit(planted, 1)[0]
    torch.testing.assert_close(ov.AB, 10 * torch.eye(V))
    pairs = top_token_pairs(ov, k=5)
    assert pairs.rows == pairs.cols and all(v == pytest.approx(10.0) for v in pairs.values)
    pos = pos_qk_circuit(planted, 0)[0].AB  # previous-token head: C on the sub-diagonal
    torch.testing.assert_close(pos.diagonal(-1), torch.full((N - 1,), C))
    assert pos.triu().abs().max() == 0


def test_in_context_learning_score(planted):
    gen = torch.Generator().manual_seed(3)
    tokens = torch.stack([torch.randperm(V, generator=gen).repeat(2) for _ in range(8)])  # [r, r], r distinct
    icl = in_context_learning_score(planted, tokens, early=2, late=N - 2)
    with torch.no_grad():
        losses = planted.loss(tokens, per_token=True).mean(0)
    assert icl.score == pytest.approx(float(losses[N - 2] - losses[2]), abs=1e-5)
    assert icl.early_loss > 2.0 and icl.late_loss < 0.05  # unpredictable at first, copied once repeated
    assert icl.loss_by_pos.shape == (N - 1,)
    with pytest.raises(CircuitlabError, match="early < late"):
        in_context_learning_score(planted, tokens, early=5, late=5)


def test_detection_masks_on_a_small_example():
    tokens = torch.tensor([[4, 7, 4, 7, 9]])
    masks = detection_masks(tokens)
    # query 2 (token 4) has token 4 at key 0 and the token after it at key 1
    assert masks["duplicate_token"][0, 2].nonzero().flatten().tolist() == [0]
    assert masks["induction"][0, 2].nonzero().flatten().tolist() == [1]
    assert masks["induction"][0, 3].nonzero().flatten().tolist() == [2]
    assert not masks["induction"][0, 4].any()  # token 9 never appeared before
    assert not masks["current_token"][0, 0].any() and masks["current_token"][0, 3, 3]


def test_bad_inputs_raise_clear_errors(planted):
    tokens = induction_test_tokens(2, 10, V)
    _, cache = planted.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    with pytest.raises(CircuitlabError, match="no attention patterns"):
        detect_heads(cache, tokens)
    _, cache = planted.run_with_cache(tokens)
    with pytest.raises(CircuitlabError, match="do not match"):
        detect_heads(cache, tokens[:, :5])
    with pytest.raises(CircuitlabError, match="unknown threshold"):
        classify_heads(planted, thresholds={"inductoin": 0.5})


def test_classification_does_not_change_the_model():
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", d_model=32, d_mlp=64, d_vocab=40, n_ctx=24))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classify_heads(model, batch=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.unembed.weight is model.embed.weight  # still tied
