"""Tensors as JSON for the result objects' to_dict()."""
from __future__ import annotations

from typing import Any

import torch


def rounded(t: torch.Tensor, digits: int = 6) -> Any:
    """A tensor as nested lists of rounded floats (a 0-dim tensor as one float); NaN becomes None."""
    def r(x):
        return [r(v) for v in x] if isinstance(x, list) else (round(x, digits) if x == x else None)
    return r(t.tolist())


def from_rounded(x: Any) -> torch.Tensor:
    """rounded()'s nested lists read back: a float64 tensor (exactly the written values), None as NaN."""
    def r(v: Any) -> Any:
        return [r(u) for u in v] if isinstance(v, list) else (float("nan") if v is None else v)
    return torch.tensor(r(x), dtype=torch.float64)


def round_tensor(t: torch.Tensor, digits: int = 6, dtype: torch.dtype = torch.float32) -> Any:
    """A tensor rounded in torch (in `dtype`) as nested lists; NaN stays NaN. Cheaper than rounded() for
    big tensors (lens grids, attention patterns), which have no NaN."""
    return torch.round(t.detach().to(dtype).cpu(), decimals=digits).tolist()
