"""Atomic file writes: write to a temp file in the same folder, then os.replace, so a file is
either absent, old, or complete (caches, checkpoints, exports, reports).

Several processes (e.g. DDP ranks) may build the same cache entry at once; each
writes identical bytes and the last os.replace wins, so readers never see a
half-written file.
"""

import os
import tempfile
from pathlib import Path

import numpy as np


def _replace_from_temp(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_file(path: Path, write) -> None:
    """write(temp_path: str) for writers that take a path (e.g. safetensors' save_file), then rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that `path` is either absent, old, or complete."""
    _replace_from_temp(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_array(path: Path, arr: np.ndarray) -> None:
    """Write the raw bytes of a 1-D array (read back with np.memmap)."""
    _replace_from_temp(path, lambda f: np.ascontiguousarray(arr).tofile(f))
