"""The staggered (layer, position) sweep == the naive definition (a full forward per patch, the patch applied by a
plain hook) in float64, on GPT-2 style (learned positions) and LLaMA style (RoPE, grouped-query) models; and the
same test fails when the prefix reuse is wrong at the boundary: a patch entering one layer late, starting one
position late, or with the positions after it taken from the base run. The model's blocks run from a layer's
residual stream with the earlier positions' keys and values equal the full forward there (RoPE offsets right)."""
import pytest
import torch

import helpers

from circuitlab import ModelConfig
from circuitlab.analysis.patching.engine import BaseRun, Site, grid_index
from circuitlab.analysis.patching.grid import grid_sweep
from circuitlab.analysis.patching.work import full_grid, grid_flops, naive_flops, patch_flops
from circuitlab.model.components import LayerKV
from circuitlab.model.hooks import act_name

pytestmark = pytest.mark.usefixtures("one_thread")

L, B = 3, 2
T = 6  # one position per chunk; test_chunks_spanning_positions runs T = 16 (two per chunk)


def small_model(llama: bool):
    preset, extra = ("llama-tiny", {"n_kv_heads": 2}) if llama else ("gpt2-tiny", {})
    cfg = ModelConfig.from_preset(preset, n_layers=L, d_model=32, n_heads=4, d_mlp=64, d_vocab=40, n_ctx=16, **extra)
    return helpers.random_model(cfg, seed=0).double()


def weighted_logprob(logits):
    """Reads every position (no declared positions), each with its own weight: a change anywhere shows."""
    w = torch.arange(1, logits.shape[-2] + 1, dtype=logits.dtype)
    return float((logits.log_softmax(-1)[..., 3] * w).sum())


def last_logprob(logits):
    return float(logits[:, -1].log_softmax(-1)[:, 3].sum())


setattr(last_logprob, "positions", [-1])  # the shortcut that unembeds the read position only


def runs(model, T):
    gen = torch.Generator().manual_seed(5)
    clean, corrupt = torch.randint(0, 40, (B, T), generator=gen), torch.randint(0, 40, (B, T), generator=gen)
    names = [act_name(h, l) for h in ("resid_pre", "attn_out", "mlp_out") for l in range(L)]
    _, source = model.run_with_cache(clean, names_filter=names)
    base, _ = BaseRun.of(model, corrupt)
    return corrupt, source, base


def naive(model, corrupt, source, hook, metric):
    """[layer, pos]: one full forward of the corrupted prompts per patch, act[:, p] set to the clean one's."""
    T = corrupt.shape[1]
    out = torch.empty(L, T, dtype=torch.float64)
    for l in range(L):
        for p in range(T):
            def patch(act, hook, p=p):
                act = act.clone()
                act[:, p] = source[hook.name][:, p]
                return act
            with torch.no_grad():
                out[l, p] = metric(model.run_with_hooks(corrupt, fwd_hooks=[(act_name(hook, l), patch)]))
    return out


def staggered(model, base, source, hook, metric, local, layer_shift=0, pos_shift=0, batch_size=None):
    """grid_sweep over every (layer, position) of `hook`; the shifts plant an off-by-one in where patches start."""
    T = base.logits.shape[1]
    layers, positions = (torch.tensor(x) for x in full_grid(L, T))
    index = positions[:, None]
    sites = [Site(act_name(hook, l), source[act_name(hook, l)], (0,), index, pos_dim=0, active=layers == l)
             for l in range(L)]
    entry = (layers + layer_shift).clamp(max=L - 1)
    start = (positions + pos_shift).clamp(max=T - 1)
    return grid_sweep(model, base, sites, metric, entry, start, local, batch_size, progress=False).view(L, T)


@pytest.mark.parametrize("llama", [False, True])
@pytest.mark.parametrize("metric", [weighted_logprob, last_logprob])
def test_staggered_sweep_equals_the_naive_one_and_an_off_by_one_fails(llama, metric):
    check_against_naive(small_model(llama), metric)


