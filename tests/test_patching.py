"""Activation patching, attribution patching and ablations: batched == one at a time == naive hooks."""
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


@pytest.mark.parametrize("later_hook, where", [("mlp_out", "everywhere"), ("resid_pre", "at p"), ("attn_out", "at p"),
                                               ("resid_pre", "at p + 3")])
def test_a_later_layer_site_in_a_local_sweep_equals_naive(later_hook, where):
    """Several sites at several layers in one local sweep (causal tracing's restorations): a site in the last
    block must see the positions it really acts on, in the read-position runs of patched_run too. The sweep
    restores resid_post of layer 0 at each position p and, in block 1, sets `later_hook` from a third run
    (everywhere, at p, or at p + 3: block 1's keys there, which the read-position runs may not take from the
    base run), against the naive definition: a full forward with plain hooks per patch (float64)."""
    from circuitlab.analysis.patching.engine import BaseRun, Site, sweep

    model = random_model("gpt2", dtype=torch.float64)  # 2 layers: block 1 is the last one
    clean, corrupt = prompts(pos=16)
    third = prompts(pos=16, seed=7)[0]
    metric = logit_diff([3, 4], [5, 6])                   # reads the last position only
    _, clean_cache = model.run_with_cache(clean)
    _, third_cache = model.run_with_cache(third)
    first, later = act_name("resid_post", 0), act_name(later_hook, 1)
    positions = torch.arange(1, 16)
    at = {"everywhere": None, "at p": positions, "at p + 3": (positions + 3).clamp(max=15)}[where]
    sites = [Site(first, clean_cache[first], (0,), positions[:, None], pos_dim=0),
             Site(later, third_cache[later], (), torch.zeros(len(positions), 0, dtype=torch.long), pos_dim=0)
             if at is None else Site(later, third_cache[later], (0,), at[:, None], pos_dim=0)]
    base, _ = BaseRun.of(model, corrupt)
    batched = sweep(model, base, 0, sites, metric, progress=False, positions=positions, local=True)
    single = sweep(model, base, 0, sites, metric, batch_size=1, progress=False, positions=positions, local=True)

    naive = torch.empty(len(positions), dtype=torch.float64)
    for i, p in enumerate(positions.tolist()):
        def restore(act, hook):
            act = act.clone()
            act[:, p] = clean_cache[first][:, p]
            return act

        def set_later(act, hook):
            act = act.clone()
            q = slice(None) if at is None else int(at[i])
            act[:, q] = third_cache[later][:, q]
            return act
        with torch.no_grad():
            naive[i] = float(metric(model.run_with_hooks(corrupt, fwd_hooks=[(first, restore), (later, set_later)])))
    torch.testing.assert_close(single, naive, atol=1e-9, rtol=0)
    torch.testing.assert_close(batched, naive, atol=1e-9, rtol=0)
    assert (naive - naive.mean()).abs().max() > 1e-3, "the patches must differ in effect, or the test is vacuous"


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


# ---------------------------------------------------------------- ablations


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
