"""Where a Hugging Face checkpoint comes from, and reading its tensors one at a time.

    folder = resolve_checkpoint("gpt2")              # a local folder, or the hub (cache first)
    hf_config = read_hf_config(folder)               # config.json as a plain dict
    for key, reader in stream_tensors(weight_files(folder)):
        tensor = reader.read()                       # read only when asked for
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from circuitlab.errors import CircuitlabError
from circuitlab.model.loading import TensorReader, stream_safetensors

# What we fetch from the hub: config, weights in safetensors ("model*" only: some repos also hold
# the same weights in another layout, e.g. Mistral's consolidated.safetensors), the tokenizer.
_HUB_FILES = ["config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
              "tokenizer*", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json"]
_HUB_BIN_FILES = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def resolve_checkpoint(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                       revision: str | None = None) -> Path:
    """A local folder holding config.json and the weights.

    A path that exists is used as it is. Anything else is taken as a hub name ("gpt2",
    "EleutherAI/pythia-70m"): the local Hugging Face cache is tried first, then the network.
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CircuitlabError(f"{path} is a file; point at the checkpoint's folder (the one holding config.json)")
        return path
    name = str(name_or_path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        raise CircuitlabError(f"checkpoint folder not found: {name}; give an existing folder holding config.json "
                              "and the weights, or a Hugging Face hub name such as gpt2")
    return _from_hub(name, cache_dir, revision)


def _from_hub(name: str, cache_dir: str | os.PathLike | None, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CircuitlabError(f"{name!r} is not a local folder, and fetching it from the Hugging Face hub needs "
                              "huggingface_hub (pip install huggingface_hub); or pass a local copy's folder") from None

    def fetch(patterns: list[str]) -> Path:
        kwargs: dict[str, Any] = dict(repo_id=name, revision=revision, cache_dir=cache_dir, allow_patterns=patterns)
        try:
            return Path(snapshot_download(**kwargs, local_files_only=True))
        except Exception:  # noqa: BLE001 - not (completely) in the cache: try the network
            pass
        try:
            return Path(snapshot_download(**kwargs))
        except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated repo...
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
            raise CircuitlabError(
                f"{name!r} is not a local folder and could not be fetched from the Hugging Face hub "
                f"({reason[:200]}); without network access, "
                f"download it on another machine (hf download {name} --local-dir DIR), copy DIR "
                "here and pass DIR instead of the name") from None

    folder = fetch(_HUB_FILES)
    if not _safetensors_files(folder):
        folder = fetch(_HUB_FILES + _HUB_BIN_FILES)
    return folder


def read_hf_config(folder: Path) -> dict:
    """config.json of a Hugging Face checkpoint folder, as a dict."""
    path = folder / "config.json"
    if not path.is_file():
        raise CircuitlabError(f"{folder} has no config.json; point at a Hugging Face checkpoint folder "
                              "(as written by save_pretrained)")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CircuitlabError(f"could not read {path}: {e}") from None
    if not isinstance(config, dict):
        raise CircuitlabError(f"{path} does not hold a JSON object")
    return config


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return _files_from_index(index)
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def _files_from_index(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CircuitlabError(f"the shard index {index} is unreadable ({e}); re-download the checkpoint") from None
    files = [index.parent / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CircuitlabError(f"{index.parent} lacks the shard(s) {', '.join(missing[:3])} listed in {index.name}; "
                              "the download is incomplete, fetch the missing files")
    return files


def weight_files(folder: Path) -> list[Path]:
    """The weight shards of a checkpoint folder: safetensors if present, else pytorch_model*.bin."""
    files = _safetensors_files(folder)
    if files:
        return files
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        return _files_from_index(index)
    single = folder / "pytorch_model.bin"
    if single.is_file():
        return [single]
    raise CircuitlabError(f"{folder} holds no weights (model.safetensors, a sharded model.safetensors.index.json "
                          "or pytorch_model.bin); point at a complete Hugging Face checkpoint folder")


def stream_tensors(files: list[Path]) -> Iterator[tuple[str, TensorReader]]:
    """(name, reader) for every tensor of every shard, in file order; nothing is read until asked.

    safetensors shards are read straight into the destination's memory (circuitlab.model.loading);
    .bin shards are memory-mapped by torch.load where their format allows it.
    """
    for file in files:
        if file.suffix == ".safetensors":
            yield from stream_safetensors([file])
        else:
            yield from _stream_bin(file)


class LoadedTensor(TensorReader):
    """A tensor already in memory, handed over as a reader (a .bin shard's, or a GGUF file's dequantized)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.shape = tensor, tuple(tensor.shape)

    def read(self) -> torch.Tensor:
        return self.tensor


def _stream_bin(file: Path) -> Iterator[tuple[str, TensorReader]]:
    try:
        try:
            state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        except RuntimeError:  # the legacy (pre-zip) format cannot be memory-mapped
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CircuitlabError(f"could not read {file} ({type(e).__name__}: {e}); convert the checkpoint to "
                              "safetensors or re-download it") from None
    if not isinstance(state, dict):
        raise CircuitlabError(f"{file} does not hold a state dict of tensors")
    for key in list(state):
        yield key, LoadedTensor(state.pop(key))
