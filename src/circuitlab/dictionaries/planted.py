"""Planted features in superposition (the toy-models setup): ground truth for dictionary learning.

n_features known unit directions in d dimensions (n_features > d), each active independently
with a Zipf-like probability (feature i ∝ 1/(i+1)^zipf, scaled so that on average `l0` are
active), with a magnitude uniform in [0.5, 1.5]. A dictionary that learns them has decoder rows
matching the directions: see recovery().

    planted = PlantedFeatures(n_features=64, d=16, l0=3)
    store = ActivationStore(planted, batch_size=512)     # it is an activation source
"""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.dictionaries.store import _seed


class PlantedFeatures:
    def __init__(self, n_features: int = 64, d: int = 16, l0: float = 3.0, zipf: float = 0.5,
                 rows_per_chunk: int = 8192, seed: int = 0, hook_name: str = "planted") -> None:
        g = torch.Generator().manual_seed(seed)
        dirs = torch.randn(n_features, d, generator=g)
        self.directions = dirs / dirs.norm(dim=-1, keepdim=True)            # [n_features, d]
        p = 1.0 / torch.arange(1, n_features + 1, dtype=torch.float64) ** zipf
        self.probs = (p * l0 / p.sum()).clamp(max=1.0).float()             # [n_features]
        self.n_features, self.d, self.l0, self.zipf = n_features, d, l0, zipf
        self.rows_per_chunk, self.seed, self.hook_name = rows_per_chunk, seed, hook_name
        self.widths = {hook_name: d}

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(x [n, d], feature activations [n, n_features])."""
        on = torch.rand(n, self.n_features, generator=generator) < self.probs
        mags = 0.5 + torch.rand(n, self.n_features, generator=generator)
        feats = on * mags
        return feats @ self.directions, feats

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(_seed("planted", self.seed, split, index))
        return {self.hook_name: self.sample(self.rows_per_chunk, g)[0]}

    def describe(self) -> dict[str, Any]:
        return {"kind": "planted", "n_features": self.n_features, "d": self.d, "l0": self.l0,
                "zipf": self.zipf, "seed": self.seed}


def recovery(decoder: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """For each true direction [n_features, d], the best cosine with any decoder row [d_sae, d]: [n_features]."""
    dec = decoder / decoder.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    true = directions / directions.norm(dim=-1, keepdim=True)
    return (true @ dec.T).max(dim=-1).values
