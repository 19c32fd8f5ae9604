"""Activation patching, attribution patching and ablations: batched == one at a time == naive hooks.

(Its tests of other modules moved with issue 38: tests/analysis/patching/test_attribution_patching.py,
tests/analysis/patching/test_engine.py, tests/analysis/patching/test_metrics.py,
tests/analysis/test_ablation.py.)"""
import itertools
import json

import pytest
import torch

import helpers

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.ablation import Component, ablate_and_measure, ablation_hooks, parse_component, run_ablated
from circuitlab.analysis.patching.attribution_patching import attribution_patching, attribution_vs_patching
from circuitlab.analysis.patching import (TARGETS, activation_patching, available_targets, kl_to_clean, logit_diff,
                                          logprob, next_token_loss, normalized_metric, patching_sweep)
from circuitlab.model.hooks import act_name


pytestmark = pytest.mark.usefixtures("one_thread")


SMALL = dict(d_vocab=40, n_ctx=16)
CONFIGS = {
    "gpt2": ModelConfig.from_preset("gpt2-tiny", d_model=32, n_heads=4, d_mlp=64, **SMALL),
    "llama-gqa": ModelConfig.from_preset("llama-tiny", d_model=32, n_heads=4, n_kv_heads=2, d_mlp=64, **SMALL),
    "attn-only": ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=4, **SMALL),
}


def random_model(name: str, seed: int = 0, dtype=torch.float32) -> Transformer:
    return helpers.random_model(CONFIGS[name], seed).to(dtype)


def prompts(batch=2, pos=6, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 40, (batch, pos), generator=gen), torch.randint(0, 40, (batch, pos), generator=gen)


def naive_patching(model, clean, corrupt, metric, target):
    """One full forward per patch with a plain hook: the definition, with no batching or shortcuts."""
    t = TARGETS[target]
    _, cache = model.run_with_cache(clean)
    per_layer = []
    for l in range(model.cfg.n_layers):
        hook = act_name(t.hook, l)
        src = cache[hook]
        sizes = [src.shape[1 + d] for d in t.dims]
        values = torch.empty(sizes, dtype=torch.float64)
        for idx in itertools.product(*map(range, sizes)):
            sel = [slice(None)] * src.dim()
            for d, i in zip(t.dims, idx):
                sel[1 + d] = i

            def fn(act, hook, sel=tuple(sel)):
                act = act.clone()
                act[sel] = src[sel]
                return act
            with torch.no_grad():
                values[idx] = float(metric(model.run_with_hooks(corrupt, fwd_hooks=[(hook, fn)])))
        per_layer.append(values)
    return torch.stack(per_layer)


# ---------------------------------------------------------------- activation patching


def mean_logprob_of_3(logits):  # reads every position (and declares none)
    return logits.log_softmax(-1)[..., 3].mean()


@pytest.mark.parametrize("arch, targets, metric", [
    ("gpt2", ["resid_pre", "resid_mid", "attn_out", "mlp_out", "head_out_by_pos", "pattern_by_pos", "v"],
     logit_diff([3, 4], [5, 6], pos=[-1, 2])),
    ("gpt2", ["resid_pre", "mlp_out", "head_out_by_pos", "pattern_by_pos", "v_by_pos"], mean_logprob_of_3),
    ("llama-gqa", ["k_by_pos", "q", "head_out", "pattern", "resid_post"], logit_diff([3, 4], [5, 6])),
])
def test_batched_equals_one_at_a_time_equals_naive(arch, targets, metric):
    """The engine skips what it can (earlier layers and positions, other positions of a block whose
    output changes at one place, unread logits); none of it may change a number."""
    # float64 so that "equal" can be tested to 1e-10: batching changes nothing but rounding.
    model = random_model(arch, dtype=torch.float64)
    clean, corrupt = prompts(pos=16)  # chunks then span 2 positions (n_pos // 8)
    batched = patching_sweep(model, clean, corrupt, metric, targets, progress=False)
    single = patching_sweep(model, clean, corrupt, metric, targets, batch_size=1, progress=False)
    chunks_of_3 = patching_sweep(model, clean, corrupt, metric, targets, batch_size=3, progress=False)
    for t in targets:
        naive = naive_patching(model, clean, corrupt, metric, t)
        assert batched[t].values.shape == naive.shape, t
        torch.testing.assert_close(batched[t].values.double(), single[t].values.double(), atol=1e-10, rtol=0)
        torch.testing.assert_close(chunks_of_3[t].values.double(), single[t].values.double(), atol=1e-10, rtol=0)
        torch.testing.assert_close(batched[t].values.double(), naive, atol=1e-9, rtol=0)
        assert batched[t].effect().abs().max() > 1e-3, f"{t}: no patch had any effect, the test would be vacuous"


def test_a_metric_reading_undeclared_positions_gets_nan():
    model = random_model("gpt2")
    honest = logit_diff(1, 2, pos=-1)
    liar = logit_diff(1, 2, pos=-2)
    liar.positions = [-1]
    assert activation_patching(model, *prompts(), honest, "head_out_by_pos", progress=False).values.isfinite().all()
    assert activation_patching(model, *prompts(), liar, "head_out_by_pos", progress=False).values.isnan().any()


