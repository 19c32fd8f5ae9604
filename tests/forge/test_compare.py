"""Forge: the builder API, the hand-built heads, the adders (exhaustively), the comparison functions, the CLI.

(Split out of the flat test_forge module, issue 38.)"""
import copy
import math

import pytest
import torch

from circuitlab import CircuitlabError, Transformer
from circuitlab.forge import EOS, attention_agreement, build_carry_adder, build_post_adder, compare_adders, ov_alignment, principal_angles
from circuitlab.forge.compare import ov_subspace, used_heads


def perturbed(model, relative=0.0, additive=0.0, seed=0):
    """A copy with every weight w -> w·(1 + relative·ε) + additive·ε' (ε, ε' standard normal)."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.mul_(1 + relative * torch.randn(p.shape, generator=g)).add_(additive * torch.randn(p.shape, generator=g))
    return out


# ---------------------------------------------------------------- comparison
def test_principal_angles_known_cases():
    e = torch.eye(4, dtype=torch.float64)
    assert principal_angles(e[:, :2], e[:, :2]).abs().max() < 1e-6
    torch.testing.assert_close(principal_angles(e[:, :1], e[:, 1:2]), torch.tensor([math.pi / 2], dtype=torch.float64))
    diag = (e[:, :1] + e[:, 1:2]) / math.sqrt(2)
    torch.testing.assert_close(principal_angles(diag, e[:, :1]), torch.tensor([math.pi / 4], dtype=torch.float64))
    assert principal_angles(e[:, :2], e[:, :0]).numel() == 0


def test_comparison_of_hand_built_with_itself_and_perturbed_copies():
    hand = build_carry_adder(2, 2)
    assert used_heads(hand.model) == [(0, 0), (0, 1), (1, 0)]          # L1H1 is left all zero
    same = compare_adders(hand, perturbed(hand.model, relative=1e-4), samples=200)
    assert same.accuracy_hand == same.accuracy_other == 1.0
    for match in same.matches:
        assert match["hand_head"] == match["other_head"] and match["agreement"] > 0.99
    ov = {m["hand_head"]: m["ov_input"] for m in same.matches}
    assert ov["L0H0"]["similarity"] > 0.999 and ov["L0H0"]["rank_a"] == 1   # reads the digit value
    assert ov["L1H0"]["similarity"] is None                                    # reads no token feature directly
    broken = compare_adders(hand, perturbed(hand.model, additive=0.05), samples=200)
    assert broken.accuracy_other < 0.5
    assert sum(m["agreement"] for m in broken.matches) / len(broken.matches) < 0.8
    # a random model of the same shape: low attention agreement, OV subspaces not aligned
    torch.manual_seed(0)
    random_model = Transformer(hand.model.cfg)
    tokens = torch.tensor([[1, 7, 2, 5, EOS, 0, 4], [9, 9, 0, 1, EOS, 1, 0]])
    agree = attention_agreement(hand.model, random_model, tokens, query_positions=range(4, 7),
                                heads_a=[(0, 0), (1, 0)])
    assert agree.agreement.max() < 0.5 and agree.agreement.shape == (2, 4)
    assert ov_alignment(hand.model, (0, 0), random_model, (0, 0)).similarity < 0.9
    res = ov_alignment(hand.model, (1, 0), perturbed(hand.model, relative=1e-4), (1, 0), basis="residual")
    assert res.rank_a == res.rank_b == 1 and res.similarity > 0.999
    assert "agreement" in same.to_dict() and same.to_dict()["matches"][0]["ov_input"]["basis"] == "token"


def test_comparison_errors():
    hand = build_carry_adder(2, 2)
    with pytest.raises(CircuitlabError, match="reads its answer off the residual"):
        compare_adders(build_post_adder(), hand.model)
    with pytest.raises(CircuitlabError, match="does not exist"):
        ov_subspace(hand.model, (2, 0))
    with pytest.raises(CircuitlabError, match="same d_model"):
        ov_alignment(hand.model, (0, 0), build_carry_adder(3, 3).model, (0, 0), basis="residual")
