"""Dictionary weights memory-mapped from their safetensors file: read from disk when a layer uses them.

    mapped = MappedSafetensors(folder / "dictionary.safetensors")
    tensors = mapped.tensors()        # {name: tensor backed by the file's pages (copy-on-write, never written back)}
    mapped.check()                    # before each use: one CircuitlabError if the file was truncated or replaced

The pages are file-backed and clean, so the kernel can drop them under memory pressure and read them again
when they are next used: a set of transcoders larger than the free memory still runs (at disk speed). The
file must not change while mapped; truncating a mapped file would crash the process on the next read
(SIGBUS), so its size, modification time and header are compared with the ones seen at opening before every
use, and a change is one line asking to load it again.

safetensors format: 8-byte little-endian header length n, a JSON header {name: {dtype, shape, data_offsets}},
then the raw little-endian data (offsets relative to byte 8 + n).
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import torch

from circuitlab.errors import CircuitlabError

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class MappedSafetensors:
    """One safetensors file, mapped read-only (copy-on-write) and watched for changes."""

    def __init__(self, file: str | Path) -> None:
        self.file = Path(file)
        try:
            stat = os.stat(self.file)
            with open(self.file, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100 * 2**20 or 8 + n > stat.st_size:
                    raise ValueError(f"header length {n} does not fit the file's {stat.st_size} bytes")
                self._header_bytes = f.read(n)
            header = json.loads(self._header_bytes)
        except (OSError, ValueError, struct.error) as e:
            raise CircuitlabError(f"could not map {self.file} ({e}); the file is corrupt or incomplete, "
                                  "write or download it again") from None
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + n
        self.entries = header
        self._seen = (stat.st_size, stat.st_mtime_ns)
        end = max((e["data_offsets"][1] for e in header.values()), default=0)
        if self.data_start + end > stat.st_size:
            raise CircuitlabError(f"{self.file} is truncated: its header describes {self.data_start + end} bytes, "
                                  f"the file has {stat.st_size}; write or download it again")
        self._map = np.memmap(self.file, dtype=np.uint8, mode="c", shape=(stat.st_size,)) if stat.st_size else None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor, backed by the mapped pages where its bytes are aligned for its dtype (else copied: only
        small vectors after an odd-length half-precision tensor)."""
        out = {}
        for name, e in self.entries.items():
            dtype = _DTYPES.get(e["dtype"])
            begin, end = e["data_offsets"]
            if dtype is None or end - begin != math.prod(e["shape"]) * dtype.itemsize:
                raise CircuitlabError(f"{self.file} is damaged: tensor {name} has an unreadable dtype or size; "
                                      "write or download it again")
            if end > begin:
                assert self._map is not None  # the tensor has bytes, so the file does and is mapped
                raw = torch.from_numpy(self._map[self.data_start + begin:self.data_start + end])
            else:
                raw = torch.empty(0, dtype=torch.uint8)
            if (self.data_start + begin) % dtype.itemsize:
                raw = raw.clone()
            out[name] = raw.view(dtype).reshape(e["shape"])
        return out

    def check(self) -> None:
        """One CircuitlabError when the file is not the one mapped any more (truncated, rewritten, replaced)."""
        try:
            stat = os.stat(self.file)
        except OSError as e:
            raise CircuitlabError(f"the memory-mapped dictionary file {self.file} is gone ({e.strerror}); "
                                  "load the dictionary again") from None
        header = None
        if (stat.st_size, stat.st_mtime_ns) == self._seen:  # same size and time: the header too (a few KB)
            try:
                with open(self.file, "rb") as f:
                    f.seek(8)
                    header = f.read(len(self._header_bytes))
            except OSError:
                pass
            if header == self._header_bytes:
                return
        what = (f"truncated from {self._seen[0]} to {stat.st_size} bytes" if stat.st_size < self._seen[0]
                else "changed")
        raise CircuitlabError(f"the memory-mapped dictionary file {self.file} was {what} while in use; "
                                  "load the dictionary again (or load it without --mmap to hold it in memory)")
