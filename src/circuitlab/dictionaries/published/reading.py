"""What every published-layout reader shares: a dictionary built from its tensors, the one-line errors for a
file that lacks a tensor or cannot be read."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from circuitlab.dictionaries.config import DictionaryConfig
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.model.storage import resolve_dtypes

def build(where: str, tensors: dict[str, torch.Tensor], **cfg: Any) -> SparseDictionary:
    d_in, d_sae = tensors["W_enc"].shape
    config = DictionaryConfig(d_in=int(d_in), d_sae=int(d_sae), d_out=int(tensors["W_dec"].shape[1]), **cfg)
    return SparseDictionary.from_tensors(config, {k: v.to(torch.float32) for k, v in tensors.items()}, where)


def need(tensors: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise CircuitlabError(f"{where} lacks {', '.join(missing)} (has {', '.join(sorted(tensors))}): not the layout it looks like")


def read_or_refuse(where: Path, reader: Callable[[], Any]) -> Any:
    try:
        return reader()
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file is the user's to replace
        raise CircuitlabError(f"{where} is corrupt or truncated ({type(e).__name__}: {e})") from None


def check_dtypes(dtype: Any, compute_dtype: Any, device: Any) -> None:
    """Bad dtype names fail before any file is read."""
    if dtype is not None or compute_dtype is not None:
        resolve_dtypes(dtype, compute_dtype, device)


def stored(d: Any, dtype: Any, compute_dtype: Any) -> Any:
    """d held in dtype and computing in compute_dtype, cast as soon as it is read (one float32 copy at a time)."""
    return d.set_dtypes(dtype, compute_dtype) if dtype is not None or compute_dtype is not None else d
