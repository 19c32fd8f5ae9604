"""JumpReLU: a · H(a − θ) with a learned per-latent threshold θ, trained through a rectangle-kernel
straight-through estimator (Rajamanoharan et al. 2024). An SAE's penalty is the L0 (straight-through); a
CLT's is Anthropic's tanh(c · a · ‖W_dec‖) plus the pre-activation penalty (see clt_train.py)."""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.dictionaries.arch.base import Architecture, Coefficients


def _rectangle(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x)


class JumpReLUFn(torch.autograd.Function):
    """pre * (pre > θ); θ's gradient by the straight-through estimator with kernel width `bandwidth`."""

    @staticmethod
    def forward(ctx: Any, pre: torch.Tensor, threshold: torch.Tensor, bandwidth: float) -> torch.Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        pre, threshold = ctx.saved_tensors
        bw = ctx.bandwidth
        d_threshold = -(threshold / bw) * _rectangle((pre - threshold) / bw) * grad
        return (pre > threshold) * grad, d_threshold.reshape(-1, threshold.shape[-1]).sum(0), None


class StepFn(torch.autograd.Function):
    """H(pre − θ), the L0 of each pair; θ's gradient by the same straight-through estimator."""

    @staticmethod
    def forward(ctx: Any, pre: torch.Tensor, threshold: torch.Tensor, bandwidth: float) -> torch.Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None]:
        pre, threshold = ctx.saved_tensors
        bw = ctx.bandwidth
        d_threshold = -(1.0 / bw) * _rectangle((pre - threshold) / bw) * grad
        return None, d_threshold.reshape(-1, threshold.shape[-1]).sum(0), None


class JumpReLU(Architecture):
    name = "jumprelu"
    has_threshold = learns_threshold = True
    steers_l0 = True
    clt_penalty_uses_norms = True
    formats = {"saelens": "jumprelu", "saelens-transcoder": "jumprelu_transcoder",
               "saelens-skip-transcoder": "jumprelu_skip_transcoder", "circuit-tracer": "jumprelu",
               "circuit-tracer-clt": "jumprelu", "gemma-scope-2": "jump_relu", "llama-scope": ("jumprelu", "jump_relu")}

    def activate(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None) -> torch.Tensor:
        assert threshold is not None, "JumpReLU needs its threshold"
        return pre * (pre > threshold)  # threshold > 0

    def jumprelu_threshold(self, threshold: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        return threshold

    def keep(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None, coef: Coefficients,
             replicas: Any = None) -> tuple[Any, torch.Tensor | None]:
        # the pairs that fire or are in the threshold's straight-through window; the others get no gradient
        assert threshold is not None
        return None, pre > threshold.detach() - coef.bandwidth / 2

    def train_activate(self, pre_kept: torch.Tensor, threshold: torch.Tensor | None, coef: Coefficients) -> torch.Tensor:
        return JumpReLUFn.apply(pre_kept, threshold, coef.bandwidth)

    def penalty(self, acts: torch.Tensor, pre_kept: torch.Tensor, threshold: torch.Tensor | None,
                norms: torch.Tensor | None, coef: Coefficients, rows: int) -> torch.Tensor | None:
        return coef.sparsity * StepFn.apply(pre_kept, threshold, coef.bandwidth).sum() / rows

    def clt_penalty(self, acts: torch.Tensor, pre: torch.Tensor, threshold: torch.Tensor | None,
                    norm: torch.Tensor, layer_norms: torch.Tensor, coef_l: float, coef: Any, rows: int
                    ) -> list[torch.Tensor]:
        terms = [coef_l * torch.tanh(coef.tanh_scale * acts * norm).sum() / rows]
        if coef.preact:  # silent latents' pre-activations pushed up to θ (θ gets no gradient from it)
            assert threshold is not None
            terms.append(coef.preact * ((threshold.detach() - pre).relu() * layer_norms).sum() / rows)
        return terms
