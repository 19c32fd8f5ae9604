"""Estimates said before the work (circuitlab.memory.Estimate), one beside each long method: activation and path
patching, EAP / EAP-IG / exact edge scoring, the tuned lens, input attribution, steering, run_with_cache. Each is
within 30 % of the measured peak on a shape where the method's own memory dominates, scales with the work, and
`--estimate` prints it and stops without writing anything."""
import sys

import pytest
import torch

from circuitlab import ModelConfig, Transformer, memory
import helpers
from helpers import fresh_process_json
from circuitlab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

# Shapes whose vocabulary or width make each method's own memory (logits, cached runs, reader inputs) large
# against the allocator's slack (memory freed and reused inside the method moves a peak by ~30 MiB): 200-600 MiB.
WIDE = dict(n_layers=2, d_model=128, n_heads=4, d_mlp=512, n_ctx=64, d_vocab=50257)
DEEP = dict(n_layers=4, d_model=512, n_heads=8, d_mlp=2048, n_ctx=64, d_vocab=8192)   # EAP: the readers dominate


def _model(**changes) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("gpt2-tiny", **{**WIDE, **changes})).eval()


# Run in a fresh process: the method's peak is VmHWM after clearing it, less the resident memory before (memory
# freed by earlier tests would stay in the allocator's arenas and hide part of the peak).
PEAK = """
import json, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, 'tests')
from contracts.test_estimates import _model, METHODS
model = _model(**SHAPE)
tokens = torch.randint(0, model.cfg.d_vocab, (BATCH, 64), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(tokens[:, :2])
est, run = METHODS['NAME'](model, tokens)
def rss(field):
    for line in open('/proc/self/status'):
        if line.startswith(field + ':'):
            return int(line.split()[1]) * 1024
open('/proc/self/clear_refs', 'w').write('5')
before = rss('VmRSS')
run()
print(json.dumps([est.peak_bytes, rss('VmHWM') - before, est.line()]))
"""


def _patching(model, tokens):
    from circuitlab.analysis.patching import activation_patching, logit_diff, sweep_estimate

    return (sweep_estimate(model, *tokens.shape, ["resid_pre"]),
            lambda: activation_patching(model, tokens, tokens.roll(1, 1), logit_diff(1, 2), "resid_pre",
                                        progress=False))


def _eap(model, tokens):
    from circuitlab.analysis.edges.scoring import edge_estimate, edge_scores
    from circuitlab.analysis.patching import logit_diff

    return (edge_estimate(model, *tokens.shape, method="eap"),
            lambda: edge_scores(model, tokens, tokens.roll(1, 1), logit_diff(1, 2), method="eap", progress=False))


def _lens(model, tokens):
    from circuitlab.analysis.lens.tuned import lens_estimate, train_tuned_lens

    return lens_estimate(model, *tokens.shape, steps=2), lambda: train_tuned_lens(model, tokens, steps=2)


def _cache(model, tokens):
    from circuitlab.model.transformer import cache_estimate

    return cache_estimate(model, *tokens.shape), lambda: model.run_with_cache(tokens)


METHODS = {"patching": _patching, "eap": _eap, "tuned_lens": _lens, "run_with_cache": _cache}


@pytest.mark.parametrize("name,batch,shape", [("patching", 2, {}), ("eap", 4, DEEP), ("tuned_lens", 4, {}),
                                              ("run_with_cache", 16, {})])
def test_the_estimate_is_within_30_percent_of_the_measured_peak(name, batch, shape):
    if not sys.platform.startswith("linux"):
        pytest.skip("resident memory is read from /proc")
    code = PEAK.replace("NAME", name).replace("BATCH", str(batch)).replace("SHAPE", repr(shape))
    estimate, peak, line = fresh_process_json(code)
    assert peak > 150 * 2**20, (name, peak)      # the method's own memory, not the allocator's slack
    print(f"{name}: estimate {estimate / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB ({estimate / peak:.2f})")
    assert 0.7 * peak <= estimate <= 1.3 * peak, (name, estimate / peak, line)


def test_the_patching_estimate_counts_what_the_sweep_holds():
    """The base run and the source activations are exactly the tensors the sweep caches; the chunk is at least the
    metric's logits buffer of the largest chunk the engine makes."""
    from circuitlab.analysis.patching import BaseRun, sweep_estimate

    model = _model(d_vocab=500)
    tokens = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    est = sweep_estimate(model, 2, 24, ["resid_pre", "head_out"])
    base, _ = BaseRun.of(model, tokens)
    held = sum(t.numel() * 4 for t in [*base.resid, *base.keys, *base.values, base.logits])
    assert est.parts["base run"] == held
    _, cache = model.run_with_cache(tokens, names_filter=[f"blocks.{l}.{h}" for l in range(2)
                                                          for h in ("hook_resid_pre", "attn.hook_z")])
    assert est.parts["source activations"] == sum(t.numel() * 4 for t in cache.values())
    span = 24 // 8    # resid_pre: a chunk holds the patches of `span` positions; head_out: every head
    assert est.parts["a chunk of patched runs"] >= max(span, model.cfg.n_heads) * 2 * 24 * 500 * 4


