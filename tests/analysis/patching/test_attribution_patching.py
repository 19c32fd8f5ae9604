"""Activation patching, attribution patching and ablations: batched == one at a time == naive hooks.

(Split out of the flat test_patching module, issue 38.)"""
import json

import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.analysis.patching.attribution_patching import attribution_patching, attribution_vs_patching
from circuitlab.analysis.patching import logit_diff, patching_sweep

from analysis.test_patching import SMALL, CONFIGS, random_model, prompts  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_attribution_patching_is_exact_for_a_linear_path():
    """No norms, a metric linear in the residual after the last layer: the linear estimate is exact there."""
    model = random_model("attn-only")
    clean, corrupt = prompts()
    metric = logit_diff([1, 2], [3, 4])
    est = attribution_patching(model, clean, corrupt, metric, ["resid_post", "attn_out"], layers=[1])
    real = patching_sweep(model, clean, corrupt, metric, ["resid_post", "attn_out"], layers=[1], progress=False)
    torch.testing.assert_close(est["resid_post"].values, real["resid_post"].values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(est["attn_out"].values, real["attn_out"].values, atol=1e-4, rtol=1e-4)


def test_attribution_patching_correlates_with_patching():
    model = random_model("gpt2")
    with torch.no_grad():  # gentler weights: attribution is a first-order estimate
        for p in model.parameters():
            p.mul_(0.5)
    clean, corrupt = prompts(batch=4, pos=8)
    metric = logit_diff([1, 2, 3, 4], [5, 6, 7, 8])
    check = attribution_vs_patching(model, clean, corrupt, metric, ["resid_pre", "head_out", "head_out_by_pos"],
                                    progress=False)
    assert set(check.correlation) == {"resid_pre", "head_out", "head_out_by_pos"}
    for t, r in check.correlation.items():
        assert r > 0.8, (t, r)
    json.dumps(check.to_dict())


def test_attribution_needs_a_differentiable_metric():
    model = random_model("gpt2")
    with pytest.raises(CircuitlabError, match="gradient"):
        attribution_patching(model, *prompts(), lambda logits: torch.tensor(1.0), "resid_pre")
