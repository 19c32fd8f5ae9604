"""Patching metrics: functions of the logits [batch, pos, d_vocab] -> one number. The built-in ones
declare the positions they read (`metric.positions`), so the engine unembeds only those."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from circuitlab.errors import CircuitlabError

Metric = Callable[[torch.Tensor], torch.Tensor | float]


def _named(fn: Callable, name: str, positions=None) -> Callable:
    """Name a metric; `positions` (int, list or [batch] tensor) declares the only logit positions it reads."""
    fn.__name__ = name
    if positions is not None:
        fn.positions = positions
    return fn


def read_positions(metric: Metric, n_pos: int) -> list[int] | None:
    """The sorted positions a metric declares it reads (metric.positions), or None for all of them.

    Patched runs then compute logits at these positions only; the others are NaN, so a metric that
    reads more than it declares gives NaN rather than a wrong number.
    """
    pos = getattr(metric, "positions", None)
    if pos is None:
        return None
    return sorted({int(p) % n_pos for p in torch.as_tensor(pos).flatten().tolist()})


def _index(value: int | Sequence[int] | torch.Tensor) -> int | torch.Tensor:
    """An int stays an int (plain indexing is cheapest); anything else becomes a LongTensor [batch]."""
    if isinstance(value, int):
        return value
    t = torch.as_tensor(value).long()
    return int(t) if t.dim() == 0 else t


def _pick(x: torch.Tensor, index: int | torch.Tensor) -> torch.Tensor:
    """x [batch, n, ...] -> [batch, ...]: entry `index` of dim 1 in every row, or index[b] in row b."""
    if isinstance(index, int):
        return x[:, index]
    return x[torch.arange(x.shape[0], device=x.device), index.to(x.device)]


def logit_diff(answer: int | Sequence[int] | torch.Tensor, wrong: int | Sequence[int] | torch.Tensor,
               pos: int | Sequence[int] | torch.Tensor = -1) -> Metric:
    """Metric: logit[answer] - logit[wrong] at `pos`, averaged over the batch.

    answer, wrong, pos: an int for every row, or one per row ([batch]).
    """
    answer, wrong, pos = _index(answer), _index(wrong), _index(pos)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        at = _pick(logits, pos)  # [batch, d_vocab]
        return (_pick(at, answer) - _pick(at, wrong)).mean()
    return _named(metric, "logit_diff", pos)


def logprob(answer: int | Sequence[int] | torch.Tensor, pos: int | Sequence[int] | torch.Tensor = -1) -> Metric:
    """Metric: log-probability of `answer` at `pos`, averaged over the batch."""
    answer, pos = _index(answer), _index(pos)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return _pick(_pick(logits, pos).float().log_softmax(-1), answer).mean()
    return _named(metric, "logprob", pos)


def kl_to_clean(clean_logits: torch.Tensor, pos: int | Sequence[int] | torch.Tensor = -1) -> Metric:
    """Metric: KL(clean || patched) of the next-token distributions at `pos`, averaged over the batch.

    clean_logits [batch, pos, d_vocab] from the clean run. 0 means the clean distribution is back.
    """
    pos = _index(pos)
    clean = _pick(clean_logits, pos).detach().float().log_softmax(-1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        patched = _pick(logits, pos).float().log_softmax(-1)
        return F.kl_div(patched, clean.to(patched.device), log_target=True, reduction="batchmean")
    return _named(metric, "kl_to_clean", pos)


def next_token_loss(tokens: torch.Tensor, mask: torch.Tensor | None = None) -> Metric:
    """Metric: mean next-token cross-entropy of `tokens` [batch, pos] (the run's own input).

    mask [batch, pos] (bool) keeps the predictions made at the marked positions (the last position
    has no target and is always left out).
    """
    targets = tokens[:, 1:]
    keep = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask[:, :-1].bool()

    def metric(logits: torch.Tensor) -> torch.Tensor:
        losses = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten().to(logits.device),
                                 reduction="none").view(targets.shape)
        k = keep.to(logits.device)
        return (losses * k).sum() / k.sum().clamp(min=1)
    return _named(metric, "next_token_loss")


def normalized(metric: Metric, clean_value: float, corrupt_value: float) -> Metric:
    """Metric: normalised recovery (metric - corrupt_value) / (clean_value - corrupt_value).

    1 = as on the clean prompt, 0 = as on the corrupted one.
    """
    if clean_value == corrupt_value:
        raise CircuitlabError("normalized(): the metric is the same on the clean and corrupted prompts "
                              f"({clean_value}), so there is nothing to recover; choose prompts it tells apart")

    def norm(logits: torch.Tensor) -> torch.Tensor:
        return (metric(logits) - corrupt_value) / (clean_value - corrupt_value)
    return _named(norm, f"normalized_{getattr(metric, '__name__', 'metric')}", getattr(metric, "positions", None))


def metric_value(metric: Metric, logits: torch.Tensor) -> float:
    out = metric(logits)
    return float(out.item() if isinstance(out, torch.Tensor) else out)
