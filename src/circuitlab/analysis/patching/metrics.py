"""Patching metrics: functions of the logits [batch, pos, d_vocab] -> one number. The built-in ones
declare the positions they read (`metric.positions`), so the engine unembeds only those."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from circuitlab.checks import LAST_POS
from circuitlab.errors import CircuitlabError

Metric = Callable[[torch.Tensor], torch.Tensor | float]



def _named(fn: Callable, name: str, positions=None, per_row: Callable | None = None) -> Callable:
    """Name a metric; `positions` (int, list or [batch] tensor) declares the only logit positions it reads;
    `per_row(logits) -> [batch]` gives the values the metric averages (for the noise of a gap: gap_noise)."""
    fn.__name__ = name
    if positions is not None:
        setattr(fn, "positions", positions)  # read back with getattr(metric, "positions", None)
    if per_row is not None:
        setattr(fn, "per_row", per_row)
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


def _wide(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 for softmax; float32 and float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def logit_diff(answer: int | Sequence[int] | torch.Tensor, wrong: int | Sequence[int] | torch.Tensor,
               pos: int | Sequence[int] | torch.Tensor = LAST_POS) -> Metric:
    """Metric: logit[answer] - logit[wrong] at `pos`, averaged over the batch.

    answer, wrong, pos: an int for every row, or one per row ([batch]).
    """
    answer, wrong, pos = _index(answer), _index(wrong), _index(pos)

    def rows(logits: torch.Tensor) -> torch.Tensor:
        at = _pick(logits, pos)  # [batch, d_vocab]
        return _pick(at, answer) - _pick(at, wrong)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return rows(logits).mean()
    return _named(metric, "logit_diff", pos, rows)


def logprob(answer: int | Sequence[int] | torch.Tensor, pos: int | Sequence[int] | torch.Tensor = LAST_POS) -> Metric:
    """Metric: log-probability of `answer` at `pos`, averaged over the batch."""
    return _answer_metric("logprob", answer, pos, lambda x: x.log_softmax(-1))


def probability(answer: int | Sequence[int] | torch.Tensor, pos: int | Sequence[int] | torch.Tensor = LAST_POS
                ) -> Metric:
    """Metric: probability of `answer` at `pos`, averaged over the batch (causal tracing's metric)."""
    return _answer_metric("probability", answer, pos, lambda x: x.softmax(-1))


def _answer_metric(name: str, answer, pos, normalise: Callable[[torch.Tensor], torch.Tensor]) -> Metric:
    """The batch mean of normalise(logits at pos)[answer]: logprob and probability differ only in normalise."""
    answer, pos = _index(answer), _index(pos)

    def rows(logits: torch.Tensor) -> torch.Tensor:
        return _pick(normalise(_wide(_pick(logits, pos))), answer)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return rows(logits).mean()
    return _named(metric, name, pos, rows)


def kl_to_clean(clean_logits: torch.Tensor, pos: int | Sequence[int] | torch.Tensor = LAST_POS) -> Metric:
    """Metric: KL(clean || patched) of the next-token distributions at `pos`, averaged over the batch.

    clean_logits [batch, pos, d_vocab] from the clean run. 0 means the clean distribution is back.
    """
    pos = _index(pos)
    clean = _pick(clean_logits, pos).detach().float().log_softmax(-1)

    def rows(logits: torch.Tensor) -> torch.Tensor:
        patched = _pick(logits, pos).float().log_softmax(-1)
        return F.kl_div(patched, clean.to(patched.device), log_target=True, reduction="none").sum(-1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        patched = _pick(logits, pos).float().log_softmax(-1)
        return F.kl_div(patched, clean.to(patched.device), log_target=True, reduction="batchmean")
    return _named(metric, "kl_to_clean", pos, rows)


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


def normalized_metric(metric: Metric, clean_value: float, corrupt_value: float) -> Metric:
    """Metric: normalised recovery (metric - corrupt_value) / (clean_value - corrupt_value).

    1 = as on the clean prompt, 0 = as on the corrupted one.
    """
    if clean_value == corrupt_value:
        raise CircuitlabError("normalized_metric(): the metric is the same on the clean and corrupted prompts "
                              f"({clean_value}), so there is nothing to recover; choose prompts it tells apart")

    def norm(logits: torch.Tensor) -> torch.Tensor | float:
        return (metric(logits) - corrupt_value) / (clean_value - corrupt_value)
    return _named(norm, f"normalized_{getattr(metric, '__name__', 'metric')}", getattr(metric, "positions", None))


# When is a clean - corrupted gap too small for recovery fractions (patched - corrupted) / gap to mean anything?
# When the gap is below GAP_FLOOR in the metric's units (logits or nats for the built-in metrics: a
# difference of 0.1 nats changes a probability by about 10%, so the corruption barely changed the
# behaviour being localised; float32 noise in patched values is then a visible share of the gap), or
# when it is within two standard errors of the per-prompt gaps (a paired test at about 95%: across the
# batch the corruption does not move the metric consistently). The second needs a metric that declares
# its per-row values (metric.per_row: logit_diff, logprob, kl_to_clean) and at least 2 prompts.
GAP_FLOOR = 0.1


def gap_noise(metric: Metric, clean_logits: torch.Tensor, corrupt_logits: torch.Tensor) -> float:
    """Two standard errors of the mean per-row gap metric(clean row) - metric(corrupted row), or 0.0 when
    the metric has no per_row or the batch holds one prompt (then only GAP_FLOOR applies)."""
    per_row = getattr(metric, "per_row", None)
    if per_row is None or clean_logits.shape[0] < 2:
        return 0.0
    gaps = (per_row(clean_logits) - per_row(corrupt_logits)).double()
    return float(2 * gaps.std() / gaps.numel() ** 0.5)


def gap_within_noise(clean_value: float, corrupt_value: float, noise: float = 0.0) -> bool:
    """True when |clean - corrupted| is below max(GAP_FLOOR, noise): recovery fractions are meaningless."""
    return abs(clean_value - corrupt_value) < max(GAP_FLOOR, noise)


def metric_value(metric: Metric, logits: torch.Tensor) -> float:
    out = metric(logits)
    return float(out.item() if isinstance(out, torch.Tensor) else out)
