"""Activation patching, attribution patching and ablations: batched == one at a time == naive hooks.

(Split out of the flat test_patching module, issue 38.)"""
import pytest
import torch

from circuitlab.analysis.patching import logit_diff
from circuitlab.model.hooks import act_name

from analysis.test_patching import SMALL, CONFIGS, random_model, prompts  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


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
