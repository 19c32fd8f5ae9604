"""Tensors as JSON for the result objects' to_dict()."""
from __future__ import annotations

from typing import Any

import torch


def rounded(t: torch.Tensor, digits: int = 6) -> Any:
    """A tensor as nested lists of rounded floats (a 0-dim tensor as one float); NaN becomes None."""
    def r(x):
        return [r(v) for v in x] if isinstance(x, list) else (round(x, digits) if x == x else None)
    return r(t.tolist())
