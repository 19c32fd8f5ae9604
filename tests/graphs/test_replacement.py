"""Attribution graphs against truth: a forged model whose MLPs are planted sparse dictionaries (exact
transcoders: zero errors, scores 1.0, the planted path strongest, decoys pruned), and every edge of a
random model's graph checked as an effect in the frozen replacement model (float64, 1e-8).

(Split out of the flat test_graphs module, issue 38.)"""
import pytest
import torch

from circuitlab.graphs import Intervention, ReplacementModel
from circuitlab.graphs.planted import VOCAB, planted_path_model

from graphs.test_attribution import random_transcoder, setup  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_replacement_model_is_exact_and_interventions_match_the_graph(setup):
    model, tc, tokens, graph = setup
    rm = ReplacementModel(model, tc, tokens)
    real = model(tokens[None])
    torch.testing.assert_close(rm.run().logits, real, atol=1e-10, rtol=0)
    torch.testing.assert_close(rm.run(mode="model").logits, real, atol=1e-10, rtol=0)
    # A last-layer feature has only direct effects: scaling it by 0 moves the logit by exactly its edge,
    # in the replacement model and in the real model with attention (and norms) frozen.
    last = [i for i in range(graph.n_features) if graph.node(i)["layer"] == 2 and graph.node(i)["pos"] == 9]
    i = max(last, key=lambda j: abs(float(graph.adjacency[graph.logit_start, j])))
    n, tok = graph.node(i), int(graph.logit_tokens[0])
    iv = [Intervention(n["layer"], n["feature"], scale=0.0, pos=n["pos"])]

    def demeaned(logits):
        return float((logits[0, -1, tok] - logits[0, -1].mean()).detach())

    for out in (rm.run(iv), rm.run(iv, mode="model")):
        assert demeaned(real) - demeaned(out.logits) == pytest.approx(float(graph.adjacency[graph.logit_start, i]),
                                                                      abs=1e-8)
        assert float(out.acts[2][0, n["pos"], n["feature"]]) == 0.0
    free = rm.run(iv, mode="model", freeze_attention=False).logits   # attention and norms free: close, not equal
    assert torch.isfinite(free).all()


def test_logit_effects_are_each_features_signed_effect_through_later_features(setup):
    """Graph.logit_effects = the change of the demeaned logit per relative change of a feature, measured in the
    replacement model (attention frozen, later features live): direct edge + paths through later features."""
    model, tc, tokens, graph = setup
    rm = ReplacementModel(model, tc, tokens)
    tok, eps = int(graph.logit_tokens[0]), 1e-4
    effects = graph.logit_effects()
    assert effects.shape == (graph.n_features,) and effects.dtype == torch.float64

    def demeaned(logits):
        return float(logits[0, -1, tok] - logits[0, -1].mean())

    base = demeaned(rm.run().logits)
    early = [i for i in range(graph.n_features) if graph.node(i)["layer"] < 2]
    indirect = 0.0
    for i in early[::max(1, len(early) // 12)]:
        n = graph.node(i)
        out = rm.run([Intervention(n["layer"], n["feature"], scale=1 + eps, pos=n["pos"])]).logits
        assert (demeaned(out) - base) / eps == pytest.approx(float(effects[i]), rel=1e-5, abs=1e-8), graph.label(i)
        indirect = max(indirect, abs(float(effects[i] - graph.adjacency[graph.logit_start, i])))
    assert indirect > 1e-3        # the paths through later features count (the direct edge alone would fail)
    last = [i for i in range(graph.n_features) if graph.node(i)["layer"] == 2]
    torch.testing.assert_close(effects[last], graph.adjacency[graph.logit_start, last].double())


def test_steered_generation_follows_the_feature(setup):
    model, tc, tokens, graph = setup
    rm = ReplacementModel(model, tc, tokens)
    assert torch.equal(rm.generate(5), model.generate(tokens[None], 5, temperature=0.0)[0])
    # Planted model, no "A" in the prompt: it predicts "y"; the late feature turned on writes "Z".
    p = planted_path_model()
    prompt = torch.tensor([VOCAB.index(c) for c in "xxBxy"])
    rm = ReplacementModel(p.model, p.transcoders, prompt)
    assert VOCAB[int(rm.generate(1)[-1])] == "y"
    steered = rm.generate(3, [Intervention(1, 0, value=2.0)])
    assert [VOCAB[int(t)] for t in steered[-3:]] == ["Z", "Z", "Z"]