def test_chunks_spanning_positions():
    """At 16 positions a chunk holds patches at two positions, run from the first (the local window is two
    wide): still the naive values, and the off-by-ones still caught."""
    check_against_naive(small_model(True), weighted_logprob, 16)


def check_against_naive(model, metric, T=T):
    corrupt, source, base = runs(model, T)
    for hook, local in (("resid_pre", False), ("attn_out", True), ("mlp_out", True)):
        want = naive(model, corrupt, source, hook, metric)
        assert (want - metric(base.logits)).abs().max() > 1e-3, hook  # the patches matter (not vacuous)
        for batch_size in (None, 1, 4):
            got = staggered(model, base, source, hook, metric, local, batch_size=batch_size)
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"{hook} batch {batch_size}")
        # Mutations at the boundary: each must move some (layer, position) well away from the definition.
        late_layer = staggered(model, base, source, hook, metric, local, layer_shift=1)   # skips the patched layer
        late_pos = staggered(model, base, source, hook, metric, local, pos_shift=1)       # skips the patched position
        assert (late_layer - want)[:L - 1].abs().max() > 1e-4, hook
        assert (late_pos - want)[:, :T - 1].abs().max() > 1e-4, hook
        if not local:  # the positions after the patch taken from the base run at its layer: later queries lose it
            window = staggered(model, base, source, hook, metric, True)
            assert (window - want)[:L - 1].abs().max() > 1e-4, hook


@pytest.mark.parametrize("llama", [False, True])
def test_blocks_from_a_layer_with_the_earlier_keys_and_values_equal_the_full_forward(llama):
    """The model's own entry point the sweeps use: block l on resid_pre[l][:, t:] with layer l's keys and values
    of positions < t (LayerKV) gives resid_post[l][:, t:]; with one cached position too few, RoPE (or learned
    positions, which enter with the residual stream: then the keys are missing) puts them in the wrong place."""
    model = small_model(llama)
    tokens = torch.randint(0, 40, (B, T), generator=torch.Generator().manual_seed(2))
    base, cache = BaseRun.of(model, tokens, [act_name("resid_post", l) for l in range(L)])
    with torch.no_grad():
        for l in range(L):
            for t in range(T):
                kv = LayerKV()
                if t:
                    kv.append(base.keys[l][:, :t], base.values[l][:, :t])
                got = model.blocks[l](base.resid[l][:, t:], kv)
                torch.testing.assert_close(got, cache["resid_post", l][:, t:], atol=1e-12, rtol=0)
                if t >= 2:
                    short = LayerKV()
                    short.append(base.keys[l][:, :t - 1], base.values[l][:, :t - 1])
                    wrong = model.blocks[l](base.resid[l][:, t:], short)
                    assert (wrong - cache["resid_post", l][:, t:]).abs().max() > 1e-6


def test_the_work_counted_from_the_shapes():
    """patch_flops of a patch at layer 0, position 0, unembedded everywhere is the naive forward; a full
    (layer, position) grid read at one position is about a quarter of the naive sweep on a 30-layer model."""
    cfg = ModelConfig.from_preset("llama-tiny", n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_mlp=1536,
                                  d_vocab=49152, n_ctx=64)
    assert patch_flops(cfg, 34, 0, 0, reads=None) == pytest.approx(naive_flops(cfg, 34))
    layers, positions = full_grid(30, 34)
    share = grid_flops(cfg, 34, layers, positions) / (len(layers) * naive_flops(cfg, 34))
    assert 0.2 < share < 0.3
    assert grid_flops(cfg, 34, layers, positions, local=True) < grid_flops(cfg, 34, layers, positions)
    # a later start or layer is less work; a patch at the last layer and position is one block at one position
    assert patch_flops(cfg, 34, 29, 33) < patch_flops(cfg, 34, 29, 0) < patch_flops(cfg, 34, 0, 0)
    assert grid_index([2, 3]).shape == (6, 2)
