"""ReLU: latents ReLU(pre); trained with the decoder-norm-weighted L1 (an SAE's, a transcoder's and a CLT's)
and, in a CLT, the pre-activation penalty at θ = 0 (see clt_train.py)."""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.dictionaries.arch.base import Architecture, Coefficients


class ReLU(Architecture):
    name = "relu"
    coefficient = "l1_coeff"
    steers_l0 = True
    penalty_uses_norms = clt_penalty_uses_norms = True
    formats = {"saelens": "standard", "saelens-transcoder": "transcoder", "saelens-skip-transcoder": "skip_transcoder",
               "circuit-tracer": "relu", "circuit-tracer-clt": "relu"}

    def activate(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None) -> torch.Tensor:
        return pre.relu()

    def jumprelu_threshold(self, threshold: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        return torch.zeros_like(like)  # ReLU is JumpReLU at 0

    def penalty(self, acts: torch.Tensor, pre_kept: torch.Tensor, threshold: torch.Tensor | None,
                norms: torch.Tensor | None, coef: Coefficients, rows: int) -> torch.Tensor | None:
        assert norms is not None  # penalty_uses_norms: the step passes them
        return coef.sparsity * (acts * norms).sum() / rows

    def clt_penalty(self, acts: torch.Tensor, pre: torch.Tensor, threshold: torch.Tensor | None,
                    norm: torch.Tensor, layer_norms: torch.Tensor, coef_l: float, coef: Any, rows: int
                    ) -> list[torch.Tensor]:
        terms = [coef_l * (acts * norm).sum() / rows]
        if coef.preact:  # θ = 0: no latent stays silent
            terms.append(coef.preact * ((-pre).relu() * layer_norms).sum() / rows)
        return terms
