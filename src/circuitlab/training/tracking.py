"""Metrics tracked while training, supplied by the caller.

The trainer knows nothing about heads or circuits: it calls each probe it is given at step 0 and
every train.track_every steps, and writes what they return into metrics.jsonl. The demo and
`circuitlab train` pass circuitlab.analysis.heads.induction.training_probes (induction and previous-token
scores, loss on repeats, induction by period, in-context-learning score), which make the
induction-head phase change visible against tokens seen.

    def weight_norm(model, data):                      # (Transformer, TokenData) -> JSON-able dict
        return {"weight_norm": sum(p.norm() ** 2 for p in model.parameters()).sqrt().item()}
    train(run, "runs/x", track=[weight_norm])
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

Probe = Callable[[Any, Any], Mapping[str, Any]]  # (model, data) -> {name: JSON-able value}


@torch.no_grad()
def run_probes(model: torch.nn.Module, data: Any, probes: Sequence[Probe]) -> dict[str, Any]:
    """All probes' values merged into one dict, with the model in eval mode (restored after)."""
    was_training = model.training
    model.eval()
    found: dict[str, Any] = {}
    try:
        for probe in probes:
            found.update(probe(model, data))
    finally:
        model.train(was_training)
    return found
