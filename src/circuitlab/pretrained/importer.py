"""Load a Hugging Face checkpoint (or a GGUF file, a built-in model: gguf.py, builtin.py) into circuitlab's
Transformer, streaming its tensors.

    model, tokenizer = load_pretrained("path/to/gpt2")          # or a hub name, cache first
    logits = model(torch.tensor([tokenizer.encode("Hello")]))   # [1, pos, d_vocab], HF's own logits

The HF model is never built. Our model is built with its weights allocated but not initialised,
then each checkpoint tensor is read, one at a time, straight into its place (its rows of a fused
matrix; tensors that need a transpose or a reordering go through one temporary copy). Peak memory
is the model plus at most one transformed tensor.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from circuitlab.pretrained.assemble import assemble
from circuitlab.pretrained.builtin import builtin_file, is_builtin
from circuitlab.pretrained.catalog import family_for, model_config_from_hf
from circuitlab.pretrained.gguf import is_gguf_path, load_gguf
from circuitlab.pretrained.options import IMPORT_DTYPES, ImportOptions
from circuitlab.pretrained.source import read_hf_config, resolve_checkpoint, stream_tensors, weight_files

__all__ = ["IMPORT_DTYPES", "ImportOptions", "assemble", "gguf_source", "load_hf_tokenizer", "load_pretrained"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_pretrained(name_or_path: str | os.PathLike, dtype: str | torch.dtype = ImportOptions.dtype, *,
                    compute_dtype: str | torch.dtype | None = None, n_ctx: int | None = None,
                    tokenizer: bool = ImportOptions.tokenizer,
                    device: str | torch.device = "cpu", cache_dir: str | os.PathLike | None = None,
                    revision: str | None = None):
    """A Hugging Face checkpoint, a GGUF file or a built-in real model as (Transformer, tokenizer).

    name_or_path: a local folder (config.json + model.safetensors, sharded safetensors or
        pytorch_model.bin); a .gguf file (pretrained/gguf.py: dequantized by transformers and gguf); a built-in
        model's name (pretrained/builtin.py, e.g. "smollm2-135m-instruct"); or a hub name, looked up in the
        local HF cache first, then online.
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
    gguf = gguf_source(name_or_path)
    if gguf is not None:
        model, tok, _ = load_gguf(gguf[0], dtype, compute_dtype=compute_dtype, n_ctx=n_ctx, tokenizer=tokenizer,
                                  device=device, name=gguf[1])
        return model, tok
    folder = resolve_checkpoint(name_or_path, cache_dir=cache_dir, revision=revision)
    hf = read_hf_config(folder)
    family = family_for(hf)
    cfg = model_config_from_hf(hf, n_ctx).replace(name=_display_name(name_or_path, folder))
    model = assemble(cfg, family, hf, stream_tensors(weight_files(folder)), dtype=dtype, device=device,
                     compute_dtype=compute_dtype)
    return model, (load_hf_tokenizer(folder) if tokenizer else None)


def gguf_source(name_or_path: str | os.PathLike) -> tuple[Path, str | None] | None:
    """(the GGUF file, its display name) when name_or_path is a .gguf path or a built-in model's name (whose
    package must then be installed); None for anything else (a Hugging Face folder or hub name)."""
    if is_builtin(name_or_path):
        return builtin_file(str(name_or_path)), str(name_or_path)
    return (Path(name_or_path), None) if is_gguf_path(name_or_path) else None


def _display_name(name_or_path: str | os.PathLike, folder: Path) -> str:
    return folder.name if Path(name_or_path).expanduser().exists() else str(name_or_path)


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
