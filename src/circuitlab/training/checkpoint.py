"""Checkpoints are data: a directory with model.safetensors, config.json and the tokenizer,
plus (for resuming) optimizer.safetensors and trainer_state.json. Written atomically: the
directory is built under a temporary name and swapped in with renames.

    runs/NAME/checkpoint/   latest, resumable      runs/NAME/best/   best val loss (model only)
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer

MODEL_FILE, CONFIG_FILE, OPTIM_FILE, STATE_FILE, TOKENIZER_DIR = (
    "model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json", "tokenizer")


def save_checkpoint(directory: str | Path, model: Transformer, tokenizer=None, run_config: dict | None = None,
                    optimizer: torch.optim.Optimizer | None = None, state: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint directory atomically; returns its path."""
    from circuitlab.data import save_tokenizer

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        # Tied weights share storage; safetensors refuses shared tensors, so store each once.
        tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        if model.cfg.tied_embeddings:
            tensors.pop("unembed.weight", None)
        save_file(tensors, str(tmp / MODEL_FILE))
        meta = {"model": model.cfg.to_dict(), "run": run_config or {}, "format": "circuitlab-checkpoint-1"}
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp / TOKENIZER_DIR)
        if optimizer is not None:
            opt_tensors, opt_meta = _flatten_optimizer(optimizer)
            save_file(opt_tensors, str(tmp / OPTIM_FILE))
            state = {**(state or {}), "optimizer": opt_meta}
        if state is not None:
            rng = {"torch_rng": torch.get_rng_state()}
            if torch.cuda.is_available():
                rng["cuda_rng"] = torch.cuda.get_rng_state()
            save_file(rng, str(tmp / "rng.safetensors"))
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
        _swap_in(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def _swap_in(tmp: Path, directory: Path) -> None:
    old = directory.with_name(directory.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(path: str | Path) -> Path:
    """Accept a run directory (uses its checkpoint/ or best/) or a checkpoint directory."""
    path = Path(path)
    if not path.exists():
        raise CircuitlabError(f"checkpoint not found: {path}")
    for candidate in (path, path / "checkpoint", path / "best", path.with_name(path.name + ".old")):
        if (candidate / MODEL_FILE).is_file() and (candidate / CONFIG_FILE).is_file():
            return candidate
    raise CircuitlabError(f"{path} holds no checkpoint (expected {MODEL_FILE} and {CONFIG_FILE})")


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu"):
    """Load (model, tokenizer or None, meta dict) from a checkpoint or run directory."""
    from circuitlab.data import load_tokenizer

    ckpt = find_checkpoint(path)
    try:
        meta = json.loads((ckpt / CONFIG_FILE).read_text())
        cfg = ModelConfig.from_dict(meta["model"])
        tensors = load_file(str(ckpt / MODEL_FILE), device=str(device))
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt file is the user's to fix
        raise CircuitlabError(f"checkpoint {ckpt} is corrupt or unreadable: {e}") from None
    model = Transformer(cfg).to(device)
    if cfg.tied_embeddings:
        tensors.setdefault("unembed.weight", tensors["embed.weight"])
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise CircuitlabError(f"checkpoint {ckpt} does not match its config: {e}") from None
    tokenizer = load_tokenizer(ckpt / TOKENIZER_DIR) if (ckpt / TOKENIZER_DIR).exists() else None
    return model.eval(), tokenizer, meta


def load_training_state(ckpt: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore optimizer and RNG from a checkpoint; returns trainer_state.json."""
    try:
        state = json.loads((ckpt / STATE_FILE).read_text())
        _unflatten_optimizer(optimizer, load_file(str(ckpt / OPTIM_FILE)), state.pop("optimizer"))
        rng = load_file(str(ckpt / "rng.safetensors"))
    except FileNotFoundError as e:
        raise CircuitlabError(f"{ckpt} cannot be resumed: {Path(e.filename).name} is missing") from None
    except Exception as e:  # noqa: BLE001
        raise CircuitlabError(f"{ckpt} cannot be resumed, its training state is corrupt: {e}") from None
    torch.set_rng_state(rng["torch_rng"])
    if "cuda_rng" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda_rng"])
    return state


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, pstate in sd["state"].items():
        for key, value in pstate.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict[str, Any]] = {}
    for flat, value in list(tensors.items()) + list(meta["scalars"].items()):
        idx, key = flat.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
