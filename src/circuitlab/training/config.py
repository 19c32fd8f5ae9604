"""RunConfig: model + data + training settings of one run, read from configs/*.yaml.

    run = RunConfig.load("configs/demo.yaml", overrides=["train.steps=200", "model.n_layers=1"])
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml

from circuitlab.checks import DEFAULT_SEED
from circuitlab.config import ModelConfig
from circuitlab.data import DataConfig
from circuitlab.errors import ConfigError, refuse_unknown
from circuitlab.textfile import read_text
from circuitlab.training.sinks import parse_log



@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32           # global batch (sequences per optimizer step, over all ranks and micro-steps)
    seq_len: int = 128
    grad_accum: int = 1            # micro-batches per optimizer step
    lr: float = 1e-3
    min_lr_frac: float = 0.1       # cosine decays to lr * min_lr_frac
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0         # 0 disables clipping
    bf16: bool = False             # bf16 autocast for forward/backward
    eval_every: int = 100
    eval_batches: int = 8
    ckpt_every: int = 500
    track_every: int = 50          # interpretability metrics (induction, previous-token, ICL)
    log_every: int = 10
    log: str = "jsonl"             # metric sinks besides metrics.jsonl: tensorboard, wandb (comma-separated)
    seed: int = DEFAULT_SEED
    device: str = "auto"           # auto | cpu | cuda | cuda:N
    threads: int = 0               # torch CPU threads (0 = by the step's size: circuitlab.perf.threads_for)


@dataclass
class RunConfig:
    """A run: `model` (a preset name plus overrides, or full fields), `data`, `train`.

    The model's d_vocab is taken from the tokenizer, and n_ctx defaults to train.seq_len.
    `needs` says what the run requires beyond this machine (e.g. network, gpu), for the reader.
    """

    name: str = "run"
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "attn-only-2l"})
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    needs: list[str] = field(default_factory=list)
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.data, DataConfig):  # a section of the wrong type (`data: 5`) is refused here
            self.data = _build(DataConfig, self.data, "data")
        if not isinstance(self.train, TrainConfig):
            self.train = _build(TrainConfig, self.train, "train")
        for name, kind in (("name", str), ("description", str), ("needs", list)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"{name} must be a {'list' if kind is list else 'string'}, "
                                  f"got {getattr(self, name)!r}")
        _check_types(self.train, "train")
        t = self.train
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every", "eval_batches",
                     "ckpt_every", "track_every", "log_every"):
            if getattr(t, name) <= 0:
                raise ConfigError(f"train.{name} must be positive, got {getattr(t, name)}")
        for name in ("warmup_steps", "threads"):
            if getattr(t, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(t, name)}")
        parse_log(t.log)
        # Each float in its range; `not low <= x <= high` also refuses NaN.
        for name, low, high, rule in (("lr", 0.0, math.inf, "a finite number > 0"),
                                      ("min_lr_frac", 0.0, 1.0, "from 0 to 1"),
                                      ("weight_decay", 0.0, math.inf, "a finite number >= 0"),
                                      ("beta1", 0.0, 1.0, "from 0 to below 1"), ("beta2", 0.0, 1.0, "from 0 to below 1"),
                                      ("grad_clip", 0.0, math.inf, "a finite number >= 0 (0 disables clipping)")):
            value = getattr(t, name)
            if not low <= value <= high or math.isinf(value) or (name == "lr" and value == 0) \
                    or (name.startswith("beta") and value == 1):
                raise ConfigError(f"train.{name} must be {rule}, got {value}")
        if t.device != "auto":
            try:
                torch.device(t.device)
            except (RuntimeError, TypeError):
                raise ConfigError(f"train.device must be auto, cpu, cuda or cuda:N, got {t.device!r}") from None
        if t.batch_size % t.grad_accum:
            raise ConfigError(f"train.batch_size ({t.batch_size}) must be divisible by train.grad_accum ({t.grad_accum})")
        if not isinstance(self.model, dict):
            raise ConfigError(f"model must be a mapping (a preset name and/or fields), got {self.model!r}")

    def model_config(self, d_vocab: int) -> ModelConfig:
        """The ModelConfig for this run, with d_vocab from the tokenizer."""
        fields_ = dict(self.model)
        preset = fields_.pop("preset", None)
        fields_.setdefault("n_ctx", self.train.seq_len)
        fields_["d_vocab"] = d_vocab
        cfg = ModelConfig.from_preset(preset, **fields_) if preset else ModelConfig.from_dict(fields_)
        if cfg.n_ctx < self.train.seq_len:
            raise ConfigError(f"train.seq_len ({self.train.seq_len}) exceeds the model's context n_ctx ({cfg.n_ctx})")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return _build(cls, data, "run config")

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> "RunConfig":
        """A YAML run config: a file, or the name of a bundled one ("demo"); overrides: ["train.lr=3e-4", ...]."""
        _, data = load_yaml_mapping(str(path), overrides or [], "model/data/train sections")
        return cls.from_dict(data)


def load_yaml_mapping(name_or_path: str, overrides: list[str], holds: str) -> tuple[Path, dict[str, Any]]:
    """A YAML config (a file, or a bundled config's name) as a dict with `--set` overrides applied;
    holds: what the mapping should hold, for the error message. Returns (resolved path, data)."""
    from circuitlab.training.config_files import resolve_config

    path = resolve_config(name_or_path)
    try:
        data = yaml.safe_load(read_text(path, "config file")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"could not parse {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping with {holds}")
    for item in overrides:
        apply_override(data, item)
    return path, data


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `--set section.key=value` (value parsed as YAML: 3, 1e-3, true, [a, b])."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value (e.g. train.steps=200), got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {part} is not a section")
    node[parts[-1]] = value


def _build(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    refuse_unknown(data, [f.name for f in fields(cls)], f"field(s) in {where}")
    return cls(**data)


def _check_types(obj: Any, where: str) -> None:
    for f in fields(obj):
        value, expected = getattr(obj, f.name), type(f.default)
        if expected is float and isinstance(value, str):
            try:  # YAML 1.1 reads "3e-4" (no dot) as a string
                value = float(value)
                setattr(obj, f.name, value)
            except ValueError:
                pass
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, f.name, float(value))
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"{where}.{f.name} must be {expected.__name__}, got {value!r}")
