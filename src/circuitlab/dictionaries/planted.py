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

from circuitlab.checks import DEFAULT_SEED
from circuitlab.dictionaries.store import _seed
from circuitlab.errors import ConfigError



class PlantedFeatures:
    def __init__(self, n_features: int = 64, d: int = 16, l0: float = 3.0, zipf: float = 0.5,
                 rows_per_chunk: int = 8192, seed: int = DEFAULT_SEED, hook_name: str = "planted") -> None:
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


class PlantedCrossLayer:
    """Planted cross-layer features: ground truth for cross-layer transcoders.

    n_layers layers of width d; each layer is the source of n_per_layer true features. Feature f of
    source layer l fires on a row with probability ∝ 1/(i+1)^zipf (on average l0 per layer — or l0[l], magnitude
    uniform in [0.5, 1.5]). Its input direction e_f stays in the inputs of layers l, l+1, ... (the residual
    stream keeps it), and it writes a_f · o_f^t into the outputs of layers t = l..l+reach (known unit
    directions). A CLT needs one latent per feature (reading e_f at l, decoders o_f^l..o_f^{l+reach});
    per-layer transcoders need one per layer it writes to.

        planted = PlantedCrossLayer(n_layers=3, d=16, n_per_layer=24, reach=2)
        store = ActivationStore(planted, batch_size=512)   # hooks blocks.{l}.ln2.hook_normalized / hook_mlp_out
    """

    def __init__(self, n_layers: int = 3, d: int = 16, n_per_layer: int = 24, reach: int = 1, l0: float | list[float] = 2.0,
                 zipf: float = 0.5, rows_per_chunk: int = 8192, seed: int = DEFAULT_SEED,
                 input_hook: str = "blocks.{layer}.ln2.hook_normalized",
                 output_hook: str = "blocks.{layer}.hook_mlp_out") -> None:
        g = torch.Generator().manual_seed(seed)
        L, n = n_layers, n_layers * n_per_layer

        def unit(*shape: int) -> torch.Tensor:
            v = torch.randn(*shape, generator=g)
            return v / v.norm(dim=-1, keepdim=True)

        self.inputs = unit(n, d)                                            # [n_features, d]: e_f
        self.source = torch.arange(L).repeat_interleave(n_per_layer)        # [n_features]: l_f
        writes = torch.arange(L)[None, :] - self.source[:, None]            # target − source
        self.writes = (writes >= 0) & (writes <= reach)                     # [n_features, L]
        self.outputs = unit(n, L, d) * self.writes[..., None]               # [n_features, L, d]: o_f^t (0 elsewhere)
        p = 1.0 / torch.arange(1, n_per_layer + 1, dtype=torch.float64) ** zipf
        l0s = torch.as_tensor([l0] * L if isinstance(l0, (int, float)) else list(l0), dtype=torch.float64)  # [L]
        if l0s.shape != (L,):
            raise ConfigError(f"l0 must be one number or one per layer ({L}), got {l0}")
        self.probs = (p * l0s[:, None] / p.sum()).clamp(max=1.0).float().flatten()   # [n_features], layer-major
        self.n_layers, self.d, self.n_per_layer, self.reach, self.l0 = L, d, n_per_layer, reach, l0
        self.zipf, self.rows_per_chunk, self.seed = zipf, rows_per_chunk, seed
        self.input_hook, self.output_hook = input_hook, output_hook
        self.widths = {h.format(layer=l): d for l in range(L) for h in (input_hook, output_hook)}

    @property
    def n_features(self) -> int:
        return self.n_layers * self.n_per_layer

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs [n, L, d], outputs [n, L, d], feature activations [n, n_features])."""
        on = torch.rand(n, self.n_features, generator=generator) < self.probs
        feats = on * (0.5 + torch.rand(n, self.n_features, generator=generator))
        present = (torch.arange(self.n_layers)[None, :] >= self.source[:, None]).float()   # [n_features, L]
        xs = torch.einsum("rf,fl,fd->rld", feats, present, self.inputs)
        ys = torch.einsum("rf,fld->rld", feats, self.outputs)
        return xs, ys, feats

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(_seed("planted-clt", self.seed, split, index))
        xs, ys, _ = self.sample(self.rows_per_chunk, g)
        out = {}
        for l in range(self.n_layers):
            out[self.input_hook.format(layer=l)] = xs[:, l]
            out[self.output_hook.format(layer=l)] = ys[:, l]
        return out

    def describe(self) -> dict[str, Any]:
        return {"kind": "planted-cross-layer", "n_layers": self.n_layers, "d": self.d, "n_per_layer": self.n_per_layer,
                "reach": self.reach, "l0": self.l0, "zipf": self.zipf, "seed": self.seed}

    def clt_recovery(self, clt: Any) -> torch.Tensor:  # clt: a CrossLayerTranscoder
        """For each true feature [n_features], the best cosine between its whole output (layers l_f..L-1,
        concatenated) and any decoder of a latent of its source layer in the CLT."""
        best = torch.zeros(self.n_features)
        for l in range(self.n_layers):
            mine = (self.source == l).nonzero().squeeze(1)
            true = self.outputs[mine, l:].flatten(1)                                  # [n_per_layer, (L-l)·d]
            dec = clt.decode_layer(torch.eye(clt.cfg.d_sae, dtype=clt.dtype), l).flatten(1).float()
            best[mine] = recovery(dec.detach(), true)
        return best

    def latents_per_feature(self, decoders: list[torch.Tensor], cutoff: float = 0.9) -> torch.Tensor:
        """Per-layer transcoders' decoders [d_sae, d] (one per layer): for each true feature [n_features], how
        many latents (over all layers) have a decoder within `cutoff` cosine of its output direction there."""
        counts = torch.zeros(self.n_features, dtype=torch.long)
        for t, W in enumerate(decoders):
            dec = W / W.norm(dim=-1, keepdim=True).clamp(min=1e-12)
            cos = self.outputs[:, t] @ dec.float().T                                   # [n_features, d_sae]
            counts += ((cos > cutoff) & self.writes[:, t, None]).sum(-1)
        return counts
