"""DictionaryModule: what a SparseDictionary and a CrossLayerTranscoder share — a copy of itself under another
config (same weights), and the form it is used in at inference (BatchTopK becomes the JumpReLU it is)."""
from __future__ import annotations

from typing import Any

from torch import nn


class DictionaryModule(nn.Module):
    """Base of the dictionary modules: subclasses are built as `cls(cfg)` and have `cfg` with `architecture`,
    `k`, `metadata` and `replace(...)`."""

    cfg: Any

    def for_inference(self):
        """BatchTopK becomes the JumpReLU it is at inference (same weights, its running threshold); others unchanged."""
        if self.cfg.architecture != "batchtopk":
            return self
        meta = {**self.cfg.metadata, "trained_as": "batchtopk", "k": self.cfg.k}
        return self._copy_with(self.cfg.replace(architecture="jumprelu", k=None, metadata=meta))

    def _copy_with(self, cfg: Any):
        """A new module of the same class under `cfg`, with this one's weights, device and dtype."""
        like = next(self.parameters())
        new = type(self)(cfg).to(device=like.device, dtype=like.dtype)
        new.load_state_dict(self.state_dict())
        return new
