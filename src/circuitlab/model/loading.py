"""Filling a Transformer from tensor files without a random init first.

    model = uninitialised_model(cfg)                      # parameters allocated, never written
    for key, reader in stream_safetensors([path]):
        reader.read_into(dict(model.named_parameters())[key].data)

Used by circuitlab's own checkpoints (training.checkpoint) and by the Hugging Face importer, so a
model is read once, tensor by tensor, straight into its place: peak memory is the model plus at
most one converted tensor.
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from io import FileIO
from pathlib import Path

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model.components import Rotary
from circuitlab.model.storage import resolve_dtypes
from circuitlab.model.transformer import Transformer, check_device


def uninitialised_model(cfg: ModelConfig, dtype: str | torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", compute_dtype: str | torch.dtype | None = None
                        ) -> Transformer:
    """A Transformer whose parameters hold garbage, to be filled from a checkpoint; buffers are computed.

    Built on the meta device (no memory, no init), then given real but unwritten storage, which
    costs neither time nor resident memory until the weights are read in. dtype: the storage dtype of the
    weight matrices; compute_dtype: what it computes in (storage.resolve_dtypes: float32 on a CPU for half
    storage); both checked before anything is allocated.
    """
    device = check_device(device)
    storage, compute = resolve_dtypes(dtype, compute_dtype, device)
    with torch.device("meta"):
        model = Transformer(cfg).to(storage)
    model.to_empty(device=device)
    if cfg.tied_embeddings:  # moving off the meta device makes a new tensor per module: tie them again
        model.unembed.weight = model.embed.weight
    rotaries = [m for m in model.modules() if isinstance(m, Rotary)]
    fresh: dict[bool, Rotary] = {}
    for rotary in rotaries:  # the cos/sin tables are computed, not stored: compute them for real
        if rotary.local not in fresh:
            with torch.device(device):
                fresh[rotary.local] = Rotary(cfg, local=rotary.local)
        for name, table in fresh[rotary.local].named_buffers():
            setattr(rotary, name, table)
    return model.set_dtypes(storage, compute)  # vectors (biases, gains) to the compute dtype


def stored_dtype(files: list[Path]) -> torch.dtype | None:
    """The dtype the largest floating tensor of the first safetensors file is stored in (the weights' storage
    dtype), read from its header alone; None when it holds no floating tensor."""
    shard = _SafetensorsShard(Path(files[0]))
    floats = [(math.prod(e["shape"]), _SAFETENSORS_DTYPES[e["dtype"]]) for e in shard.header.values()
              if _SAFETENSORS_DTYPES[e["dtype"]].is_floating_point]
    return max(floats, key=lambda f: f[0])[1] if floats else None


class TensorReader:
    """One checkpoint tensor, not yet read: its shape, and two ways to read it."""

    shape: tuple[int, ...]

    def read(self) -> torch.Tensor:
        """The whole tensor, in the checkpoint's dtype."""
        raise NotImplementedError

    def read_into(self, dest: torch.Tensor) -> None:
        """Copy the tensor into dest (same shape, any dtype) without holding a second full copy."""
        dest.copy_(self.read())


def stream_safetensors(files: list[Path]) -> Iterator[tuple[str, TensorReader]]:
    """(name, reader) for every tensor of every safetensors file, in file order; nothing is read
    until asked. Reads are plain file reads straight into the destination's memory (no memory map,
    so the file's pages never count against our resident memory)."""
    for file in files:
        yield from _SafetensorsShard(Path(file)).tensors()


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
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as e:
            raise CircuitlabError(f"could not read {file} ({e}); the file is corrupt or incomplete, "
                                  "write or download it again") from None

    def tensors(self) -> Iterator[tuple[str, TensorReader]]:
        with open(self.file, "rb", buffering=0) as f:
            for key, entry in sorted(self.header.items(), key=lambda item: item[1]["data_offsets"][0]):
                yield key, _SafetensorsTensor(f, self.data_start, entry, self.file)


class _SafetensorsTensor(TensorReader):
    def __init__(self, f: FileIO, data_start: int, entry: dict, file: Path) -> None:
        self.f, self.file = f, file
        self.shape = tuple(entry["shape"])
        self.dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        self.offset, self.nbytes = data_start + begin, end - begin
        if self.nbytes != math.prod(self.shape) * self.dtype.itemsize:
            raise CircuitlabError(f"{file} is damaged: a tensor's size does not match its shape; "
                                  "write or download it again")

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
        # numpy's stubs give ndarray __buffer__ only on Python >= 3.12 (the checker targets 3.10)
        view = memoryview(out.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        self.f.seek(offset)
        done = 0
        while done < len(view):
            n = self.f.readinto(view[done:])
            if not n:
                raise CircuitlabError(f"{self.file} ends early; the file is truncated, write or download it again")
            done += n
