"""Dictionary training across ranks (torchrun, gloo on the CPU, nccl on GPUs): what DictionaryTrainer
reduces so that N ranks train exactly what one process trains on the same token stream.

    torchrun --nproc_per_node=2 -m circuitlab.cli sae train --config sae-demo            # data parallel
    torchrun --nproc_per_node=4 -m circuitlab.cli sae train --config x --set parallel=modules

Every rank runs the model on its own shards of the token stream (ActivationStore shards), then:

- data parallel ("data", the default under torchrun): every rank holds a replica of every dictionary and
  trains it on its own rows. Gradients are averaged (one all-reduce of all of a dictionary's gradients);
  latent firing counts are summed (dead-latent statistics, L0, the target-L0 controller's input);
  BatchTopK keeps the k·rows largest activations of the GLOBAL batch (each rank's top candidates are
  gathered) and moves its running threshold by the global cutoff; resampling sees every rank's rows;
  logged losses are averaged. The replicas stay identical, so rank 0's copy is the result.
- module parallel ("modules", sparsify's --distribute_modules): each dictionary lives on one rank
  (balanced by size); each hook's rows from every rank are gathered to the ranks that own a dictionary
  reading it, so every dictionary trains on the global batch and needs no gradient reduction. For
  suites of many layers whose replicas would not fit, or whose gradient all-reduce would cost more than
  sending activations. Before a checkpoint, an evaluation and at the end rank 0 gathers every
  dictionary's state and writes it.

Alone (one process) nothing here communicates: Alone is the identity.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from circuitlab.atomic import json_text
from circuitlab.errors import ConfigError
from circuitlab.training.distributed import collective, rank_and_world

MODES = ("data", "modules")


def dictionary_hooks(cfg: Any) -> list[str]:
    """The hooks a dictionary reads (and, a transcoder or CLT, writes)."""
    if hasattr(cfg, "hooks"):
        return list(cfg.hooks())
    return [h for h in (cfg.hook_name, cfg.out_hook_name) if h]


class Alone:
    """One process: every dictionary here, nothing to reduce."""

    mode: str | None = None

    def __init__(self, n_dictionaries: int) -> None:
        self.rank, self.world = 0, 1
        self.owner = [0] * n_dictionaries

    @property
    def owned(self) -> list[int]:
        return [j for j, r in enumerate(self.owner) if r == self.rank]

    @property
    def replicas(self) -> DataParallel | None:
        """What a BatchTopK step gathers candidates across (None: this batch is the global one)."""
        return None

    def rows(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The rows this rank's dictionaries train on this step ({hook: [rows, width]})."""
        return batch

    def resample_rows(self, batch: dict[str, torch.Tensor], routed: dict[str, torch.Tensor] | None = None
                      ) -> dict[str, torch.Tensor]:
        """The global batch (in shard order) of this rank's rows `batch`, as a resampling looks at it; `routed`:
        what rows(batch) gave, when it was already called."""
        return batch

    @property
    def row_factor(self) -> int:
        """Global rows = the rows a dictionary sees here × this."""
        return 1

    def average_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        pass

    def total(self, counts: torch.Tensor) -> torch.Tensor:
        """[n] counts over the global batch (fires per latent)."""
        return counts

    def logs(self, logs: dict[int, list[float]], n_fields: int) -> dict[int, list[float]]:
        """Every dictionary's step numbers ({j: fields}, this rank's own) as one process would log them."""
        return logs

    def any(self, flag: bool) -> bool:
        """Whether any rank says so (the same answer on every rank)."""
        return flag

    def gather_state(self, trainer: Any) -> None:
        """Bring every dictionary's state to rank 0 (before it writes a checkpoint, evaluates or saves)."""


class _Ranks(Alone):
    def __init__(self, n_dictionaries: int) -> None:
        super().__init__(n_dictionaries)
        self.rank, self.world = rank_and_world()
        self.device = torch.device("cpu")  # where collectives run: the dictionaries' device (nccl needs cuda)

    def any(self, flag: bool) -> bool:
        t = torch.tensor([int(flag)], device=self.device)
        with collective("agreeing on a decision (stop / resample)"):
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's t (same shape on each) concatenated along dim 0, in rank order."""
        out = [torch.empty_like(t) for _ in range(self.world)]
        with collective("gathering rows"):
            dist.all_gather(out, t.contiguous())
        return torch.cat(out)


class DataParallel(_Ranks):
    """Replicas of every dictionary on every rank, kept identical by the reductions in the module docstring."""

    mode = "data"

    @property
    def owned(self) -> list[int]:
        return list(range(len(self.owner)))  # a replica of every dictionary

    @property
    def replicas(self) -> "DataParallel":
        return self

    @property
    def row_factor(self) -> int:
        return self.world

    def resample_rows(self, batch: dict[str, torch.Tensor], routed: dict[str, torch.Tensor] | None = None
                      ) -> dict[str, torch.Tensor]:
        return {k: self.gather(v) for k, v in batch.items()}

    def average_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """One all-reduce of all gradients (flattened together), divided by the world size: the gradient of
        the global batch's mean loss, since every rank's loss is its own rows' mean over as many rows."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with collective("averaging gradients"):
            dist.all_reduce(flat)
        flat /= self.world
        at = 0
        for g in grads:
            g.copy_(flat[at: at + g.numel()].view_as(g))
            at += g.numel()

    def total(self, counts: torch.Tensor) -> torch.Tensor:
        counts = counts.clone()
        with collective("summing latent firing counts"):
            dist.all_reduce(counts)
        return counts

    def logs(self, logs: dict[int, list[float]], n_fields: int) -> dict[int, list[float]]:
        keys = sorted(logs)
        t = torch.tensor([logs[j] for j in keys], dtype=torch.float64, device=self.device)
        with collective("averaging logged losses"):
            dist.all_reduce(t)
        t /= self.world
        return {j: row.tolist() for j, row in zip(keys, t)}

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0's values everywhere (the replicas start identical even if a seed were to differ)."""
        with collective("broadcasting the initial weights"):
            for t in tensors:
                dist.broadcast(t, 0)


