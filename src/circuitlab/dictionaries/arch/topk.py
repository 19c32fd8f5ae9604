"""TopK: the k largest pre-activations of each row, ReLU'd (Gao et al. 2024); no penalty (k sets the L0)."""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.dictionaries.arch.base import Architecture, Coefficients
from circuitlab.dictionaries.sparse_ops import Kept


class TopK(Architecture):
    name = "topk"
    uses_k = True
    formats = {"saelens": "topk", "circuit-tracer": "topk", "sparsify": "topk"}

    def activate(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None) -> torch.Tensor:
        assert k is not None, "TopK needs k"
        values, indices = pre.topk(k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())

    def keep(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None, coef: Coefficients,
             replicas: Any = None) -> tuple[Any, torch.Tensor | None]:
        assert k is not None, "TopK needs k"
        return Kept.per_row(pre.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values, pre.shape[-1]), None
