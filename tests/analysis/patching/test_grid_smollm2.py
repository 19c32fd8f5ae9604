"""Causal tracing's staggered sweep on the real SmolLM2-135M-Instruct in float32: the restorations at the boundary
layers and positions equal one full forward per restoration with plain hooks to 1e-5 (the float64 tests in
tests/analysis/patching/ hold the definition exactly; this holds float32 rounding on the real model)."""
from __future__ import annotations

import pytest
import torch

from circuitlab.analysis.patching.causal_tracing import (FROZEN, RESTORES, default_window, restoration_grid,
                                                         subject_span, trace_run, window_layers)
from circuitlab.analysis.patching.grid import grid_sweep
from circuitlab.analysis.patching.metrics import probability
from circuitlab.analysis.patching.noise import Noise, corrupt_positions
from circuitlab.model.hooks import act_name


@pytest.mark.slow  # ~3 min of CPU: 60 full forwards of the real model beside the sweeps
def test_restorations_equal_the_hook_loop_in_float32(smollm2):
    model, tok = smollm2
    tokens = torch.tensor(tok.encode("The Eiffel Tower is located in the city of"))
    s, e = subject_span(tokens.tolist(), "Eiffel Tower", tok)
    L, T, w = model.cfg.n_layers, len(tokens), default_window(model.cfg.n_layers)
    with torch.no_grad():
        answer = int(model(tokens[None])[0, -1].argmax())
    assert tok.decode([answer]) == " Paris"
    metric = probability(answer)
    corrupted = corrupt_positions(model, tokens, range(s, e), Noise(samples=3))
    run = trace_run(model, tokens, corrupted, metric)
    assert run.clean_value - run.corrupt_value > 0.1  # the corruption takes the answer away: restorations matter
    with model.hooks(corrupted.hooks()):
        _, corrupt = model.run_with_cache(corrupted.tokens)
    for kind in ("hidden", "mlp", "hidden_no_mlp"):
        sites, layers, positions, local = restoration_grid(model, run, kind, w)
        pick = torch.tensor([i for i in range(len(layers)) if int(layers[i]) in (0, 1, L // 2, L - 2, L - 1)
                             and int(positions[i]) in (s, s + 1, e, T - 1)])
        fast = grid_sweep(model, run.base, [x.reordered(pick) for x in sites], metric, layers[pick],
                          positions[pick], local, progress=False)
        moved = 0.0
        for value, i in zip(fast.tolist(), pick.tolist()):
            l, p = i // (T - run.first), int(positions[i])
            restored = window_layers(l, w, L) if kind == "mlp" else [l]

            def restore(act, hook, p=p):
                act = act.clone()
                act[:, p] = run.clean[hook.name][0, p]
                return act

            hooks = [(act_name(RESTORES[kind], j), restore) for j in restored]
            if kind in FROZEN:
                hooks += [(act_name(FROZEN[kind], j), lambda act, hook: corrupt[hook.name])
                          for j in range(l + 1, L)]
            with torch.no_grad():
                want = metric(model.run_with_hooks(corrupted.tokens, fwd_hooks=corrupted.hooks() + hooks))
            assert abs(value - float(want)) <= 1e-5, (kind, l, p, value, float(want))
            moved = max(moved, abs(value - run.corrupt_value))
        assert moved > 0.1, kind
