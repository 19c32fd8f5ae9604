"""circuitlab's model folder, as written by `circuitlab import` (the training checkpoint's layout):

    DIR/model.safetensors   our state dict (a tied unembedding is stored once, as embed.weight)
    DIR/config.json         {"model": ModelConfig.to_dict(), "format": "circuitlab-checkpoint-1", ...extra}
    DIR/tokenizer/          the Hugging Face tokenizer's files, plus tokenizer_meta.json so that
                            circuitlab.data.load_tokenizer finds it

Each file is written to a temporary name and renamed into place, so a reader never sees half a file.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from circuitlab.atomic import atomic_write_file, atomic_write_text
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer
from circuitlab.pretrained.importer import load_hf_tokenizer, uninitialised_model
from circuitlab.pretrained.source import stream_tensors

MODEL_FILE, CONFIG_FILE, TOKENIZER_DIR, TOKENIZER_META = (
    "model.safetensors", "config.json", "tokenizer", "tokenizer_meta.json")
FORMAT = "circuitlab-checkpoint-1"


def save_model_dir(model: Transformer, out_dir: str | os.PathLike, extra: dict[str, Any] | None = None,
                   tokenizer=None) -> Path:
    """Write model (and an HF tokenizer, if given) to out_dir; returns the folder.

    extra: more JSON-able entries for config.json (e.g. {"source": {...}}).
    An existing folder is overwritten only if it is empty or already a circuitlab model folder.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CircuitlabError(f"{out_dir} is a file; choose a folder for the model")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / CONFIG_FILE).is_file():
        raise CircuitlabError(f"{out_dir} exists and is not a circuitlab model folder; choose a new or empty folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tied_embeddings:
        tensors.pop("unembed.weight")  # safetensors stores each tensor once
    atomic_write_file(out_dir / MODEL_FILE, lambda path: save_file(tensors, path, metadata={"format": "pt"}))
    if tokenizer is not None:
        _save_tokenizer(tokenizer, out_dir / TOKENIZER_DIR)
    meta = {**(extra or {}), "model": model.cfg.to_dict(), "format": FORMAT}
    atomic_write_text(out_dir / CONFIG_FILE, json.dumps(meta, indent=2))
    return out_dir


def _save_tokenizer(tokenizer, directory: Path) -> None:
    """HF tokenizer files + tokenizer_meta.json ({"kind": "hf", "path": this folder}), swapped in whole."""
    if not hasattr(tokenizer, "save_pretrained"):
        raise CircuitlabError(f"cannot save tokenizer {tokenizer!r}: expected a transformers tokenizer")
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        tokenizer.save_pretrained(str(tmp))
        meta = {"kind": "hf", "path": str(directory.resolve()), "vocab_size": len(tokenizer)}
        (tmp / TOKENIZER_META).write_text(json.dumps(meta, indent=1))
        old = directory.with_name(directory.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def find_model_dir(path: str | os.PathLike) -> Path:
    """A model folder, or a training run folder holding one (checkpoint/ or best/)."""
    path = Path(path)
    if not path.exists():
        raise CircuitlabError(f"model folder not found: {path}")
    for candidate in (path, path / "checkpoint", path / "best"):
        if (candidate / MODEL_FILE).is_file() and (candidate / CONFIG_FILE).is_file():
            return candidate
    raise CircuitlabError(f"{path} holds no circuitlab model (expected {MODEL_FILE} and {CONFIG_FILE}); "
                          "for a Hugging Face folder use `circuitlab import` first")


def load_model_dir(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """(model in eval mode, HF tokenizer or None, config.json dict) from a folder written by
    save_model_dir or the trainer. Weights are read straight into the model (no second copy).
    A tokenizer is returned when tokenizer/ holds HF files or a circuitlab BPE tokenizer
    (wrapped as a transformers PreTrainedTokenizerFast)."""
    folder = find_model_dir(path)
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text())
        cfg = ModelConfig.from_dict(meta["model"])
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file is the user's to fix
        raise CircuitlabError(f"{folder / CONFIG_FILE} is damaged or unreadable ({type(e).__name__}: {e})") from None
    model = uninitialised_model(cfg, device=device)
    params = dict(model.named_parameters())
    written = set()
    for key, reader in stream_tensors([folder / MODEL_FILE]):
        if key == "unembed.weight" and cfg.tied_embeddings:
            continue  # the same tensor as embed.weight
        if key not in params or tuple(params[key].shape) != reader.shape:
            raise CircuitlabError(f"the weights in {folder} do not match its config.json ({key}); "
                                  "was the folder edited by hand?")
        reader.read_into(params[key].data)
        written.add(key)
    missing = sorted(set(params) - written)
    if missing:
        raise CircuitlabError(f"{folder / MODEL_FILE} lacks {', '.join(missing[:3])}; the folder is incomplete")
    return model.eval(), load_tokenizer_as_hf(folder / TOKENIZER_DIR), meta


def load_tokenizer_as_hf(directory: Path):
    """The tokenizer saved in a model folder's tokenizer/, as a transformers tokenizer, or None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    if (directory / "tokenizer_config.json").is_file():
        return load_hf_tokenizer(directory)
    meta_path = directory / TOKENIZER_META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if meta.get("kind") == "bpe" and (directory / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        eos = "<|endoftext|>"  # circuitlab's BPE tokenizer separates documents with it
        return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), eos_token=eos, bos_token=eos)
    return None
