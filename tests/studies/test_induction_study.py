"""The induction study: on a tiny model that learned induction (fast), on SmolLM2 (slow), and every verdict against
the numbers that would make it false."""
import copy
import os
from pathlib import Path

import pytest
import torch

from circuitlab.names import parse_head
from circuitlab.studies.induction import (InductionOptions, control_draw, induction_claims, run_induction,
                                          top_heads)


def test_a_model_that_learned_induction_passes_and_its_heads_are_causal(one_thread):
    from tiny_trained import HALF, induction_model

    model = induction_model()
    found = run_induction(model, None, InductionOptions(batch=16, period=HALF, ks=(1,), draws=3), progress=False)
    n = found.numbers
    assert n["loss_second_copy"] < 0.5 * n["loss_first_copy"]
    assert len(n["loss_by_position"]) == 2 * HALF - 1
    assert found.claims[0].holds is True
    # the prefix-matching head can only be in layer 1 (a layer-0 head has no previous-token head to build on)
    assert parse_head(n["top"]["prefix_matching"][0]["head"])[0] == 1
    row = n["causal"]["by_k"][0]
    assert row["rise"] > row["control_rise_mean"]   # the found head matters more than the other of its layer
    assert found.claims[-1].holds is True
    # its induction score (direct logit attribution to the right token) is positive: it copies
    l, h = parse_head(n["top"]["prefix_matching"][0]["head"])
    assert n["scores"]["induction"][l][h] > 0


def test_the_control_draws_other_heads_of_the_same_layers():
    gen = torch.Generator().manual_seed(0)
    top = ["L3H1", "L3H2", "L5H0"]
    for _ in range(20):
        drawn = control_draw(top, 4, gen)
        assert sorted(parse_head(h)[0] for h in drawn) == [3, 3, 5]
        assert not set(drawn) & set(top) and len(set(drawn)) == 3
    assert control_draw(["L0H0", "L0H1"], 2, gen) == []   # a layer with no other head gives none
    assert top_heads(torch.tensor([[0.1, 0.9], [0.5, float("nan")]]), 2) == ["L0H1", "L1H0"]


def _numbers(**change):
    n = {"loss_first_copy": 10.0, "loss_second_copy": 2.0,
         "top": {"prefix_matching": [{"head": "L5H1", "score": 0.6}], "previous_token": [{"head": "L2H0", "score": 0.8}],
                 "induction": [{"head": "L5H1", "score": 1.2}]},
         "causal": {"baseline_loss": 2.0, "by_k": [{"k": 2, "heads": ["L5H1", "L6H0"], "rise": 1.5,
                                                    "control_losses": [2.1, 2.2, 2.0], "control_rise_mean": 0.1,
                                                    "control_rise_std": 0.1}]}}
    for key, value in change.items():
        n[key] = value
    return n


def test_each_verdict_follows_its_numbers_and_turns_with_them():
    claims = induction_claims(_numbers())
    assert [c.holds for c in claims] == [True, True, True]
    assert "loss 10.00 nats on the first copy, 2.00 on the second (20% of it" in claims[0].verdict
    assert "the previous-token head is earlier (layer 2 < 5)" in claims[1].verdict
    assert "raises the second copy's loss by +1.500 nats; random heads of the same layers by +0.100 ± 0.100" in \
        claims[2].verdict and "more than the control's mean + 2 sd (+0.300)" in claims[2].verdict
    # the second copy no better than half the first: induction does not hold
    assert induction_claims(_numbers(loss_second_copy=6.0))[0].holds is False
    # the previous-token head later than the induction head: the composition claim fails
    late = _numbers()
    late["top"]["previous_token"] = [{"head": "L7H0", "score": 0.8}]
    assert induction_claims(late)[1].holds is False and "not earlier (layer 7 >= 5)" in induction_claims(late)[1].verdict
    # no head attends: nothing can be said of the order
    weak = _numbers()
    weak["top"]["prefix_matching"] = [{"head": "L5H1", "score": 0.1}]
    assert induction_claims(weak)[1].holds is None
    # the control hurts as much: not more than the control
    for rise, mean, std, holds in ((1.5, 1.4, 0.1, False), (0.35, 0.1, 0.1, True), (0.29, 0.1, 0.1, False),
                                   (-0.2, -0.5, 0.0, False)):
        n = copy.deepcopy(_numbers())
        n["causal"]["by_k"][0].update(rise=rise, control_rise_mean=mean, control_rise_std=std)
        assert induction_claims(n)[2].holds is holds, (rise, mean, std)
    n["causal"]["by_k"][0].update(rise=-0.2)
    assert "the top heads do not raise it at all" in induction_claims(n)[2].verdict




@pytest.mark.slow
def test_smollm2s_induction_heads_hurt_the_second_copy_more_than_random_heads(smollm2):
    model, tok = smollm2  # the built-in real model, imported once per session (tests/conftest.py)
    found = run_induction(model, tok, InductionOptions(batch=4, period=16, ks=(4,), draws=3), progress=False)
    row = found.numbers["causal"]["by_k"][0]
    assert found.numbers["loss_second_copy"] < 0.5 * found.numbers["loss_first_copy"]
    assert row["rise"] > row["control_rise_mean"] + 2 * row["control_rise_std"]
