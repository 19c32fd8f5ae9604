"""DictionaryModule: what a SparseDictionary and a CrossLayerTranscoder share — a copy of itself under another
config (same weights), and the form it is used in at inference (BatchTopK becomes the JumpReLU it is)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from circuitlab.errors import CircuitlabError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


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

    def _load_checked(self, tensors: dict[str, torch.Tensor], what: str):
        """Load a state dict after checking every shape against this module's (built from its config); `what`
        names the file and the config in the one-line error. Returns self."""
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if expected != got:
            diff = sorted(set(expected.items()) ^ set(got.items()))
            raise CircuitlabError(f"{what}: {diff[:4]}")
        self.load_state_dict({k: v.to(DTYPES[self.cfg.dtype]) for k, v in tensors.items()})
        return self
