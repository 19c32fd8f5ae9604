"""DDP helpers: the same trainer runs alone or under `torchrun --nproc_per_node=N`
(gloo on CPU, nccl on GPU). Every rank draws the same global batch and takes its share."""
from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from circuitlab.errors import CircuitlabError
from circuitlab.model import check_device

# A collective waits at most this long for the other ranks (env CIRCUITLAB_DIST_TIMEOUT, seconds): a rank that
# hangs or vanished without closing its connection stops the others with one line instead of a hang.
TIMEOUT_S = 600


def timeout() -> datetime.timedelta:
    raw = os.environ.get("CIRCUITLAB_DIST_TIMEOUT", str(TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        raise CircuitlabError(f"CIRCUITLAB_DIST_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not seconds > 0:
        raise CircuitlabError(f"CIRCUITLAB_DIST_TIMEOUT must be positive, got {raw!r}")
    return datetime.timedelta(seconds=seconds)


def setup(device: str = "auto") -> tuple[int, int, str]:
    """Returns (rank, world_size, device); initialises the process group under torchrun (with timeout())."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device)  # one line for "cuda" on a machine without one
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    use_cuda = device.startswith("cuda")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout())
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return dist.get_rank(), dist.get_world_size(), device


@contextlib.contextmanager
def rank_zero_first():
    """Rank 0 runs the block (e.g. tokenizes and caches the corpus) before the other ranks, which then
    find the cache instead of all doing the same work at once. Alone, just runs the block."""
    distributed = dist.is_initialized()
    if distributed and dist.get_rank() != 0:
        with collective("waiting for rank 0"):
            dist.barrier()
    try:
        yield
    finally:  # also when rank 0 fails, so the others go on (and fail fast) instead of waiting
        if distributed and dist.get_rank() == 0:
            dist.barrier()


def wrap(model: torch.nn.Module, device: str) -> torch.nn.Module:
    if not dist.is_initialized():
        return model
    ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=ids)


def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss through the (possibly DDP-wrapped) model. batch [batch, pos+1]."""
    from circuitlab.model import lm_loss

    return lm_loss(model(batch[:, :-1]), batch[:, 1:])


def no_sync(model: torch.nn.Module):
    """Skip the gradient all-reduce on accumulation micro-steps."""
    return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()


def mean(value: torch.Tensor) -> torch.Tensor:
    """Average a scalar over ranks (identity when alone)."""
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group; (0, 1) alone."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


@contextlib.contextmanager
def collective(what: str):
    """Turns a failed collective (a rank died, its connection closed, or the timeout ran out) into one line
    naming this rank and what it was doing, instead of a backend traceback."""
    try:
        yield
    except (RuntimeError, dist.DistError) as e:  # gloo raises RuntimeError, newer backends DistError subclasses
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        rank = dist.get_rank() if dist.is_initialized() else 0
        raise CircuitlabError(f"rank {rank}: another rank stopped or did not answer during {what} ({first[:200]}); "
                              "stopping (see that rank's message)") from None


def barrier(what: str) -> None:
    """Wait for every rank (nothing alone); a rank that failed or timed out stops this one with one line."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        with collective(what):
            dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
