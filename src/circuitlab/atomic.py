"""Atomic file and folder writes: write to a temp file (or folder) beside the target, then rename,
so a file is either absent, old, or complete (caches, checkpoints, exports, reports).

Several processes (e.g. DDP ranks) may build the same cache entry at once; each
writes identical bytes and the last os.replace wins, so readers never see a
half-written file. Files and folders get the permissions a plain open() / mkdir() would give
(0666 / 0777 less the umask), not the private 0600 / 0700 of tempfile's.
"""

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import numpy as np

from circuitlab.errors import CircuitlabError


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _replace_from_temp(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
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
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that `path` is either absent, old, or complete."""
    _replace_from_temp(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def json_text(obj: Any, **kw: Any) -> str:
    """`obj` as strict JSON (RFC 8259: no NaN or Infinity, which strict readers, browsers' JSON.parse
    included, refuse): every non-finite number becomes null, as JavaScript's JSON.stringify writes it,
    so a reader sees "no value" where a ratio had no denominator or a loss diverged. The one encoder of
    every JSON file and line circuitlab writes (a test walks the library for any other). kw: json.dumps's
    (indent, sort_keys, default, ...)."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)   # the common case: one pass in C
    except ValueError as e:
        if "out of range float" not in str(e).lower():
            raise
    return json.dumps(_finite(obj, kw.get("default")), allow_nan=False, **kw)


def _finite(x: Any, default: Any) -> Any:
    """x with every non-finite float (at any depth; objects through `default` first) replaced by None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, dict):
        return {k: _finite(v, default) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v, default) for v in x]
    return _finite(default(x), default) if default is not None else x


def atomic_write_json(path: Path, obj: Any, **kw: Any) -> None:
    """Write `obj` as strict JSON (json_text) atomically."""
    atomic_write_text(path, json_text(obj, **kw))


def atomic_write_array(path: Path, arr: np.ndarray) -> None:
    """Write the raw bytes of a 1-D array (read back with np.memmap)."""
    _replace_from_temp(path, lambda f: np.ascontiguousarray(arr).tofile(f))


def old_copy(directory: Path) -> Path:
    """Where replace_dir keeps the previous folder while it swaps a new one in."""
    directory = Path(directory)
    return directory.with_name(directory.name + ".old")


@contextlib.contextmanager
def atomic_dir(directory: Path) -> Iterator[Path]:
    """Build a folder under a temporary name, then swap it in for `directory` (see replace_dir).

        with atomic_dir(run / "checkpoint") as tmp:
            (tmp / "model.safetensors").write_bytes(...)

    On an error (or Ctrl-C) the temporary folder is removed and `directory` is untouched.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        yield tmp
        _plain_modes(tmp)
        replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in directory.parent.glob(f".{directory.name}.tmp-*"):  # left by saves a crash cut short
        shutil.rmtree(stale, ignore_errors=True)


def _plain_modes(folder: Path) -> None:
    """Give a folder built in a temp dir the modes plain mkdir / open would have (some writers, e.g.
    safetensors' save_file, create their files 0600)."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def replace_dir(tmp: Path, directory: Path) -> None:
    """Swap the complete folder `tmp` in for `directory`.

    At every moment a complete folder exists as `directory` or as `directory.old` (old_copy): the
    previous one is renamed aside, the new one renamed in, and only then is the previous one
    deleted. A crash between the two renames leaves `directory.old`, which readers fall back to;
    a `.old` is deleted only once a newer complete `directory` exists.
    """
    old = old_copy(directory)
    if directory.exists():
        if old.exists():
            shutil.rmtree(old)  # directory is complete, so the older copy is not needed
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def check_set_aside(out: Path, is_previous_output: Callable[[Path], bool], what: str) -> bool:
    """Refuse now what set_aside would refuse, touching nothing (call it before long work); True when there is
    an earlier output that set_aside would move."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CircuitlabError(f"{out} is a file; give a folder for the {what}")
    if not out.exists() or not any(out.iterdir()):
        return False
    if not is_previous_output(out):
        shown = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        raise CircuitlabError(f"{out} already holds other files ({shown}); give a new or empty folder for the {what}")
    return True


def set_aside(out: Path, is_previous_output: Callable[[Path], bool], what: str) -> Path | None:
    """Make room for a new output folder without losing or mixing in an earlier one.

    Absent or empty: nothing to do. Holding an earlier output of the same kind (is_previous_output):
    it is renamed to OUT.YYYYmmdd-HHMMSS, which is returned. Holding anything else: refused, since
    it is not ours to move. `what` names the output in the message ("interpret results").
    """
    out = Path(out)
    if not check_set_aside(out, is_previous_output, what):
        return None
    kept = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while kept.exists():
        kept, n = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    out.rename(kept)
    return kept
