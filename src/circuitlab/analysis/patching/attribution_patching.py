"""Attribution patching: the first-order (gradient) estimate of activation patching.

Patching an activation a from its base value a_base to a_source moves the metric by about
(a_source - a_base) · ∂metric/∂a, the gradient taken on the base run. One forward pass on the
source prompt, one forward and one backward pass on the base prompt give that estimate for every
target, layer, position and head at once (Nanda, "Attribution patching", 2023).

    est = attribution_patching(model, clean, corrupt, metric, ["resid_pre", "head_out_by_pos"])
    est["head_out_by_pos"].values        # [layer, pos, head], same layout as activation_patching
    check = attribution_vs_patching(model, clean, corrupt, metric)
    check.correlation                    # {target: Pearson r between estimated and real effects}

The estimate is exact for a metric linear in the activation and degrades where attention or
norms saturate, so it points at candidates that real patching then confirms.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.patching import (Metric, PatchResult, check_patching_request, default_targets, metric_value,
                                          patching_sweep)
from circuitlab.errors import CircuitlabError
from circuitlab.model.hooks import act_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def _checked(value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        raise CircuitlabError("attribution patching needs a metric computed from the logits with torch "
                              "operations (so it has a gradient); this one returned a constant")
    return value


def attribution_patching(model: Transformer, clean_tokens, corrupt_tokens, metric: Metric,
                         targets: Sequence[str] | str | None = None, *, direction: str = "denoise",
                         layers: Sequence[int] | None = None) -> dict[str, PatchResult]:
    """Estimated activation patching for every target with 2 forward passes and 1 backward pass.

    clean_tokens, corrupt_tokens [batch, pos] (same shape). metric: fn(logits [batch, pos, d_vocab])
    -> scalar, differentiable. targets: names in patching.TARGETS (default: default_targets(model)).
    Returns {target: PatchResult(method="attribution")} with values [layer, *axes] laid out as in
    activation_patching: base metric + estimated change.
    """
    targets = default_targets(model) if targets is None else [targets] if isinstance(targets, str) else targets
    chosen, checked, base, source, hooks = check_patching_request(model, clean_tokens, corrupt_tokens, metric,
                                                                  targets, direction, layers)

    source_logits, source_cache = model.run_with_cache(source, names_filter=hooks)
    # ∂metric/∂activation at the base run: the model's one gradient cache (autograd.grad on the activations).
    base_logits, base_cache = model.run_with_cache(base, names_filter=hooks, incl_bwd=True,
                                                   loss_fn=lambda logits: _checked(metric(logits)))
    base_acts, grads = base_cache.acts, base_cache.grads
    with torch.no_grad():
        base_value, source_value = metric_value(metric, base_logits), metric_value(metric, source_logits)
    clean_value, corrupt_value = (source_value, base_value) if direction == "denoise" else (base_value, source_value)

    results = {}
    for t in chosen:
        per_layer = []
        for l in checked:
            h = act_name(t.hook, l)
            contrib = (source_cache[h] - base_acts[h]) * grads[h]  # [batch, *act dims]
            summed = [d + 1 for d in range(contrib.dim() - 1) if d not in t.dims]
            est = contrib.sum(dim=[0, *summed])  # the indexed dims, in activation order
            order = sorted(t.dims)
            per_layer.append(est.permute([order.index(d) for d in t.dims]))  # into the target's axis order
        values = base_value + torch.stack(per_layer).cpu().double()
        results[t.name] = PatchResult(t.name, t.axes, checked, values, clean_value, corrupt_value, direction,
                                      method="attribution", metric=getattr(metric, "__name__", "metric"))
    return results


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two tensors' entries (NaN if either is constant)."""
    a, b = a.flatten().double(), b.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    denom = a.norm() * b.norm()
    return float((a @ b) / denom) if denom > 0 else float("nan")


@dataclass
class AttributionCheck:
    """Attribution patching next to real activation patching, per target.

    correlation: {target: Pearson r of the estimated and the real effects over all patches};
    attribution / patching: the two {target: PatchResult}.
    """

    correlation: dict[str, float]
    attribution: dict[str, PatchResult]
    patching: dict[str, PatchResult]

    def to_dict(self) -> dict[str, Any]:
        return {"correlation": {k: round(v, 6) if v == v else None for k, v in self.correlation.items()},
                "attribution": {k: v.to_dict() for k, v in self.attribution.items()},
                "patching": {k: v.to_dict() for k, v in self.patching.items()}}


def attribution_vs_patching(model: Transformer, clean_tokens, corrupt_tokens, metric: Metric,
                            targets: Sequence[str] | str | None = None, *, direction: str = "denoise",
                            layers: Sequence[int] | None = None, batch_size: int | None = None,
                            progress: bool = True, patching: dict[str, PatchResult] | None = None
                            ) -> AttributionCheck:
    """Run both attribution patching and activation patching and correlate their effects per target.

    Inputs as in attribution_patching; `patching`: results of patching_sweep on the same inputs, to
    reuse instead of recomputing (only the targets missing from it are patched). Returns AttributionCheck.
    """
    attribution = attribution_patching(model, clean_tokens, corrupt_tokens, metric, targets, direction=direction,
                                       layers=layers)
    patching = dict(patching or {})
    missing = [t for t in attribution if t not in patching]
    if missing:
        patching.update(patching_sweep(model, clean_tokens, corrupt_tokens, metric, missing, direction=direction,
                                       layers=layers, batch_size=batch_size, progress=progress))
    for t, res in patching.items():
        if t in attribution and res.values.shape != attribution[t].values.shape:
            raise CircuitlabError(f"the given patching result for {t!r} has shape {list(res.values.shape)}, not "
                                  f"{list(attribution[t].values.shape)}: was it run on the same inputs and layers?")
    patching = {t: patching[t] for t in attribution}
    corr = {t: pearson(attribution[t].effect(), patching[t].effect()) for t in attribution}
    return AttributionCheck(corr, attribution, patching)
