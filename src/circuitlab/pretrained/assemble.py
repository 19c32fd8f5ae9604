"""Placing checkpoint tensors into circuitlab's Transformer, as a Family says: shared by the Hugging Face importer
(importer.py, tensors streamed from safetensors) and the GGUF importer (gguf.py, tensors dequantized one by one).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer
from circuitlab.model.loading import TensorReader, uninitialised_model
from circuitlab.pretrained.families.base import Family, Piece


def assemble(cfg: ModelConfig, family: Family, hf: dict, tensors: Iterable[tuple[str, TensorReader]],
             dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu",
             compute_dtype: str | torch.dtype | None = None) -> Transformer:
    """Build a Transformer from (checkpoint key, reader) pairs, placing each tensor as `family` says
    (matrices in `dtype`, vectors in the compute dtype: uninitialised_model)."""
    model = uninitialised_model(cfg, dtype, device, compute_dtype)
    params = dict(model.named_parameters())  # a tied unembedding appears once, as embed.weight
    rows_written = dict.fromkeys(params, 0)
    unknown = []
    for key, reader in tensors:
        pieces = family.pieces(key, cfg)
        if pieces is None:
            unknown.append(key)
            continue
        for piece in pieces:
            rows_written[piece.target] = rows_written.get(piece.target, 0) + _place(params, piece, reader, key)
    if unknown:
        listed = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise CircuitlabError(f"this {family.name} checkpoint has tensors circuitlab does not know ({listed}); "
                              "it is probably a variant of the architecture that cannot be imported")
    _check_complete(params, rows_written, family.zero_targets(hf, cfg), family)
    return model.eval()


def _place(params: Mapping[str, torch.Tensor], piece: Piece, reader: TensorReader, key: str) -> int:
    """Copy one checkpoint tensor into its rows of our parameter; returns the number of rows written."""
    if piece.target not in params:
        raise CircuitlabError(f"checkpoint tensor {key} has no place in a model of this config.json "
                              f"(no parameter {piece.target}); the checkpoint and its config disagree")
    dest = params[piece.target].data
    if piece.transform is None:
        shape = reader.shape
        if piece.start is not None:
            dest = dest[piece.start: piece.start + (shape[0] if shape else 1)]
        _check_shape(dest, shape, key, piece)
        reader.read_into(dest)
        return dest.shape[0]
    value = piece.transform(reader.read())
    if piece.start is not None:
        dest = dest[piece.start: piece.start + value.shape[0]]
    _check_shape(dest, tuple(value.shape), key, piece)
    dest.copy_(value)
    return value.shape[0]


def _check_shape(dest: torch.Tensor, shape: tuple[int, ...], key: str, piece: Piece) -> None:
    if tuple(dest.shape) != tuple(shape):
        raise CircuitlabError(f"checkpoint tensor {key} has shape {tuple(shape)}, but its config.json implies "
                              f"{tuple(dest.shape)} for {piece.target}; the checkpoint and its config disagree")


def _check_complete(params: Mapping[str, torch.Tensor], rows_written: dict[str, int], zero_patterns: list[str],
                    family: Family) -> None:
    """Every parameter filled exactly once; the ones the architecture lacks are set to zero."""
    missing = []
    for name, dest in params.items():
        if rows_written[name] == dest.shape[0]:
            continue
        if rows_written[name] == 0 and any(re.fullmatch(p, name) for p in zero_patterns):
            with torch.no_grad():
                dest.zero_()
            continue
        missing.append(name)
    if missing:
        raise CircuitlabError(f"this {family.name} checkpoint lacks weights for {', '.join(missing[:5])}"
                              f"{' ...' if len(missing) > 5 else ''}; the download may be incomplete")