def test_estimates_grow_with_the_work():
    from circuitlab.analysis.edges.scoring import edge_estimate
    from circuitlab.analysis.input_attribution import attribution_estimate
    from circuitlab.analysis.lens.tuned import lens_estimate
    from circuitlab.analysis.patching import sweep_estimate
    from circuitlab.analysis.patching.path import path_patching_estimate
    from circuitlab.analysis.steering import steer_estimate
    from circuitlab.model.transformer import cache_estimate

    model = _model(d_vocab=300, n_layers=3)
    pairs = [(lambda n: sweep_estimate(model, 1, n)), (lambda n: path_patching_estimate(model, 1, n)),
             (lambda n: edge_estimate(model, 1, n, "eap")), (lambda n: edge_estimate(model, n // 8, 16, "eap-ig")),
             (lambda n: lens_estimate(model, n, 16)), (lambda n: attribution_estimate(model, n, "ig")),
             (lambda n: steer_estimate(model, n, 4, 8, 2, 100)), (lambda n: cache_estimate(model, 1, n))]
    for make in pairs:
        small, large = make(16), make(32)
        assert large.peak_bytes > small.peak_bytes and large.flops > small.flops, (small.line(), large.line())
        assert small.held == memory.tensor_bytes(model)
    # EAP-IG's path points run in chunks of copies: more points, more time, not more memory once a chunk is full
    few, many = edge_estimate(model, 1, 16, "eap-ig", steps=5, batch_size=2), edge_estimate(model, 1, 16, "eap-ig",
                                                                                            steps=50, batch_size=2)
    assert few.peak_bytes == many.peak_bytes and many.flops > 5 * few.flops
    # the run_with_cache estimate is the cache itself: every hook at this length
    tokens = torch.zeros(2, 20, dtype=torch.long)
    _, cache = model.run_with_cache(tokens)
    assert cache_estimate(model, 2, 20).parts["cache"] == sum(t.numel() * t.element_size() for t in cache.values())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    where = tmp_path_factory.mktemp("estimates")
    helpers.save_char_checkpoint(where / "model", n_layers=2, d_model=32, n_ctx=64)
    (where / "pos.txt").write_text("the dragon flew\na dragon roared\n")
    (where / "neg.txt").write_text("the cat sat\na cat purred\n")
    return where


@pytest.mark.parametrize("command,what", [
    (["circuit", "--task", "induction", "--method", "eap-ig"], "estimate: EAP-IG ("),
    (["circuit", "--task", "induction", "--method", "exact"], "estimate: exact edge patching ("),
    (["lens", "train", "--steps", "50"], "estimate: tuned lens training (50 steps of 16 x 64 tokens"),
    (["steer", "--positive", "{d}/pos.txt", "--negative", "{d}/neg.txt", "--layer", "1"], "estimate: steering (4 coefficients, 8 generations"),
    (["attribute", "--prompt", "Lily saw a cat", "--method", "ig"], "estimate: input attribution (ig, 32 rows"),
])
def test_estimate_option_prints_one_line_and_writes_nothing(ckpt, capsys, command, what):
    out = ckpt / "out"
    args = [a.replace("{d}", str(ckpt)) for a in command]
    assert main([*args[:2 if args[0] == "lens" else 1], "--checkpoint", str(ckpt / "model"),
                 *args[2 if args[0] == "lens" else 1:], "--out", str(out / ("a.json" if args[0] == "attribute" else "")),
                 "--estimate"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(what) and "at its peak" in lines[0] and "GFLOP/s" in lines[0], lines
    assert not out.exists() and not (ckpt / "model" / "tuned_lens").exists()


def test_memory_larger_than_the_machine_is_one_line_on_every_command(ckpt, capsys):
    too_much = f"{memory.machine_bytes() // 2**30 + 8}G"
    for command in (["circuit", "--task", "induction"], ["steer", "--positive", "x", "--negative", "y", "--layer", "0"],
                    ["attribute", "--prompt", "Lily"], ["interpret"]):
        with pytest.raises(SystemExit) as e:
            main([command[0], "--checkpoint", str(ckpt / "model"), *command[1:], "--memory", too_much])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and "more than this machine's memory" in err and len(err.splitlines()) == 1, err
    with pytest.raises(SystemExit):
        main(["lens", "train", "--checkpoint", str(ckpt / "model"), "--memory", too_much])
    assert "more than this machine's memory" in capsys.readouterr().err


def test_a_budget_too_small_for_the_keys_and_values_refuses_in_one_line(ckpt, capsys):
    """steer's samples are one generation batch: its keys and values are a pass's share of the budget."""
    args = ["steer", "--checkpoint", str(ckpt / "model"), "--positive", str(ckpt / "pos.txt"), "--negative",
            str(ckpt / "neg.txt"), "--layer", "0", "--samples", "1024", "--no-progress", "--memory", "4M"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "keys and values of 1024 generations" in err and "give at most" in err and len(err.splitlines()) == 1


def test_a_dtype_the_device_cannot_compute_in_is_one_line(monkeypatch, capsys, tmp_path):
    import torch.nn.functional as F

    from circuitlab.model import storage

    real = F.linear

    def no_half(x, w, b=None):  # a device without float16 kernels
        if x.dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return real(x, w, b)

    monkeypatch.setattr(storage, "_CHECKED", {})
    monkeypatch.setattr(storage.F, "linear", no_half)
    out = tmp_path / "g"
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", str(out), "--dtype", "float16",
                 "--compute-dtype", "float16", "--dashboard-tokens", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot compute in float16" in err and len(err.splitlines()) == 1 and not out.exists(), err
