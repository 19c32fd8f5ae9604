"""One policy for every command that writes a folder (circuit, steer --out, sae dashboards, lens train,
and what comes next: graphs, traces, CLTs).

    out = default_out(args.checkpoint, "circuit")               # never inside a checkpoint folder
    kept = output_folder(out, "circuit", overwrite=args.overwrite)
    ... write into out ...

output_folder makes `out` ready and marks it as a `kind` output (a small MARKER file written first, so a
folder an interrupt cut short is still recognised as ours). Before that:
  absent or empty            -> created;
  an earlier `kind` output   -> set aside as OUT.YYYYmmdd-HHMMSS (returned), or deleted with overwrite=True,
                                or refused when keep_previous=False and overwrite is not given;
  anything else              -> refused in one line (not ours to move);
  a checkpoint folder, or a folder inside one -> refused: a checkpoint save replaces the whole folder,
                                which would delete what was written there.
Commands that continue an earlier output (training with --resume) check for that themselves first and
call output_folder only for a fresh start.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from circuitlab.atomic import atomic_write_text, json_text, set_aside
from circuitlab.errors import CircuitlabError, command_line
from circuitlab.training.checkpoint import is_checkpoint

MARKER = ".circuitlab-output.json"


def output_kind(folder: str | Path) -> str | None:
    """The kind of output `folder` holds according to its marker ("circuit", "steer", ...), or None."""
    try:
        return json.loads((Path(folder) / MARKER).read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def inside_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint folder that `folder` is (or lies inside), or None."""
    p = Path(folder).resolve()
    for candidate in (p, *p.parents):
        if is_checkpoint(candidate):
            return candidate
    return None


def default_out(model_path: str | Path, name: str) -> Path:
    """Where a command reading the model at `model_path` writes by default: <run folder>/<name> for a run
    folder, beside a checkpoint folder (<parent>/<checkpoint name>-<name>) for a checkpoint folder, so that
    a later checkpoint save (which replaces its folder) never deletes it."""
    p = Path(model_path)
    if is_checkpoint(p) or inside_checkpoint(p) is not None:
        return p.parent / f"{p.name}-{name}"
    return p / name


def _plan(out: Path, kind: str, overwrite: bool, keep_previous: bool,
          is_previous: Callable[[Path], bool] | None, option: str) -> str:
    """What output_folder will do with `out`: "fresh", "remove" or "set aside"; refusals raise."""
    ckpt = inside_checkpoint(out)
    if ckpt is not None:
        raise CircuitlabError(f"{out} is inside the checkpoint folder {ckpt}, which a checkpoint save replaces as a "
                              f"whole; give another {option} (e.g. {default_out(ckpt, kind)})")
    if out.exists() and not out.is_dir():
        raise CircuitlabError(f"{out} is a file; give a folder for the {kind} output ({option})")
    check_writable(out, f"the {kind} output", option)
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not held or (held == [MARKER] and output_kind(out) == kind):
        return "fresh"  # absent, empty, or an earlier run of ours that stopped before writing anything
    if not (output_kind(out) == kind or (is_previous is not None and is_previous(out))):
        shown = ", ".join(held[:4])
        raise CircuitlabError(f"{out} already holds other files ({shown}); give a new or empty folder for the "
                              f"{kind} output ({option})")
    if overwrite:
        return "remove"
    if not keep_previous:
        raise CircuitlabError(f"{out} already holds a {kind} output: pass --overwrite to replace it, "
                              f"or give another {option}")
    return "set aside"


def check_writable(out: str | Path, what: str, option: str = "--out") -> None:
    """Refuse, before any work, a folder `out` that cannot be made or replaced: its nearest existing parent
    must take a new entry (tried with an empty temporary folder, removed at once: permission bits do not
    tell for root or for file systems like /proc)."""
    out = Path(out).absolute()
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CircuitlabError(f"cannot write {what} to {out}: part of the path is a file, not a folder ({parent}); "
                              f"give another {option}")
    try:
        before = parent.stat()
        os.rmdir(tempfile.mkdtemp(prefix=".circuitlab-probe-", dir=parent))
        with contextlib.suppress(OSError):   # leave no trace, not even the folder's modification time
            os.utime(parent, ns=(before.st_atime_ns, before.st_mtime_ns))
    except OSError as e:
        raise CircuitlabError(f"cannot write {what} to {out}: {parent} does not take new files "
                              f"({e.strerror or type(e).__name__}); give another {option}") from None


def check_output_folder(out: str | Path, kind: str, *, overwrite: bool = False, keep_previous: bool = True,
                        is_previous: Callable[[Path], bool] | None = None, option: str = "--out") -> None:
    """Refuse now what output_folder would refuse, touching nothing: call it before long work whose
    output goes to `out`, then output_folder when the results are ready."""
    _plan(Path(out), kind, overwrite, keep_previous, is_previous, option)


def output_folder(out: str | Path, kind: str, *, overwrite: bool = False, keep_previous: bool = True,
                  is_previous: Callable[[Path], bool] | None = None, option: str = "--out") -> Path | None:
    """Make `out` ready for a new `kind` output (see the module docstring); returns where an earlier one was
    set aside, or None. is_previous: also recognise earlier outputs written before the marker existed.
    option: the flag that names the folder, for messages."""
    out = Path(out)
    plan = _plan(out, kind, overwrite, keep_previous, is_previous, option)
    kept = None
    if plan == "remove":
        shutil.rmtree(out)
    elif plan == "set aside":
        kept = set_aside(out, lambda _: True, f"{kind} output")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / MARKER, json_text({"kind": kind, "command": command_line()}) + "\n")
    return kept
