"""circuitlab's one checkpoint format, written by the trainer and by `circuitlab import`, read by
training (resume), generate, interpret, serve, export and the report:

    DIR/model.safetensors       the state dict (a tied unembedding is stored once, as embed.weight)
    DIR/config.json             {"format": FORMAT, "model": ModelConfig.to_dict(), "run": run config, ...extra}
    DIR/tokenizer/              the tokenizer (circuitlab.data.save_tokenizer), when there is one
    DIR/optimizer.safetensors, rng.safetensors, trainer_state.json      for resuming training

A run folder holds checkpoint/ (latest, resumable), best/ (best val loss, model only) and
metrics.jsonl (see circuitlab.training.run_log). A folder is built under a temporary name and
swapped in (circuitlab.atomic.atomic_dir), so a crash leaves either the new checkpoint or the
previous one, possibly as checkpoint.old, which find_checkpoint falls back to.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_dir, json_text, old_copy
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer
from circuitlab.model.loading import stored_dtype, stream_safetensors, uninitialised_model
from circuitlab.model.storage import HALF

FORMAT = "circuitlab-checkpoint-1"
MODEL_FILE, CONFIG_FILE, OPTIM_FILE, RNG_FILE, STATE_FILE, TOKENIZER_DIR = (
    "model.safetensors", "config.json", "optimizer.safetensors", "rng.safetensors", "trainer_state.json",
    "tokenizer")


def save_checkpoint(directory: str | Path, model: Transformer, tokenizer=None, run_config: dict | None = None,
                    optimizer: torch.optim.Optimizer | None = None, state: dict[str, Any] | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint folder atomically; returns its path.

    tokenizer: a circuitlab Tokenizer or a transformers tokenizer. optimizer and state (a JSON-able
    dict, e.g. {"step": ...}) make it resumable. extra: more entries for config.json (e.g.
    {"source": ...}). An existing folder is replaced only if it is a checkpoint.
    """
    from circuitlab.data import save_tokenizer

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CircuitlabError(f"{directory} is a file; choose a folder for the model")
    if directory.is_dir() and any(directory.iterdir()) and not is_checkpoint(directory):
        raise CircuitlabError(f"{directory} exists and is not a circuitlab model folder; choose a new or empty folder")
    with atomic_dir(directory) as tmp:
        # Tied weights share storage; safetensors refuses shared tensors, so store each once.
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        if model.cfg.tied_embeddings:
            tensors.pop("unembed.weight", None)
        save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
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
            save_file(rng, str(tmp / RNG_FILE))
            (tmp / STATE_FILE).write_text(json_text(state, indent=2))
        meta = {**(extra or {}), "model": model.cfg.to_dict(), "run": run_config or {}, "format": FORMAT}
        (tmp / CONFIG_FILE).write_text(json_text(meta, indent=2))
    return directory


def is_checkpoint(folder: Path) -> bool:
    return (folder / MODEL_FILE).is_file() and (folder / CONFIG_FILE).is_file()


def find_checkpoint(path: str | Path, resumable: bool = False) -> Path:
    """The checkpoint folder for `path`: a checkpoint folder, or a run folder (its checkpoint/,
    else best/). A save cut short by a crash leaves NAME.old, used (with a warning) when NAME is
    missing. resumable: only checkpoints that training can continue (checkpoint/, not best/)."""
    path = Path(path)
    names = ["checkpoint"] if resumable else ["checkpoint", "best"]
    candidates = [path, old_copy(path)] + [c for n in names for c in (path / n, old_copy(path / n))]
    for candidate in candidates:
        if is_checkpoint(candidate) and not (resumable and not (candidate / STATE_FILE).is_file()):
            if candidate.name.endswith(".old"):
                warnings.warn(f"using {candidate}: a save was cut short before its replacement was in place",
                              stacklevel=2)
            return candidate
    if not path.exists() and not old_copy(path).exists():
        raise CircuitlabError(f"checkpoint not found: {path}")
    if resumable:
        raise CircuitlabError(f"{path} holds no checkpoint to resume (training stopped before its first save?); "
                              "run without --resume to start again")
    raise CircuitlabError(f"{path} holds no checkpoint (expected {MODEL_FILE} and {CONFIG_FILE}); "
                          "for a Hugging Face folder use `circuitlab import` first")


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """config.json of the checkpoint at `path` (see find_checkpoint), as a dict with "model"."""
    folder = find_checkpoint(path)
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text())
        ModelConfig.from_dict(meta["model"])
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file is the user's to fix
        raise CircuitlabError(f"{folder / CONFIG_FILE} is damaged or unreadable ({type(e).__name__}: {e})") from None
    return meta


def read_trainer_state(path: str | Path) -> dict[str, Any] | None:
    """trainer_state.json ({"step", "tokens_seen", "best_val_loss", ...}) of a checkpoint, or None."""
    file = find_checkpoint(path) / STATE_FILE
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CircuitlabError(f"{file} is damaged or unreadable ({e})") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                    compute_dtype: str | torch.dtype | None = None):
    """(model in eval mode, circuitlab Tokenizer or None, config.json dict) from a checkpoint or run
    folder. Weights are read straight into the model, tensor by tensor (no random init, no copy).

    dtype: the storage dtype of the weights (default: the file's own when it is bfloat16 or float16, so a
    model imported in half precision stays half the size; float32 otherwise); compute_dtype: what it computes
    in (default: float32 on a CPU, the storage dtype on a GPU).
    """
    from circuitlab.data import load_tokenizer

    folder = find_checkpoint(path)
    meta = read_checkpoint_meta(folder)
    cfg = ModelConfig.from_dict(meta["model"])
    if dtype is None:  # half-precision files stay half; anything else loads as float32, as it always has
        stored = stored_dtype([folder / MODEL_FILE])
        dtype = stored if stored in HALF else torch.float32
    model = uninitialised_model(cfg, dtype, device, compute_dtype)
    params = dict(model.named_parameters())  # a tied unembedding appears once, as embed.weight
    written = set()
    for key, reader in stream_safetensors([folder / MODEL_FILE]):
        if key == "unembed.weight" and cfg.tied_embeddings:
            continue  # older checkpoints may hold both copies
        if key not in params or tuple(params[key].shape) != reader.shape:
            raise CircuitlabError(f"the weights in {folder} do not match its config.json ({key}); "
                                  "was the folder edited by hand?")
        reader.read_into(params[key].data)
        written.add(key)
    missing = sorted(set(params) - written)
    if missing:
        raise CircuitlabError(f"{folder / MODEL_FILE} lacks {', '.join(missing[:3])}; the folder is incomplete")
    tokenizer = load_tokenizer(folder / TOKENIZER_DIR) if (folder / TOKENIZER_DIR).is_dir() else None
    return model.eval(), tokenizer, meta


def load_training_state(ckpt: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore optimizer and RNG from a checkpoint; returns trainer_state.json."""
    try:
        state = json.loads((ckpt / STATE_FILE).read_text())
        _unflatten_optimizer(optimizer, load_file(str(ckpt / OPTIM_FILE)), state.pop("optimizer"))
        rng = load_file(str(ckpt / RNG_FILE))
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
