"""Steering on a hand-built model whose feature directions are known, and the sweep (`circuitlab steer` itself:
tests/commands/test_steer.py; its pipeline: tests/experiments/test_steer.py)."""
import json

import pytest
import torch
from tiny_trained import induction_model, repeated_batch

from circuitlab import CircuitlabError
from circuitlab.analysis.steering import (contrast_direction, steered_generate, steering, steering_sweep,
                                          vector_direction)
from circuitlab.forge import build_previous_token_model

pytestmark = pytest.mark.usefixtures("one_thread")
V = 20


@pytest.fixture(scope="module")
def pt():
    return build_previous_token_model(d_vocab=V, n_ctx=16)


def test_steering_moves_exactly_the_outputs_it_should(pt):
    model, layout = pt.model, pt.layout
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))
    clean = model(tokens)
    # "prev" is read by the unembedding only: +c on prev[7] raises logit 7 by exactly c where it is added.
    out_dir = vector_direction(model, layout.vector(prev=torch.eye(V)[7]), layer=0)
    with steering(model, out_dir, 2.5, positions=[4]):
        steered = model(tokens)
    delta = steered - clean
    assert torch.allclose(delta[:, 4, 7], torch.full((3,), 2.5), atol=1e-5)
    delta[:, 4, 7] = 0
    assert delta.abs().max() < 1e-5
    # "tok" is what the previous-token head copies: +c on tok[3] at position 4 shows up at position 5.
    in_dir = vector_direction(model, layout.vector(tok=torch.eye(V)[3]), layer=0)
    with steering(model, in_dir, 1.5, positions=[4]):
        delta = model(tokens) - clean
    assert torch.allclose(delta[:, 5, 3], torch.full((3,), 1.5), atol=1e-4)
    delta[:, 5, 3] = 0
    assert delta.abs().max() < 1e-4
    # A contrast of two prompt sets recovers the difference of their token directions (positions cancel).
    fives, sevens = torch.full((4, 6), 5), torch.full((4, 6), 7)
    vec = contrast_direction(model, fives, sevens, layer=0)
    assert torch.allclose(vec.direction, layout.vector(tok=torch.eye(V)[5] - torch.eye(V)[7]), atol=1e-6)
    # In generation: steering every position towards prev[7] makes every new token a 7.
    out = steered_generate(model, tokens[:, :3], out_dir, 50.0, 6, temperature=0)
    assert (out[:, 3:] == 7).all()
    assert torch.equal(model(tokens), clean)  # hooks are gone afterwards


def test_sweep_measures_the_target_and_the_neutral_cost():
    model = induction_model()
    gen = torch.Generator().manual_seed(0)
    positive = [torch.full((12,), 3)] * 2     # the model should come to expect runs of 3
    negative = [torch.full((12,), 9)] * 2
    neutral = list(repeated_batch(4, gen))
    vec = contrast_direction(model, positive, negative, layer=1)
    sweep = steering_sweep(model, vec, [0, 1, 2], positive, negative, neutral,
                           metric=lambda m: float(m(torch.tensor([[1, 2, 4]]))[0, -1].log_softmax(-1)[3]),
                           metric_name="log p(3)")
    assert sweep.preference[2] > sweep.preference[1] > sweep.preference[0]
    assert sweep.metric[2] > sweep.metric[0] and float(sweep.neutral_cost()[0]) == 0.0
    d = json.loads(json.dumps(sweep.to_dict()))
    assert d["vector"]["source"] == "contrast" and len(d["neutral_cost"]) == 3 and "log p(3)" in sweep.table()


def test_bad_inputs(pt):
    with pytest.raises(CircuitlabError, match="out of range"):
        contrast_direction(pt.model, [torch.tensor([1, 2])], [torch.tensor([3])], layer=1)
    with pytest.raises(CircuitlabError, match="prompt set is empty"):
        contrast_direction(pt.model, [], [torch.tensor([3])], layer=0)
    with pytest.raises(CircuitlabError, match="must have 56 entries"):
        vector_direction(pt.model, torch.ones(3), layer=0)


@pytest.mark.parametrize("hook", ["blocks.0.mlp.hook_post", "blocks.1.attn.hook_z"])
def test_feature_direction_adds_the_decoder_row_at_the_dictionary_hook(hook):
    # A dictionary on MLP neurons ([d_mlp]) or on the heads' z ([n_heads * d_head], stored flat): steering
    # with feature f at coef c is exactly adding c * W_dec[f] (reshaped) to that hook's activation.
    from circuitlab.analysis.steering import feature_direction
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    from circuitlab import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=11, n_ctx=8, d_mlp=24)).eval()
    width = 24 if hook.endswith("hook_post") else 16
    sae = SparseDictionary(DictionaryConfig("topk", d_in=width, d_sae=6, k=2, hook_name=hook), seed=0)
    tokens = torch.randint(0, 11, (2, 8))
    vec = feature_direction(model, sae, 4)
    with steering(model, vec, 3.0):
        steered = model(tokens)
    by_hand = lambda x, hook: x + 3.0 * sae.W_dec[4].detach().reshape(x.shape[2:])  # noqa: E731
    with model.hooks(fwd_hooks=[(hook, by_hand)]):
        expected = model(tokens)
    torch.testing.assert_close(steered, expected, rtol=0, atol=0)
    assert not torch.allclose(steered, model(tokens))
