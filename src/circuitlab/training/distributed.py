"""DDP helpers: the same trainer runs alone or under `torchrun --nproc_per_node=N`
(gloo on CPU, nccl on GPU). Every rank draws the same global batch and takes its share."""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from circuitlab.model import check_device


def setup(device: str = "auto") -> tuple[int, int, str]:
    """Returns (rank, world_size, device); initialises the process group under torchrun."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device)  # one line for "cuda" on a machine without one
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    use_cuda = device.startswith("cuda")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
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


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
