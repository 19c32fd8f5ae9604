"""Where a Hugging Face checkpoint comes from, and reading its tensors one at a time.

    folder = resolve_checkpoint("gpt2")              # a local folder, or the hub (cache first)
    hf_config = read_hf_config(folder)               # config.json as a plain dict
    for key, reader in stream_tensors(weight_files(folder)):
        tensor = reader.read()                       # read only when asked for
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

from circuitlab.errors import CircuitlabError

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
        kwargs = dict(repo_id=name, revision=revision, cache_dir=cache_dir, allow_patterns=patterns)
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


class TensorReader:
    """One checkpoint tensor, not yet read: its shape, and two ways to read it."""

    shape: tuple[int, ...]

    def read(self) -> torch.Tensor:
        """The whole tensor, in the checkpoint's dtype."""
        raise NotImplementedError

    def read_into(self, dest: torch.Tensor) -> None:
        """Copy the tensor into dest (same shape, any dtype) without holding a second full copy."""
        dest.copy_(self.read())


def stream_tensors(files: list[Path]) -> Iterator[tuple[str, TensorReader]]:
    """(name, reader) for every tensor of every shard, in file order; nothing is read until asked.

    safetensors shards are read with plain file reads straight into the destination's memory
    (no memory map, so the file's pages never count against our resident memory); .bin shards
    are memory-mapped by torch.load where their format allows it.
    """
    for file in files:
        if file.suffix == ".safetensors":
            yield from _SafetensorsShard(file).tensors()
        else:
            yield from _stream_bin(file)


# safetensors' dtype names (https://github.com/huggingface/safetensors, format: 8-byte little-endian
# header length, JSON header {name: {dtype, shape, data_offsets}}, then the raw little-endian data)
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}
_CHUNK_BYTES = 32 * 2**20  # converting reads (e.g. bf16 -> fp32) go through a buffer this large


class _SafetensorsShard:
    def __init__(self, file: Path) -> None:
        self.file = file
        try:
            with open(file, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100 * 2**20:
                    raise ValueError(f"header length {n} is implausible")
                self.header = json.loads(f.read(n))
            self.data_start = 8 + n
            self.header.pop("__metadata__", None)
            for entry in self.header.values():
                if entry["dtype"] not in _SAFETENSORS_DTYPES:
                    raise ValueError(f"unsupported dtype {entry['dtype']}")
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            raise CircuitlabError(f"could not read {file} ({e}); the file is damaged or incomplete, "
                                  "re-download it") from None

    def tensors(self) -> Iterator[tuple[str, TensorReader]]:
        with open(self.file, "rb", buffering=0) as f:
            for key, entry in sorted(self.header.items(), key=lambda item: item[1]["data_offsets"][0]):
                yield key, _SafetensorsTensor(f, self.data_start, entry, self.file)


class _SafetensorsTensor(TensorReader):
    def __init__(self, f, data_start: int, entry: dict, file: Path) -> None:
        self.f, self.file = f, file
        self.shape = tuple(entry["shape"])
        self.dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        self.offset, self.nbytes = data_start + begin, end - begin
        if self.nbytes != math.prod(self.shape) * self.dtype.itemsize:
            raise CircuitlabError(f"{file} is damaged: a tensor's size does not match its shape; re-download it")

    def read(self) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        self._read_bytes(out, self.offset)
        return out

    def read_into(self, dest: torch.Tensor) -> None:
        if dest.dtype == self.dtype and dest.is_contiguous() and dest.device.type == "cpu":
            self._read_bytes(dest, self.offset)  # straight into place: no copy at all
            return
        flat = dest.view(-1) if dest.is_contiguous() else None
        if flat is None:
            dest.copy_(self.read())
            return
        step = max(1, _CHUNK_BYTES // self.dtype.itemsize)
        buffer = torch.empty(min(step, flat.numel()), dtype=self.dtype)
        for start in range(0, flat.numel(), step):
            n = min(step, flat.numel() - start)
            self._read_bytes(buffer[:n], self.offset + start * self.dtype.itemsize)
            flat[start:start + n].copy_(buffer[:n])

    def _read_bytes(self, out: torch.Tensor, offset: int) -> None:
        """Fill the contiguous CPU tensor out with the bytes at offset."""
        if out.numel() == 0:
            return
        view = memoryview(out.view(-1).view(torch.uint8).numpy())
        self.f.seek(offset)
        done = 0
        while done < len(view):
            n = self.f.readinto(view[done:])
            if not n:
                raise CircuitlabError(f"{self.file} ends early; the file is truncated, re-download it")
            done += n


class _LoadedTensor(TensorReader):
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
        yield key, _LoadedTensor(state.pop(key))
