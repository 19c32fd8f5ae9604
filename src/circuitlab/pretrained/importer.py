"""Load a Hugging Face checkpoint into circuitlab's Transformer, streaming its tensors.

    model, tokenizer = load_pretrained("path/to/gpt2")          # or a hub name, cache first
    logits = model(torch.tensor([tokenizer.encode("Hello")]))   # [1, pos, d_vocab], HF's own logits

The HF model is never built. Our model is built with its weights allocated but not initialised,
then each checkpoint tensor is read, one at a time, straight into its place (its rows of a fused
matrix; tensors that need a transpose or a reordering go through one temporary copy). Peak memory
is the model plus at most one transformed tensor.
"""
from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from circuitlab.checks import COUNT
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer
from circuitlab.model.loading import TensorReader, uninitialised_model
from circuitlab.pretrained.catalog import family_for, model_config_from_hf
from circuitlab.pretrained.family_base import Family, Piece
from circuitlab.pretrained.source import read_hf_config, resolve_checkpoint, stream_tensors, weight_files
from circuitlab.spec import Options, option

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
IMPORT_DTYPES = ("float32", "bfloat16", "float16")  # storage dtypes of the written model.safetensors


@dataclass(frozen=True)
class ImportOptions(Options):
    """What `circuitlab import` takes, declared once (circuitlab.spec): each flag's default, rule and help (its
    flags are these fields, in this order); load_pretrained's keyword defaults read it."""

    source: str | Path = option(None, required=True, flag="source", metavar="NAME_OR_PATH",
                                help="a local Hugging Face checkpoint folder, or a hub name (local cache first, then "
                                     "the network)")
    out: str | Path = option(None, required=True, help="folder to write (model.safetensors, config.json, tokenizer/)")
    dtype: str = option("float32", choices=IMPORT_DTYPES,
                        help="storage dtype of the written weights (default {default}); bfloat16 halves the file and "
                             "the memory of every command that loads it, which still computes in float32 on a CPU "
                             "(--compute-dtype there)")
    n_ctx: int | None = option(None, COUNT, help="keep a shorter context than the checkpoint's")
    tokenizer: bool = option(True, flag="--no-tokenizer", help="do not import the tokenizer")
    revision: str | None = option(None, help="hub revision (branch, tag or commit)")
    cache_dir: str | Path | None = option(None, help="Hugging Face cache folder (default: the usual one)")


def load_pretrained(name_or_path: str | os.PathLike, dtype: str | torch.dtype = ImportOptions.dtype, *,
                    compute_dtype: str | torch.dtype | None = None, n_ctx: int | None = None,
                    tokenizer: bool = ImportOptions.tokenizer,
                    device: str | torch.device = "cpu", cache_dir: str | os.PathLike | None = None,
                    revision: str | None = None):
    """A Hugging Face GPT-2, GPT-NeoX/Pythia, LLaMA, Mistral or Qwen2 checkpoint as (Transformer, tokenizer).

    name_or_path: a local folder (config.json + model.safetensors, sharded safetensors or
        pytorch_model.bin), or a hub name, looked up in the local HF cache first, then online.
    dtype: the storage dtype of the weight matrices (the checkpoint's tensors are converted while copying):
        bfloat16 / float16 hold the model in half the memory.
    compute_dtype: the dtype it computes in (default: float32 on a CPU, where half-precision arithmetic is
        slow or inexact, each weight upcast per use; the storage dtype on a GPU). See model/storage.py.
    n_ctx: a shorter context than the checkpoint's (smaller rotary tables / position embedding).
    tokenizer: also load the checkpoint's tokenizer with transformers.AutoTokenizer (None if the
        checkpoint has none).
    No weight processing is applied: model(tokens) gives the HF model's logits.
    Returns (model in eval mode, tokenizer or None).
    """
    folder = resolve_checkpoint(name_or_path, cache_dir=cache_dir, revision=revision)
    hf = read_hf_config(folder)
    family = family_for(hf)
    cfg = model_config_from_hf(hf, n_ctx).replace(name=_display_name(name_or_path, folder))
    model = assemble(cfg, family, hf, stream_tensors(weight_files(folder)), dtype=dtype, device=device,
                     compute_dtype=compute_dtype)
    return model, (load_hf_tokenizer(folder) if tokenizer else None)


def _display_name(name_or_path: str | os.PathLike, folder: Path) -> str:
    return folder.name if Path(name_or_path).expanduser().exists() else str(name_or_path)


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


def load_hf_tokenizer(folder: str | os.PathLike):
    """transformers.AutoTokenizer from a checkpoint folder, or None when it holds no tokenizer files."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001 - the weights are still usable without it
        warnings.warn(f"the tokenizer in {folder} could not be loaded ({type(e).__name__}: {e}); "
                      "continuing without a tokenizer", stacklevel=2)
        return None