class ModuleParallel(_Ranks):
    """Each dictionary on one rank; rows of its hooks from every rank gathered to it."""

    mode = "modules"

    def __init__(self, configs: Sequence[Any]) -> None:
        super().__init__(len(configs))
        if len(configs) < self.world:
            raise ConfigError(f"module parallel puts each dictionary on one rank: {len(configs)} dictionaries cannot "
                              f"keep {self.world} ranks busy; use data parallel (parallel=data) or fewer ranks")
        sizes = [_size(c) for c in configs]
        load = [0] * self.world
        for j in sorted(range(len(configs)), key=lambda j: (-sizes[j], j)):  # largest first to the least loaded
            r = min(range(self.world), key=lambda r: (load[r], r))
            self.owner[j] = r
            load[r] += sizes[j]
        hooks = sorted({h for c in configs for h in dictionary_hooks(c)})
        self.readers = {h: sorted({self.owner[j] for j, c in enumerate(configs) if h in dictionary_hooks(c)})
                        for h in hooks}

    def rows(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each hook's rows from every rank (in rank order = shard order) to the ranks reading it: a gather to
        its one reader, an all-gather when several read it."""
        out = {}
        with collective("sending activations to the ranks that own their dictionaries"):
            for hook, readers in self.readers.items():
                t = batch[hook].contiguous()
                parts: list[torch.Tensor] | None
                if len(readers) > 1:
                    parts = [torch.empty_like(t) for _ in range(self.world)]
                    dist.all_gather(parts, t)
                else:
                    parts = [torch.empty_like(t) for _ in range(self.world)] if self.rank == readers[0] else None
                    dist.gather(t, parts, dst=readers[0])
                if self.rank in readers:
                    assert parts is not None  # every reader gathered them
                    out[hook] = torch.cat(parts)
        return out

    def resample_rows(self, batch: dict[str, torch.Tensor], routed: dict[str, torch.Tensor] | None = None
                      ) -> dict[str, torch.Tensor]:
        return routed if routed is not None else self.rows(batch)

    def logs(self, logs: dict[int, list[float]], n_fields: int) -> dict[int, list[float]]:
        n = len(self.owner)
        t = torch.zeros(n, n_fields, dtype=torch.float64, device=self.device)
        for j, row in logs.items():
            t[j] = torch.tensor(row, dtype=torch.float64)
        with collective("collecting logged losses"):
            dist.all_reduce(t)  # each row comes from its owner only
        return {j: t[j].tolist() for j in range(n)}

    def gather_state(self, trainer: Any) -> None:
        """Every dictionary's weights, Adam moments and firing history from its owner to rank 0."""
        with collective("gathering the dictionaries' state for a checkpoint"):
            for j, owner in enumerate(self.owner):
                if owner == 0:
                    continue
                if self.rank == owner:
                    tensors = {k: v.detach().to(self.device).contiguous() for k, v in trainer._state_tensors(j).items()}
                    head = json_text({k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in tensors.items()})
                    raw = torch.frombuffer(bytearray(head.encode()), dtype=torch.uint8)
                    dist.send(torch.tensor([len(raw)], dtype=torch.long, device=self.device), 0)
                    dist.send(raw.to(self.device), 0)
                    for t in tensors.values():
                        dist.send(t, 0)
                elif self.rank == 0:
                    size = torch.zeros(1, dtype=torch.long, device=self.device)
                    dist.recv(size, owner)
                    raw = torch.empty(int(size), dtype=torch.uint8, device=self.device)
                    dist.recv(raw, owner)
                    tensors = {}
                    for k, (shape, dtype) in json.loads(bytes(raw.cpu().tolist()).decode()).items():
                        tensors[k] = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                        dist.recv(tensors[k], owner)
                    trainer._load_state_tensors(j, tensors)


def _size(cfg: Any) -> int:
    """Parameters of a dictionary (what module parallel balances)."""
    if hasattr(cfg, "n_layers") and hasattr(cfg, "hooks"):  # a CLT: encoders + decoders to later layers
        L, d, n = cfg.n_layers, cfg.d_model, cfg.d_sae
        return L * d * n + n * d * L * (L + 1) // 2
    return cfg.d_sae * (cfg.d_in + (cfg.d_out or cfg.d_in))


def make(mode: str | None, configs: Sequence[Any]) -> Alone:
    """The parallel plan for these dictionaries: Alone without a process group of several ranks; else
    DataParallel (mode None or "data") or ModuleParallel ("modules")."""
    if mode is not None and mode not in MODES:
        raise ConfigError(f"parallel must be one of {', '.join(MODES)}, got {mode!r}")
    _, world = rank_and_world()
    if world == 1:
        return Alone(len(configs))
    return ModuleParallel(configs) if mode == "modules" else DataParallel(len(configs))
