"""Head detectors and classification on a model whose heads were set by hand.

(Split out of the flat test_analysis_heads module, issue 38.)"""
import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.analysis.heads import (
    classify_heads,
    detect_heads,
    detection_masks,
    induction_test_tokens,
)

from analysis.test_heads import N, V, C, planted_model, planted  # noqa: F401 (shared with it)


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
