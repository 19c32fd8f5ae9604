"""Activations for training dictionaries: from a model's forward passes, or from an on-disk cache.

A *source* makes deterministic chunks of activations: ``source.chunk(i, split)`` is a dict
hook name -> [rows, width] (every hook from the same tokens, rows aligned, so a transcoder's input
and output stay paired and several dictionaries share one forward pass). The ActivationStore shuffles
each chunk (its mixing buffer) and serves batches; its position is two integers, so training
resumes exactly without saving the buffer.

    source = ModelActivations(model, ["blocks.0.hook_resid_post"], data, seq_len=64)
    store = ActivationStore(source, batch_size=1024)
    batch = store.next_batch()                      # {"blocks.0.hook_resid_post": [1024, d_model]}
    cache_activations(source, "acts/", n_chunks=100, dtype="float16")    # resumable, capped
    store = ActivationStore(CachedActivations("acts/"), batch_size=1024)   # no model needed
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from circuitlab.atomic import atomic_write_file, atomic_write_text
from circuitlab.errors import CircuitlabError
from circuitlab.model import hooks as H
from circuitlab.model import model_device

SPLITS = ("train", "val")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ActivationSource(Protocol):
    widths: dict[str, int]  # hook name -> width of its flattened activation

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]: ...  # [rows, width] each

    def describe(self) -> dict[str, Any]: ...


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") & (2**63 - 1)


class _StopForward(Exception):
    """Raised by the last needed hook: the rest of the model is not run."""


class ModelActivations:
    """Activations at `hooks` of `model` over token batches; the forward stops after the last hook.

    data: a TokenData (batch i of a split is data.get_batch(split, i, ...), any source build_data
    reads: stories, files, folders, HF datasets) or a LongTensor [n_seq, pos] of token rows.
    Each chunk is seqs_per_chunk sequences of seq_len tokens, flattened to rows; the first
    skip_positions positions of each sequence are dropped (e.g. a BOS position's outlier norm).
    """

    def __init__(self, model: nn.Module, hooks: Sequence[str], data: Any, seq_len: int = 128,
                 seqs_per_chunk: int = 32, skip_positions: int = 0, device: str | torch.device | None = None) -> None:
        if not hooks:
            raise CircuitlabError("ModelActivations needs at least one hook name")
        points = model.hook_points()
        order = list(points)
        for name in hooks:
            H.resolve(points, name)  # an unknown name raises, naming the closest
        if seq_len > model.cfg.n_ctx:
            raise CircuitlabError(f"seq_len {seq_len} exceeds the model's context n_ctx={model.cfg.n_ctx}")
        if not 0 <= skip_positions < seq_len:
            raise CircuitlabError(f"skip_positions must be in [0, seq_len={seq_len}), got {skip_positions}")
        self.model, self.data = model, data
        self.hooks = sorted(dict.fromkeys(hooks), key=order.index)
        self.seq_len, self.seqs_per_chunk, self.skip_positions = seq_len, seqs_per_chunk, skip_positions
        self.device = device if device is not None else model_device(model)
        probe = self._forward(torch.zeros(1, min(2, seq_len), dtype=torch.long, device=self.device))
        self.widths = {name: int(t.shape[-1]) for name, t in probe.items()}

    def tokens(self, index: int, split: str = "train") -> torch.Tensor:
        """The token rows of chunk `index`: [seqs_per_chunk, seq_len]."""
        n, T = self.seqs_per_chunk, self.seq_len
        if torch.is_tensor(self.data):
            rows = self.data
            if split == "val":  # the last tenth of the rows are held out
                rows = rows[int(len(rows) * 0.9):]
            elif len(rows) >= 10:
                rows = rows[: int(len(rows) * 0.9)]
            if rows.shape[1] < T or len(rows) == 0:
                raise CircuitlabError(f"token rows {tuple(rows.shape)} are too few or shorter than seq_len={T}")
            pick = (torch.arange(n) + index * n) % len(rows)
            return rows[pick, :T]
        return self.data.get_batch(split, index, n, T)[:, :-1]

    @torch.no_grad()
    def _forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """tokens [batch, pos] -> {hook: [batch * pos, width]}, running the model only up to the last hook."""
        got: dict[str, torch.Tensor] = {}
        last = self.hooks[-1]

        def save(t: torch.Tensor, hook: H.HookPoint) -> None:
            got[hook.name] = t
            if hook.name == last:
                raise _StopForward

        try:
            with self.model.hooks([(name, save) for name in self.hooks]):
                self.model(tokens)
        except _StopForward:
            pass
        out = {}
        for name, t in got.items():
            if t.dim() > 2 and t.shape[:2] == tokens.shape:  # [batch, pos, ...] -> [batch, pos, width]
                t = t.reshape(*tokens.shape, -1)[:, self.skip_positions:]
            out[name] = t.reshape(-1, t.shape[-1]).float()
        return out

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        return self._forward(self.tokens(index, split).to(self.device))

    @property
    def rows_per_chunk(self) -> int:
        return self.seqs_per_chunk * (self.seq_len - self.skip_positions)

    def describe(self) -> dict[str, Any]:
        from circuitlab.dictionaries.sae import base_model_id

        data = repr(self.data) if not torch.is_tensor(self.data) else f"tokens{tuple(self.data.shape)}"
        return {"kind": "model", "base_model": base_model_id(self.model), "hooks": self.hooks, "data": data,
                "seq_len": self.seq_len, "seqs_per_chunk": self.seqs_per_chunk, "skip_positions": self.skip_positions}


class ActivationStore:
    """Shuffled batches from a source: each chunk is a mixing buffer, permuted by (seed, split, chunk).

    state_dict() / load_state_dict() hold the position (chunk, offset): resuming gives the same batches.
    """

    def __init__(self, source: ActivationSource, batch_size: int, seed: int = 0, split: str = "train") -> None:
        if split not in SPLITS:
            raise CircuitlabError(f"split must be 'train' or 'val', got {split!r}")
        if batch_size < 1:
            raise CircuitlabError(f"batch_size must be positive, got {batch_size}")
        self.source, self.batch_size, self.seed, self.split = source, batch_size, seed, split
        self.chunk_index, self.offset = 0, 0
        self._buffer: dict[str, torch.Tensor] | None = None

    @property
    def widths(self) -> dict[str, int]:
        return self.source.widths

    def _load(self, index: int) -> dict[str, torch.Tensor]:
        acts = self.source.chunk(index, self.split)
        n = next(iter(acts.values())).shape[0]
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(_seed(self.seed, self.split, index)))
        return {k: v[perm.to(v.device)] for k, v in acts.items()}

    def next_batch(self) -> dict[str, torch.Tensor]:
        """{hook: [batch_size, width]}, rows aligned across hooks."""
        parts: list[dict[str, torch.Tensor]] = []
        need = self.batch_size
        while need:
            if self._buffer is None:
                self._buffer = self._load(self.chunk_index)
            n = next(iter(self._buffer.values())).shape[0]
            take = min(need, n - self.offset)
            parts.append({k: v[self.offset : self.offset + take] for k, v in self._buffer.items()})
            self.offset += take
            need -= take
            if self.offset == n:
                self.chunk_index, self.offset, self._buffer = self.chunk_index + 1, 0, None
        return {k: torch.cat([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        return {"chunk": self.chunk_index, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.chunk_index, self.offset, self._buffer = int(state["chunk"]), int(state["offset"]), None


# ---------------------------------------------------------------------------- on-disk cache

MANIFEST = "cache.json"


def cache_activations(source: ActivationSource, folder: str | Path, n_chunks: int, split: str = "train",
                      dtype: str = "float16", max_bytes: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Write chunks 0..n_chunks-1 of `split` as safetensors shards in fp16/bf16/fp32; returns the manifest.

    Resumable: shards already written for the same source are kept and the rest added (the manifest
    is rewritten atomically after each shard). max_bytes caps the split's total size: no shard
    is written past it. A folder holding another source's activations is refused.
    """
    from tqdm.auto import tqdm

    if dtype not in _DTYPES:
        raise CircuitlabError(f"cache dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    desc = json.loads(json.dumps(source.describe(), default=str))
    manifest = {"source": desc, "widths": source.widths, "dtype": dtype, "splits": {}}
    if (folder / MANIFEST).is_file():
        old = _read_manifest(folder)
        if old["source"] != desc or old["dtype"] != dtype:
            raise CircuitlabError(f"{folder} caches other activations ({old['source'].get('hooks')}, {old['dtype']}); "
                                  "use an empty folder")
        manifest = old
    shards = manifest["splits"].setdefault(split, {"shards": [], "rows": 0, "bytes": 0})
    bar = tqdm(total=n_chunks, initial=len(shards["shards"]), desc=f"caching {split} activations",
               disable=not progress, unit="chunk")
    for index in range(len(shards["shards"]), n_chunks):
        acts = {k: v.to(_DTYPES[dtype]).contiguous().cpu() for k, v in source.chunk(index, split).items()}
        size = sum(t.numel() * t.element_size() for t in acts.values())
        if max_bytes is not None and shards["bytes"] + size > max_bytes:
            manifest["capped"] = True
            break
        name = f"{split}-{index:05d}.safetensors"
        atomic_write_file(folder / name, lambda tmp, acts=acts: save_file(acts, tmp))
        shards["shards"].append(name)
        shards["rows"] += next(iter(acts.values())).shape[0]
        shards["bytes"] += size
        atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2))
        bar.update(1)
    bar.close()
    atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise CircuitlabError(f"{folder} is not an activation cache ({MANIFEST} is missing)") from None
    except json.JSONDecodeError as e:
        raise CircuitlabError(f"activation cache {folder}: {MANIFEST} is corrupt ({e})") from None


class CachedActivations:
    """A source reading the shards cache_activations wrote; chunk i of an epoch is one shard
    (epochs visit the shards in a fresh order), so memory holds one shard whatever the total."""

    def __init__(self, folder: str | Path, seed: int = 0) -> None:
        self.folder = Path(folder)
        self.manifest = _read_manifest(self.folder)
        self.widths = {k: int(v) for k, v in self.manifest["widths"].items()}
        self.seed = seed

    def shards(self, split: str) -> list[str]:
        names = self.manifest["splits"].get(split, {}).get("shards", [])
        if not names:
            raise CircuitlabError(f"activation cache {self.folder} has no {split} shards; cache that split first")
        return names

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        names = self.shards(split)
        epoch, i = divmod(index, len(names))
        order = torch.randperm(len(names), generator=torch.Generator().manual_seed(_seed(self.seed, split, epoch)))
        path = self.folder / names[int(order[i])]
        try:
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k).float() for k in f.keys()}
        except Exception as e:  # noqa: BLE001
            raise CircuitlabError(f"activation cache shard {path} is corrupt or missing ({type(e).__name__}: {e})") from None

    def describe(self) -> dict[str, Any]:
        return {"kind": "cache", "folder": str(self.folder), "source": self.manifest["source"]}
