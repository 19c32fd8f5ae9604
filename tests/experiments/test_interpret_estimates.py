"""`interpret --estimate` on the real model (SmolLM2-135M-Instruct, 30 layers): each experiment's printed estimate
against the time it takes. One thread and process CPU time, so other processes on the machine do not count; the
bounds (3x either way) catch an estimate that is off by 10x, as heads' and circuits' were (0.2 s against minutes).
The narrowed sweeps run in seconds (fast); heads and circuits at their defaults take a minute or two each (slow)."""
import time

import pytest

from circuitlab.methods import REGISTRY
from circuitlab.perf import matmul_gflops

pytestmark = pytest.mark.usefixtures("one_thread")

NARROWED = {   # each a sweep cut to a corner of the real model's grid, a few seconds of work
    "causal_tracing": {"trace_kinds": ["hidden", "mlp"], "trace_layers": [27, 29], "trace_positions": [-2, -1],
                       "noise_samples": 2},
    "patching": {"patch_targets": ["resid_pre", "head_out"], "patch_layers": [28, 29], "path_patching": False},
    "ablation": {"ablation_layers": [29], "mlp_ablation": False},
}


def measured_against_estimate(smollm2, name: str, given: dict, tmp_path) -> tuple[float, float]:
    """(CPU seconds the experiment took, its estimate's seconds at the speed measured just before)."""
    model, tokenizer = smollm2
    m = REGISTRY[name]
    options, inputs = m.options_from(given), m.inputs_from({"progress": False} if "progress" in m.inputs else {})
    estimate = m.estimate(model, tokenizer, options, **inputs).timed(matmul_gflops(seconds=0.5)).seconds()
    start = time.process_time()
    m.run(model, tokenizer, tmp_path, options, **inputs)
    return time.process_time() - start, estimate


@pytest.mark.parametrize("name", list(NARROWED))
def test_a_narrowed_sweeps_estimate_holds_on_the_real_model(smollm2, name, tmp_path):
    took, estimate = measured_against_estimate(smollm2, name, NARROWED[name], tmp_path)
    assert estimate / 3 < took < 3 * estimate, (name, took, estimate)


def test_the_narrowed_estimates_count_what_the_options_leave_out(smollm2):
    """The estimate follows the options: the narrowed sweeps are estimated at a small share of the defaults."""
    model, tokenizer = smollm2
    for name, given in NARROWED.items():
        m = REGISTRY[name]
        full = m.estimate(model, tokenizer, m.options_from({}), **m.inputs_from({})).flops
        narrow = m.estimate(model, tokenizer, m.options_from(given), **m.inputs_from({})).flops
        assert narrow < full / 10, name
    heads = REGISTRY["heads"]
    assert heads.estimate(model, tokenizer, heads.options_from({"periods": [4]})).flops < \
        heads.estimate(model, tokenizer, heads.options_from({})).flops


@pytest.mark.slow
@pytest.mark.parametrize("name", ["heads", "circuits"])
def test_heads_and_circuits_estimates_hold_on_the_real_model(smollm2, name, tmp_path):
    took, estimate = measured_against_estimate(smollm2, name, {}, tmp_path)
    assert estimate / 3 < took < 3 * estimate, (name, took, estimate)
