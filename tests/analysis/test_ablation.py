"""Activation patching, attribution patching and ablations: batched == one at a time == naive hooks.

(Split out of the flat test_patching module, issue 38.)"""
import json

import pytest
import torch

from circuitlab.analysis.ablation import ablate_and_measure, ablation_hooks, run_ablated
from circuitlab.analysis.patching import next_token_loss

from analysis.test_patching import SMALL, CONFIGS, random_model, prompts  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_zero_ablation_of_a_head_is_zeroing_its_z():
    model = random_model("gpt2")
    tokens, _ = prompts()

    def kill(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z
    expected = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", kill)])
    torch.testing.assert_close(run_ablated(model, tokens, ["L1H2"], "zero"), expected)


@pytest.mark.parametrize("kind, method", [("head", "mean"), ("neuron", "resample"), ("mlp", "zero"),
                                          ("layer", "mean"), ("attn", "resample")])
def test_ablate_and_measure_equals_one_ablation_at_a_time(kind, method):
    model = random_model("gpt2")
    tokens, reference = prompts(batch=2, pos=6)
    metric = next_token_loss(tokens)
    res = ablate_and_measure(model, tokens, metric, kind, method, reference, progress=False)
    count = {"head": 4, "neuron": 64}.get(kind)
    assert res.values.shape == ((2,) if count is None else (2, count))
    for l in range(2):
        for i in [None] if count is None else [0, count - 1]:
            comp = f"L{l}" + {"head": f"H{i}", "neuron": f"N{i}", "mlp": ".mlp", "attn": ".attn", "layer": ""}[kind]
            with torch.no_grad():
                one = float(metric(run_ablated(model, tokens, [comp], method, reference)))
            got = res.values[l] if i is None else res.values[l, i]
            assert float(got) == pytest.approx(one, abs=1e-5), comp
    assert res.change().abs().max() > 1e-4
    json.dumps(res.to_dict())


def test_a_block_without_mlp_is_its_attention():
    model = random_model("attn-only")
    tokens, _ = prompts()
    metric = next_token_loss(tokens)
    block = ablate_and_measure(model, tokens, metric, "layer", progress=False)
    attn = ablate_and_measure(model, tokens, metric, "attn", progress=False)
    torch.testing.assert_close(block.values, attn.values)


def test_mean_ablation_uses_the_reference_mean():
    model = random_model("gpt2")
    tokens, reference = prompts()
    _, cache = model.run_with_cache(reference, names_filter=["blocks.0.mlp.hook_post"])
    mean = cache["blocks.0.mlp.hook_post"].mean(dim=(0, 1))
    seen = {}
    hooks = ablation_hooks(model, ["L0N5"], "mean", reference)
    model.run_with_hooks(tokens, fwd_hooks=hooks + [("blocks.0.mlp.hook_post",
                                                      lambda x, hook: seen.setdefault("x", x.clone()))])
    torch.testing.assert_close(seen["x"][..., 5], mean[5].expand(2, 6))
