"""Metric sinks: where training records go. metrics.jsonl always; TensorBoard and Weights & Biases
when asked (``--set train.log=tensorboard``, ``wandb``, or both: ``tensorboard,wandb``).

A record is one flat-ish dict with a ``step``: ``{"step": 200, "tokens": 819200, "loss": 2.31,
"induction": [[0.02, 0.91], ...]}``. The JSONL sink writes it as is; the others turn it into scalars
(``flat_scalars``): numbers by name, dicts nested with "/", ``[layer][head]`` tables as
``induction/L1H0``. Any trainer can reuse them (the dictionary trainer does):

    with open_sinks(out_dir, "jsonl,tensorboard", run_name="sae", config=cfg.to_dict()) as sinks:
        sinks.write({"step": 10, "mse": 0.12, "l0": 31.5})
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from circuitlab.atomic import json_text
from circuitlab.errors import ConfigError

SINKS = ("jsonl", "tensorboard", "wandb")
MAX_LIST = 256  # longer lists (per-feature values, ...) stay in the JSONL only


def parse_log(log: str) -> list[str]:
    """"tensorboard,wandb" -> ["jsonl", "tensorboard", "wandb"] (jsonl always first); unknown names are an error."""
    names = [n.strip() for n in str(log).split(",") if n.strip()]
    unknown = [n for n in names if n not in SINKS]
    if unknown:
        raise ConfigError(f"train.log: unknown sink {unknown[0]!r}; choose from {', '.join(SINKS)} "
                          "(comma-separated, e.g. train.log=tensorboard,wandb)")
    return ["jsonl"] + [n for n in dict.fromkeys(names) if n != "jsonl"]


def flat_scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a record as {tag: value}, without "step". Nested dicts join with "/";
    a list of lists of numbers is a [layer][head] table (tags L{l}H{h}); a list of numbers gets
    its index; None, strings and lists longer than MAX_LIST are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if not prefix and key == "step":
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                out[tag] = float(value)
        elif isinstance(value, dict):
            out.update(flat_scalars(value, tag + "/"))
        elif isinstance(value, (list, tuple)) and value and sum(_size(v) for v in value) <= MAX_LIST:
            if all(isinstance(row, (list, tuple)) for row in value):
                out.update({f"{tag}/L{l}H{h}": float(x) for l, row in enumerate(value) for h, x in enumerate(row)
                            if _is_number(x)})
            else:
                out.update({f"{tag}/{i}": float(x) for i, x in enumerate(value) if _is_number(x)})
    return out


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (list, tuple)) else 1


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class JsonlSink:
    """Appends each record to metrics.jsonl (one JSON object a line); the format every reader uses."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json_text(record) + "\n")

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Scalars into out_dir/tensorboard (torch.utils.tensorboard), flushed after each record so a
    crash loses nothing. On resume, purge_step drops events past the checkpoint's step."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("train.log=tensorboard needs the tensorboard package: "
                              "pip install 'circuitlab[track]'") from None
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for tag, value in flat_scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases, offline unless WANDB_MODE says otherwise (`wandb sync out_dir/wandb/...` uploads later)."""

    def __init__(self, out_dir: Path, run_name: str, config: dict[str, Any] | None,
                 resume_step: int = 0) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("train.log=wandb needs Weights & Biases: pip install wandb "
                              "(or use train.log=tensorboard)") from None
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "circuitlab"), name=run_name,
                              dir=str(out_dir), config=config or {},
                              mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]  # wandb checks it
                              reinit=True)
        self.resume_step = resume_step

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        if step >= self.resume_step:  # wandb refuses steps that go backwards
            self.run.log(flat_scalars(record), step=step)

    def close(self) -> None:
        self.run.finish()


class Sinks:
    """Several sinks written together; a context manager that closes them."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> "Sinks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_sinks(out_dir: str | Path, log: str = "jsonl", run_name: str = "run",
               config: dict[str, Any] | None = None, resume_step: int = 0,
               jsonl_name: str = "metrics.jsonl") -> Sinks:
    """The sinks named by log ("jsonl", "tensorboard", "wandb", comma-separated; jsonl is always on)
    writing under out_dir: jsonl_name, tensorboard/, wandb/. resume_step: the step a resumed run
    continues from (TensorBoard drops later events it already had)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sinks: list = []
    for name in parse_log(log):
        if name == "jsonl":
            sinks.append(JsonlSink(out_dir / jsonl_name))
        elif name == "tensorboard":
            # the resumed step's own record is kept; anything logged after it is replaced
            sinks.append(TensorBoardSink(out_dir / "tensorboard", purge_step=resume_step + 1 if resume_step else None))
        else:
            sinks.append(WandbSink(out_dir, run_name, config, resume_step))
    return Sinks(sinks)
