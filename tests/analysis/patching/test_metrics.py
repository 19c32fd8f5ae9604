"""Activation patching, attribution patching and ablations: batched == one at a time == naive hooks.

(Split out of the flat test_patching module, issue 38.)"""
import pytest
import torch

from circuitlab import CircuitlabError, Transformer
from circuitlab.analysis.patching import activation_patching, kl_to_clean, logit_diff, logprob, next_token_loss, normalized_metric

from analysis.test_patching import SMALL, CONFIGS, prompts  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_metrics():
    logits = torch.randn(2, 3, 5)
    assert float(logit_diff([1, 2], 0)(logits)) == pytest.approx(
        float(((logits[0, -1, 1] - logits[0, -1, 0]) + (logits[1, -1, 2] - logits[1, -1, 0])) / 2))
    assert float(logprob(3, pos=1)(logits)) == pytest.approx(float(logits[:, 1].log_softmax(-1)[:, 3].mean()))
    assert float(kl_to_clean(logits)(logits)) == pytest.approx(0.0, abs=1e-6)
    assert float(kl_to_clean(logits)(torch.randn(2, 3, 5))) > 0
    tokens = torch.randint(0, 5, (2, 3))
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert float(next_token_loss(tokens)(logits)) == pytest.approx(float(expected), abs=1e-6)
    norm = normalized_metric(logit_diff(1, 0), clean_value=2.0, corrupt_value=-1.0)
    assert float(norm(logits)) == pytest.approx((float(logit_diff(1, 0)(logits)) + 1.0) / 3.0)
    with pytest.raises(CircuitlabError, match="nothing to recover"):
        normalized_metric(logit_diff(1, 0), 1.0, 1.0)


def test_a_gap_within_noise_is_flagged_and_its_recoveries_called_meaningless():
    """Rule (patching.metrics.GAP_FLOOR / gap_noise): |clean - corrupted| below max(0.1, 2 standard errors of
    the per-prompt gaps) means the recovery fractions mean nothing."""
    from circuitlab.analysis.patching import GAP_FLOOR, gap_noise, gap_within_noise

    torch.manual_seed(0)
    flat = Transformer(CONFIGS["gpt2"])
    with torch.no_grad():
        for p in flat.parameters():
            p.mul_(0.1)  # logits nearly uniform: a corruption of the first token barely moves them
    clean, other = prompts(batch=8)
    corrupt = torch.cat([other[:, :1], clean[:, 1:]], dim=1)
    res = activation_patching(flat, clean, corrupt, logprob(3), "head_out", progress=False)
    assert abs(res.clean_value - res.corrupt_value) < GAP_FLOOR and res.gap_within_noise
    assert "within noise" in res.noise_note() and res.to_dict()["gap_within_noise"] is True
    from tiny_trained import HALF, induction_model, repeated_batch

    gen = torch.Generator().manual_seed(5)
    repeated, fresh = repeated_batch(8, gen), repeated_batch(8, gen)
    first_half_changed = torch.cat([fresh[:, :HALF], repeated[:, HALF:]], dim=1)
    answer = logprob(repeated[:, -1], pos=-2)  # the induction answer: predictable only when the halves match
    sharp = activation_patching(induction_model(), repeated, first_half_changed, answer, "head_out", progress=False)
    assert abs(sharp.clean_value - sharp.corrupt_value) > 1 and not sharp.gap_within_noise
    assert sharp.noise_note() is None and 0 < sharp.gap_noise < abs(sharp.clean_value - sharp.corrupt_value)
    # A mean gap above the floor whose prompts disagree in sign is within two standard errors: noise.
    logits_clean, logits_corrupt = torch.zeros(2, 1, 4), torch.zeros(2, 1, 4)
    logits_clean[0, 0, 0], logits_clean[1, 0, 1] = 2.0, 1.6  # per-row logit diff 0-1: +2.0, -1.6 (mean +0.2)
    noise = gap_noise(logit_diff(0, 1), logits_clean, logits_corrupt)
    assert noise == pytest.approx(2 * torch.tensor([2.0, -1.6]).std().item() / 2 ** 0.5)
    assert gap_within_noise(0.2, 0.0, noise) and not gap_within_noise(0.2, 0.0, 0.0)
