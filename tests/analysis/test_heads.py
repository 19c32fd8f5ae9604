"""Head detectors and classification on a model whose heads were set by hand.

The planted model is a 2-layer attention-only transformer built with forge, whose residual stream
has one-hot subspaces: tok (the token), pos (the position), prev (the previous token, written by
L0H0), out (read by the unembedding) and one (a constant 1). Its heads:

    L0H0 previous-token: query position i matches key position i - 1; copies TOK into PREV.
    L0H1 first-token (attention sink): every query matches key 0; writes nothing.
    L0H2 dead: all zero (uniform attention).
    L1H0 induction: query token v matches keys whose PREV is v (K-composition with L0H0) and
         copies their TOK into OUT, so the unembedding predicts it.
    L1H1 current-token: query position i matches key position i; writes nothing.
    L1H2 dead.


(Its tests of other modules moved with issue 38: tests/analysis/heads/test_detectors.py.)"""
import json

import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.qk_ov import k_composition_qk_circuit, ov_circuit, pos_qk_circuit, top_token_pairs
from circuitlab.analysis.heads import (
    classify_heads,
    detect_heads,
    detection_masks,
    induction_test_tokens,
)
from circuitlab.analysis.heads.induction import in_context_learning_score
from circuitlab.forge import Forge, ResidualLayout

V, N, C = 16, 32, 20.0  # vocabulary, context, attention sharpness


def planted_model(ov_sign: float = 1.0) -> Transformer:
    """ov_sign=-1 makes the induction head anti-copy: same attention, opposite effect on the logits.
    Built with forge on the residual subspaces tok, pos, prev, out and one (a constant 1)."""
    eye = torch.eye
    f = Forge(ResidualLayout({"tok": V, "pos": N, "prev": V, "out": V, "one": 1}), n_layers=2, n_heads=3,
              d_head=N, d_vocab=V, n_ctx=N, positional="learned")
    for t in range(V):
        f.embed(t, tok=eye(V)[t], one=1.0)
        f.unembed(t, out=10 * eye(V)[t])  # confident predictions, for the ICL score
    for p in range(N):
        f.pos(p, pos=eye(N)[p])
    key0 = torch.zeros(N, 1)
    key0[0] = 1.0  # "this key is position 0"
    prev_k = torch.zeros(N, N)
    prev_k[:N - 1, 1:] = eye(N - 1)  # the key at p - 1 matches the query at p
    (f.head(0, 0).q("pos", C * eye(N), into=range(N)).k("pos", prev_k, into=range(N))  # L0H0 previous token
     .v("tok", eye(V), into=range(V)).o("prev", eye(V), from_=range(V)))
    f.head(0, 1).q("one", C, into=0).k("pos", key0, into=[0])  # L0H1 first token
    (f.head(1, 0).q("tok", C * eye(V), into=range(V)).k("prev", eye(V), into=range(V))  # L1H0 induction
     .q("one", C, into=V).k("pos", -key0, into=[V])  # every query avoids key 0, whose prev holds its own token
     .v("tok", eye(V), into=range(V)).o("out", ov_sign * eye(V), from_=range(V)))
    f.head(1, 1).q("pos", C * eye(N), into=range(N)).k("pos", eye(N), into=range(N))  # L1H1 current token
    return f.model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.fixture(scope="module")
def classes(planted):
    return classify_heads(planted, seed=1, batch=8)


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
    assert set(checks) == {"induction score", "induction score on [r, r] with period 4",
                           "induction score on [r, r] with period 16", "copying score",
                           "K-composition with previous-token head L0H0"}
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


def test_classification_does_not_change_the_model():
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", d_model=32, d_mlp=64, d_vocab=40, n_ctx=24))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classify_heads(model, batch=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.unembed.weight is model.embed.weight  # still tied
