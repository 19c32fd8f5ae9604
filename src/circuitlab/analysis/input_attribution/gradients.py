"""Gradient methods: saliency, gradient x input, integrated gradients (batched path points, Gauss-Legendre or
midpoint quadrature)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from circuitlab.analysis.input_attribution.base import (Baseline, Explain, InputAttribution, Metric, _baseline_name,
                                                        _decorate, _resolve, _sequence, baseline_embeddings,
                                                        rows_per_chunk)
from circuitlab.analysis.input_attribution.options import DEFAULT_POS, DEFAULT_STEPS, STEPS, IGOptions
from circuitlab.analysis.input_attribution.techniques import Technique
from circuitlab.checks import COUNT
from circuitlab.errors import CircuitlabError
from circuitlab.model import frozen_parameters

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def _gradient(model: Transformer, tokens: torch.Tensor, explain: Explain) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(embeddings x [pos, d_model], d metric / d x [pos, d_model], metric value)."""
    x = model.token_embeddings(tokens).detach()
    with torch.enable_grad(), frozen_parameters(model):
        e = x[None].clone().requires_grad_(True)
        out = explain(e)
        (grad,) = torch.autograd.grad(out.sum(), e)
    return x, grad[0].detach(), float(out.detach()[0])


def saliency(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
             pos: int = DEFAULT_POS, metric: Metric | None = None, tokenizer=None) -> InputAttribution:
    """L2 norm of the metric's gradient with respect to each token's embedding: scores [pos] (≥ 0)."""
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    _, grad, value = _gradient(model, tokens, explain)
    return _decorate(InputAttribution("saliency", tokens.tolist(), grad.norm(dim=-1).float().cpu(), pos, target,
                                      foil, value), tokenizer)


def gradient_x_input(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                     pos: int = DEFAULT_POS, metric: Metric | None = None, tokenizer=None) -> InputAttribution:
    """Gradient · embedding, summed over d_model: scores [pos] (signed; IG with one step from zeros)."""
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    x, grad, value = _gradient(model, tokens, explain)
    return _decorate(InputAttribution("grad-x-input", tokens.tolist(), (grad * x).sum(-1).float().cpu(), pos,
                                      target, foil, value), tokenizer)


def path_nodes(steps: int, rule: str = "gausslegendre") -> tuple[torch.Tensor, torch.Tensor]:
    """Points alpha in (0, 1) on the straight path and their quadrature weights (summing to 1), [steps] each.

    "gausslegendre" (default; exact for polynomials of degree < 2·steps) or "riemann" (midpoints)."""
    if rule not in STEPS:
        raise CircuitlabError(f"unknown integration rule {rule!r}; choose gausslegendre or riemann")
    STEPS[rule].check(steps, "steps")
    if rule == "gausslegendre":
        import numpy as np

        x, w = np.polynomial.legendre.leggauss(steps)
        return torch.tensor(0.5 * (x + 1.0), dtype=torch.float64), torch.tensor(0.5 * w, dtype=torch.float64)
    if rule == "riemann":
        return (torch.arange(steps, dtype=torch.float64) + 0.5) / steps, torch.full((steps,), 1.0 / steps,
                                                                                     dtype=torch.float64)
    raise CircuitlabError(f"unknown integration rule {rule!r}; choose gausslegendre or riemann")


def integrated_gradients(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                         pos: int = DEFAULT_POS, metric: Metric | None = None, baseline: Baseline = "zeros",
                         steps: int = DEFAULT_STEPS, rule: str = "gausslegendre", batch_size: int | None = None,
                         tokenizer=None) -> InputAttribution:
    """Integrated gradients on the straight path from the baseline's embeddings to the input's.

    scores [pos] = Σ_d (x − x')_d · ∫ ∂f/∂x_d (x' + α(x − x')) dα, the integral by `rule` with `steps`
    points. The points run as batched forward/backward passes of `batch_size` (default: as many as fit
    row_budget(), rows_per_chunk), so memory stays bounded whatever `steps`.
    completeness_error = |Σ scores − (f(x) − f(x'))| / |f(x) − f(x')|: raise steps if it is large.
    baseline: "zeros", a token id (pad / EOS) at every position, a prompt's token ids [pos] or
    embeddings [pos, d_model] (see baseline_embeddings).
    """
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    alphas, weights = path_nodes(steps, rule)
    chunk = COUNT.check(batch_size, "batch_size") if batch_size is not None else rows_per_chunk(model, pos + 1)
    x = model.token_embeddings(tokens).detach()
    base = baseline_embeddings(model, tokens, baseline)
    delta = x - base
    total = torch.zeros_like(x, dtype=torch.float64)
    with torch.enable_grad(), frozen_parameters(model):
        for start in range(0, steps, chunk):
            a = alphas[start:start + chunk].to(x.device, x.dtype)
            e = (base[None] + a[:, None, None] * delta[None]).requires_grad_(True)  # [chunk, pos, d_model]
            (grad,) = torch.autograd.grad(explain(e).sum(), e)
            total += torch.einsum("s,spd->pd", weights[start:start + chunk].to(x.device), grad.double())
    scores = (delta.double() * total).sum(-1)  # [pos]
    with torch.no_grad():
        ends = explain(torch.stack([x, base])).double()
    change = float(ends[0] - ends[1])
    gap = abs(float(scores.sum()) - change)
    error = gap / abs(change) if abs(change) > 1e-12 else (0.0 if gap < 1e-9 else math.inf)
    result = InputAttribution("ig", tokens.tolist(), scores.float().cpu(), pos, target, foil, float(ends[0]),
                              float(ends[1]), error, steps, _baseline_name(baseline))
    result.extra["rule"] = rule
    return _decorate(result, tokenizer)


# The registry's records (the package's __init__ registers them).
IG = Technique("ig", integrated_gradients, IGOptions, label="integrated gradients", baseline="zeros",
               keeps_positions="a path of embeddings needs the same positions",
               rows=lambda values, n_pos: values["steps"], backward=True)
SALIENCY = Technique("saliency", saliency, label="saliency", backward=True)
GRAD_X_INPUT = Technique("grad-x-input", gradient_x_input, label="gradient × input", backward=True)