def test_gqa_k_and_v_sweep_kv_heads():
    model = random_model("llama-gqa")
    res = activation_patching(model, *prompts(), logit_diff(1, 2), "v", progress=False)
    assert res.values.shape == (2, 2)  # [layer, kv_head]
    assert res.axes == ("head",)


def test_endpoints_and_recovery():
    """Patching the whole residual stream at the last layer's input, at every position, is the clean run."""
    model = random_model("gpt2")
    clean, corrupt = prompts(batch=1, pos=5)
    metric = logit_diff(7, 9)
    res = activation_patching(model, clean, corrupt, metric, "resid_pre", progress=False)
    with torch.no_grad():
        assert res.clean_value == pytest.approx(float(metric(model(clean))), abs=1e-5)
        assert res.corrupt_value == pytest.approx(float(metric(model(corrupt))), abs=1e-5)
    # The prompts differ at position 2 only: restoring it at layer 0 restores everything, and no
    # earlier position (causal attention) nor any layer-0 position but 2 (same tokens) can do anything.
    corrupt1 = clean.clone()
    corrupt1[0, 2] = (clean[0, 2] + 1) % 40
    res = activation_patching(model, clean, corrupt1, metric, "resid_pre", progress=False)
    rec = res.recovery()  # [layer, pos]
    assert float(rec[0, 2]) == pytest.approx(1.0, abs=1e-4)
    assert rec[:, :2].abs().max() < 1e-4 and rec[0, 3:].abs().max() < 1e-4
    noised = activation_patching(model, clean, corrupt1, metric, "resid_pre", direction="noise", progress=False)
    assert float(noised.recovery()[0, 2]) == pytest.approx(0.0, abs=1e-4)
    assert noised.base_value == noised.clean_value


def test_result_is_json_and_model_untouched():
    model = random_model("gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    clean, corrupt = prompts()
    res = patching_sweep(model, clean, corrupt, logit_diff(1, 2), available_targets(model), progress=False)
    attribution_patching(model, clean, corrupt, logit_diff(1, 2), available_targets(model))
    ablate_and_measure(model, clean, logit_diff(1, 2), "head", "mean", reference=corrupt, progress=False)
    for r in res.values():
        json.dumps(r.to_dict())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not any(hp.active for hp in model.hook_points().values())


# ---------------------------------------------------------------- attribution patching


# ---------------------------------------------------------------- ablations


# ---------------------------------------------------------------- bad input


class CountForwards:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(lambda *a: setattr(self, "n", self.n + 1))


def test_bad_input_fails_before_any_forward_pass():
    model = random_model("attn-only")
    counter = CountForwards(model)
    clean, corrupt = prompts()
    with pytest.raises(CircuitlabError, match=r"same shape.*\[2, 6\].*\[2, 5\]"):
        activation_patching(model, clean, corrupt[:, :5], logit_diff(1, 2))
    with pytest.raises(CircuitlabError, match=r"scalar.*\[2, 6, 40\]"):
        activation_patching(model, clean, corrupt, lambda logits: logits[:, -1, 0])
    with pytest.raises(CircuitlabError, match="unknown patching target 'head_outt'.*closest: head_out"):
        activation_patching(model, clean, corrupt, logit_diff(1, 2), "head_outt")
    with pytest.raises(CircuitlabError, match="mlp_out.*attention-only"):
        activation_patching(model, clean, corrupt, logit_diff(1, 2), "mlp_out")
    with pytest.raises(CircuitlabError, match="out of range"):
        activation_patching(model, clean, corrupt, logit_diff(1, 2), layers=[5])
    with pytest.raises(CircuitlabError, match="outside the vocabulary"):
        activation_patching(model, clean + 100, corrupt, logit_diff(1, 2))
    with pytest.raises(CircuitlabError, match="failed on logits"):
        activation_patching(model, clean, corrupt, logit_diff(1000, 2))
    with pytest.raises(CircuitlabError, match="direction"):
        activation_patching(model, clean, corrupt, logit_diff(1, 2), direction="sideways")
    with pytest.raises(CircuitlabError, match=r"same shape"):
        attribution_patching(model, clean, corrupt[:1], logit_diff(1, 2))
    with pytest.raises(CircuitlabError, match="scalar"):
        ablate_and_measure(model, clean, lambda logits: logits.sum(-1))
    with pytest.raises(CircuitlabError, match="attention-only"):
        ablate_and_measure(model, clean, logit_diff(1, 2), "neuron")
    with pytest.raises(CircuitlabError, match="needs reference tokens"):
        ablate_and_measure(model, clean, logit_diff(1, 2), "head", "mean")
    with pytest.raises(CircuitlabError, match="reference needs 6 positions"):
        ablate_and_measure(model, clean, logit_diff(1, 2), "head", "resample", reference=corrupt[:, :4])
    for spec, msg in [("L9H0", "layer 9 out of range"), ("L0H7", "index 7 out of range"), ("head3", "cannot read")]:
        with pytest.raises(CircuitlabError, match=msg):
            parse_component(model, spec)
    with pytest.raises(CircuitlabError, match="index None out of range"):  # a head needs its index
        parse_component(model, Component("head", 0))
    assert counter.n == 0
