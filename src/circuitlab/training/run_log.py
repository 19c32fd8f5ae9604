"""Reading metrics.jsonl, a training run's append-only log (written by training.sinks): one JSON record
per line ({"step", "tokens", ...}).

A kill or a full disk during an append leaves a torn last line; readers drop it and say so once
(a warning), and a resumed run cuts it off before appending. A damaged line anywhere else is an
error naming it, since that is not what a crash leaves.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import CircuitlabError

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of run_dir/metrics.jsonl (run_dir may also be the log file itself); [] if absent."""
    path = _log_path(run_dir)
    if not path.is_file():
        return []
    return _parse(path, path.read_text(encoding="utf-8", errors="replace"))


def truncate_metrics(run_dir: str | Path, after_step: int) -> None:
    """Keep only the records up to after_step (a resumed run's checkpoint step), so the curve has no
    duplicated steps and no torn line; after_step 0 empties the log. run_dir may be the .jsonl itself."""
    path = _log_path(run_dir)
    if path.is_file():
        keep = [r for r in read_metrics(path) if r.get("step", 0) <= after_step] if after_step else []
        atomic_write_text(path, "".join(json_text(r) + "\n" for r in keep))


def _log_path(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    return path if path.suffix == ".jsonl" else path / METRICS_FILE


class MetricsLog:
    """metrics.jsonl written as a run goes, for any long job (model, dictionary, lens training; graphs):

        with MetricsLog(out, resume_step=step) as log:     # step: the checkpoint a resume starts from
            log.write({"step": 10, "loss": 2.3})

    Each record is one line, flushed to the OS as soon as it is written, so a SIGKILL keeps every
    completed line (a torn last one is dropped by readers). Opening drops the records after
    resume_step (0: a fresh start empties the log), so after a resume each step appears exactly once.
    """

    def __init__(self, run_dir: str | Path, resume_step: int = 0) -> None:
        self.path = _log_path(run_dir)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_metrics(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json_text(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _parse(path: Path, text: str) -> list[dict[str, Any]]:
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError:
            if all(not rest.strip() for rest in lines[number:]):  # the last line: torn by a crash
                warnings.warn(f"{path}: dropped a torn last line (line {number}), left by an interrupted write",
                              stacklevel=3)
                break
            raise CircuitlabError(f"{path} line {number} is damaged (not a JSON record); "
                                  "delete that line to read the rest") from None
        records.append(record)
    return records
