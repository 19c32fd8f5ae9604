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

import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from circuitlab.checks import DEFAULT_SEED
from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.errors import CircuitlabError
from circuitlab.model import hooks as H
from circuitlab.model import model_device

if TYPE_CHECKING:
    from circuitlab.model import Transformer

SPLITS = ("train", "val")
AUTOCAST = {"bfloat16": torch.bfloat16, "float16": torch.float16}  # the model's forward on a GPU
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
    autocast ("bfloat16" / "float16", on a GPU): the model's forward under torch.autocast in that dtype (the
    activations come out as float32 as always; the dictionaries keep float32 master weights). None: as is.
    """

    def __init__(self, model: Transformer, hooks: Sequence[str], data: Any, seq_len: int = 128,
                 seqs_per_chunk: int = 32, skip_positions: int = 0, device: str | torch.device | None = None,
                 autocast: str | None = None) -> None:
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
        if autocast is not None and autocast not in AUTOCAST:
            raise CircuitlabError(f"autocast must be one of {', '.join(AUTOCAST)} (or none), got {autocast!r}")
        if autocast is not None and torch.device(self.device).type != "cuda":
            raise CircuitlabError(f"autocast {autocast} is for a GPU's forward; the model is on {self.device} "
                                  "(on the CPU activations are computed in the model's own dtype)")
        self.autocast = autocast
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

        amp = (torch.autocast("cuda", dtype=AUTOCAST[self.autocast]) if self.autocast else contextlib.nullcontext())
        try:
            with self.model.hooks([(name, save) for name in self.hooks]), amp:
                self.model(tokens)
        except _StopForward:
            pass
        out = {}
        for name, t in got.items():
            if t.dim() > 2 and t.shape[:2] == tokens.shape:  # [batch, pos, ...] -> [batch, pos, width]
                t = t.reshape(*tokens.shape, -1)[:, self.skip_positions:]
            out[name] = t.reshape(-1, t.shape[-1]).float()
        return out

    passes = 0  # forward passes of the model made for chunks (each serves every hook at once)

    def chunk(self, index: int, split: str = "train") -> dict[str, torch.Tensor]:
        self.passes += 1
        return self._forward(self.tokens(index, split).to(self.device))

    def pass_flops(self) -> float:
        """About the flops of one chunk's forward pass, which stops after the last hook's block: 2 per block
        weight per token, plus the attention scores and mixing (circuitlab.perf.block_weights)."""
        import re

        from circuitlab.perf import block_weights

        cfg = self.model.cfg
        layers = max((int(m.group(1)) + 1 for h in self.hooks if (m := re.match(r"blocks\.(\d+)\.", h))),
                     default=cfg.n_layers)
        per_token = layers * (2 * block_weights(cfg) + 4 * self.seq_len * cfg.n_heads * cfg.head_dim)
        return float(per_token * self.seqs_per_chunk * self.seq_len)

    @property
    def rows_per_chunk(self) -> int:
        return self.seqs_per_chunk * (self.seq_len - self.skip_positions)

    def describe(self) -> dict[str, Any]:
        from circuitlab.dictionaries.sae import base_model_id

        data = repr(self.data) if not torch.is_tensor(self.data) else f"tokens{tuple(self.data.shape)}"
        return {"kind": "model", "base_model": base_model_id(self.model), "hooks": self.hooks, "data": data,
                "seq_len": self.seq_len, "seqs_per_chunk": self.seqs_per_chunk, "skip_positions": self.skip_positions,
                **({"autocast": self.autocast} if self.autocast else {})}


class ActivationStore:
    """Shuffled batches from a source: each chunk is a mixing buffer, permuted by (seed, split, chunk).

    Across ranks (torchrun) the token stream is cut into `shards` interleaved streams: shard s reads chunks
    s, s + shards, s + 2·shards, ... with its own mixing buffer, and a step's batch is batch_size / shards rows
    of each shard, in shard order. A rank holds shards / world of them and runs the model only on their
    chunks; next_batch() gives this rank's rows. So the global batch depends on `shards`, not on how many
    ranks share them: one process with shards=2 sees exactly the rows of two ranks together (equivalence
    tests, and a resume on another world size that divides `shards`). shards defaults to the world size;
    the held-out split ("val") is never sharded (rank 0 evaluates).

    state_dict() / load_state_dict() hold the position (chunk, offset) of each shard: resuming gives the same batches.
    """

    def __init__(self, source: ActivationSource, batch_size: int, seed: int = DEFAULT_SEED, split: str = "train",
                 shards: int | None = None) -> None:
        from circuitlab.training.distributed import rank_and_world

        if split not in SPLITS:
            raise CircuitlabError(f"split must be 'train' or 'val', got {split!r}")
        if batch_size < 1:
            raise CircuitlabError(f"batch_size must be positive, got {batch_size}")
        self.rank, self.world = rank_and_world() if split == "train" else (0, 1)
        shards = self.world if shards is None else shards
        if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
            raise CircuitlabError(f"store shards must be a positive integer, got {shards!r}")
        if split == "val":
            shards = 1
        if shards % self.world:
            raise CircuitlabError(f"the token stream has {shards} shard(s), which {self.world} ranks cannot share "
                                  f"evenly; run on a number of ranks dividing {shards}")
        if batch_size % shards:
            raise CircuitlabError(f"batch_size {batch_size} must be divisible by the number of stream shards ({shards}: "
                                  "each shard gives the same number of rows per step)")
        self.source, self.batch_size, self.seed, self.split, self.shards = source, batch_size, seed, split, shards
        per_rank = shards // self.world
        self.owned = list(range(self.rank * per_rank, (self.rank + 1) * per_rank))  # the shards this rank reads
        self.positions = {s: [s, 0] for s in self.owned}  # shard -> [chunk index, offset in it]
        self._buffers: dict[int, dict[str, torch.Tensor] | None] = {s: None for s in self.owned}

    @property
    def widths(self) -> dict[str, int]:
        return self.source.widths

    @property
    def rows_per_rank(self) -> int:
        """Rows of each next_batch() on this rank."""
        return self.batch_size // self.world

    # the single-stream view of the position (shards == 1), as before sharding
    @property
    def chunk_index(self) -> int:
        return self.positions[self.owned[0]][0]

    @property
    def offset(self) -> int:
        return self.positions[self.owned[0]][1]

    def _load(self, index: int) -> dict[str, torch.Tensor]:
        acts = self.source.chunk(index, self.split)
        n = next(iter(acts.values())).shape[0]
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(_seed(self.seed, self.split, index)))
        return {k: v[perm.to(v.device)] for k, v in acts.items()}

    def _take(self, shard: int, need: int) -> list[dict[str, torch.Tensor]]:
        parts: list[dict[str, torch.Tensor]] = []
        pos = self.positions[shard]
        while need:
            if self._buffers[shard] is None:
                self._buffers[shard] = self._load(pos[0])
            buffer = self._buffers[shard]
            assert buffer is not None  # loaded just above
            n = next(iter(buffer.values())).shape[0]
            take = min(need, n - pos[1])
            parts.append({k: v[pos[1]: pos[1] + take] for k, v in buffer.items()})
            pos[1] += take
            need -= take
            if pos[1] == n:
                pos[0], pos[1], self._buffers[shard] = pos[0] + self.shards, 0, None
        return parts

    def next_batch(self) -> dict[str, torch.Tensor]:
        """{hook: [batch_size / world, width]} (this rank's rows: its shards' in order), rows aligned across hooks."""
        per_shard = self.batch_size // self.shards
        parts = [p for s in self.owned for p in self._take(s, per_shard)]
        return {k: torch.cat([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """{"chunk", "offset"} for one stream; with shards: {"shards": n, "positions": {shard: [chunk, offset]}}
        for this rank's shards (the trainer gathers every rank's into one)."""
        if self.shards == 1:
            return {"chunk": self.chunk_index, "offset": self.offset}
        return {"shards": self.shards, "positions": {str(s): list(p) for s, p in self.positions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = int(state.get("shards", 1))
        if saved != self.shards:
            raise CircuitlabError(f"the checkpoint's token stream has {saved} shard(s), this store {self.shards}: "
                                  f"resume with store shards={saved} (on a number of ranks dividing {saved})")
        if saved == 1:
            self.positions = {0: [int(state["chunk"]), int(state["offset"])]}
        else:
            self.positions = {s: [int(v) for v in state["positions"][str(s)]] for s in self.owned}
        self._buffers = {s: None for s in self.owned}


# ---------------------------------------------------------------------------- on-disk cache

MANIFEST = "cache.json"


def cache_activations(source: ActivationSource, folder: str | Path, n_chunks: int, split: str = "train",
                      dtype: str = "float16", max_bytes: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Write chunks 0..n_chunks-1 of `split` as safetensors shards in fp16/bf16/fp32; returns the manifest.

    Resumable: shards already written for the same source are kept and the rest added (the manifest
    is rewritten atomically after each shard). max_bytes caps the split's total size: no shard
    is written past it. A folder holding another source's activations is refused.

    Under torchrun every rank writes its own chunks (index % world == rank; max_bytes / world each) and
    records them in its own progress file (cache.rank-R.json); when all are done rank 0 merges them into
    the one index (cache.json). A run killed part way keeps every shard written: the next call (any
    world size) writes only the missing ones.
    """
    from tqdm.auto import tqdm

    from circuitlab.training.distributed import barrier, rank_and_world

    if dtype not in _DTYPES:
        raise CircuitlabError(f"cache dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    rank, world = rank_and_world()
    folder = Path(folder)
    desc = json.loads(json_text(source.describe(), default=str))
    manifest = {"source": desc, "widths": source.widths, "dtype": dtype, "splits": {}}
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    barrier("creating the activation cache folder")
    if (folder / MANIFEST).is_file():
        old = _read_manifest(folder)
        if old["source"] != desc or old["dtype"] != dtype:
            raise CircuitlabError(f"{folder} caches other activations ({old['source'].get('hooks')}, {old['dtype']}); "
                                  "use an empty folder")
        manifest = old
    entry = manifest["splits"].setdefault(split, {"shards": [], "rows": 0, "bytes": 0})
    # name -> (rows, bytes) once known from a progress file
    done: dict[str, Any] = {name: None for name in entry["shards"]}
    for f in sorted(folder.glob("cache.rank-*.json")):  # shards an interrupted run wrote but did not merge
        for name, rb in json.loads(f.read_text()).get(split, {}).items():
            done[name] = rb
    mine = f"cache.rank-{rank}.json"
    own: dict[str, Any] = json.loads((folder / mine).read_text()) if (folder / mine).is_file() else {}
    own_split = own.setdefault(split, {})
    budget = None if max_bytes is None else max_bytes // world
    # bytes this rank has used of its share: the index's (shared evenly) and its residue's unmerged shards
    used = entry["bytes"] // world + sum(rb[1] for name, rb in done.items() if rb and _index(name) % world == rank)
    todo = [i for i in range(n_chunks) if i % world == rank and f"{split}-{i:05d}.safetensors" not in done]
    capped = False
    bar = tqdm(total=n_chunks, initial=n_chunks - len(todo) * world, desc=f"caching {split} activations",
               disable=not progress or rank != 0, unit="chunk")
    for index in todo:
        acts = {k: v.to(_DTYPES[dtype]).contiguous().cpu() for k, v in source.chunk(index, split).items()}
        size = sum(t.numel() * t.element_size() for t in acts.values())
        if budget is not None and used + size > budget:
            capped = True
            break
        name = f"{split}-{index:05d}.safetensors"
        atomic_write_file(folder / name, lambda tmp, acts=acts: save_file(acts, tmp))
        own_split[name] = [next(iter(acts.values())).shape[0], size]
        used += size
        atomic_write_text(folder / mine, json_text(own))
        bar.update(world)
    bar.close()
    if capped:
        own["capped"] = True
        atomic_write_text(folder / mine, json_text(own))
    barrier("caching activations (a rank failed or is slower than the timeout)")
    if rank == 0:  # one index: every rank's shards, in chunk order
        for f in sorted(folder.glob("cache.rank-*.json")):
            data = json.loads(f.read_text())
            manifest["capped"] = manifest.get("capped", False) or bool(data.pop("capped", False))
            for sp, names in data.items():
                e = manifest["splits"].setdefault(sp, {"shards": [], "rows": 0, "bytes": 0})
                for name, (rows, size) in names.items():
                    if name not in e["shards"]:
                        e["shards"].append(name)
                        e["rows"] += rows
                        e["bytes"] += size
        for e in manifest["splits"].values():
            e["shards"].sort(key=_index)
        if not manifest.get("capped"):
            manifest.pop("capped", None)
        atomic_write_text(folder / MANIFEST, json_text(manifest, indent=2))
        for f in folder.glob("cache.rank-*.json"):
            f.unlink()
    barrier("writing the activation cache index")
    return _read_manifest(folder)


def _index(name: str) -> int:
    """The chunk index in a shard's name ("train-00012.safetensors" -> 12)."""
    return int(name.rsplit("-", 1)[1].split(".")[0])


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

    def __init__(self, folder: str | Path, seed: int = DEFAULT_SEED) -> None:
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
