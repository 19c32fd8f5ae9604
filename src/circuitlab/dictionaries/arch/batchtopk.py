"""BatchTopK: the k·rows largest pre-activations of the whole batch (Bussmann et al. 2024). Training tracks
the running threshold (the smallest kept value, averaged over batches) that inference uses instead: it is
saved and used as the JumpReLU it then is."""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.dictionaries.arch.base import Coefficients
from circuitlab.dictionaries.arch.jumprelu import JumpReLU
from circuitlab.dictionaries.sparse_ops import Kept


class BatchTopK(JumpReLU):  # at inference: a JumpReLU with the running threshold
    name = "batchtopk"
    uses_k = True
    learns_threshold = steers_l0 = False
    clt_penalty_uses_norms = False
    saved_as = "jumprelu"
    formats = {}

    def keep(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None, coef: Coefficients,
             replicas: Any = None) -> tuple[Any, torch.Tensor | None]:
        rows, d_sae = pre.shape
        assert k is not None and threshold is not None, "BatchTopK needs k and its running threshold"
        return Kept(batch_topk(pre, k, threshold, coef.threshold_decay, replicas), rows, d_sae), None

    def train_activate(self, pre_kept: torch.Tensor, threshold: torch.Tensor | None, coef: Coefficients) -> torch.Tensor:
        return pre_kept.relu()

    def penalty(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        return None

    def clt_penalty(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        return []


@torch.no_grad()
def batch_topk(pre: torch.Tensor, k: int, threshold: torch.Tensor, decay: float, replicas: Any = None) -> torch.Tensor:
    """The flat positions [k·rows] (increasing) of the k·rows largest ReLU'd pre-activations of the whole
    batch pre [rows, d_sae]; updates the running threshold [d_sae] in place (the smallest kept value, averaged
    over batches) that inference uses instead. With data-parallel replicas, of the whole batch of all ranks."""
    if replicas is not None:
        return _batch_topk_across(pre, k, threshold, decay, replicas)
    n_keep = min(k * pre.shape[0], pre.numel())
    pre = pre.flatten()
    # The kept values sit near the running threshold: when at least n_keep exceed half of it, the top
    # n_keep of those are the batch's, and topk runs on a few times n_keep values instead of rows · d_sae.
    candidates = (pre > 0.5 * float(threshold.min())).nonzero().squeeze(1)
    if len(candidates) >= n_keep:
        values, which = pre[candidates].topk(n_keep, sorted=False)
        flat = candidates[which]
    else:
        values, flat = pre.relu().topk(n_keep, sorted=False)
    kept = values[values > 0]
    if kept.numel():
        threshold.copy_(decay * threshold + (1 - decay) * kept.min())
    return flat.sort().values


def _batch_topk_across(pre: torch.Tensor, k: int, threshold: torch.Tensor, decay: float, replicas: Any) -> torch.Tensor:
    """batch_topk over the rows of every rank: each rank's own top k·rows_global candidates are gathered
    (those hold the global top k·rows_global), the global cutoff is the smallest value kept among them, and
    each rank keeps its values above it. A cutoff of 0 (fewer positive values than k·rows) keeps the positive
    ones: the zeros one process would also keep add nothing (ReLU'd, no gradient)."""
    flat_values = pre.flatten().relu()
    n_keep = min(k * pre.shape[0], pre.numel()) * replicas.world
    mine = flat_values.topk(min(n_keep, flat_values.numel()), sorted=False).values
    best = replicas.gather(mine).topk(n_keep, sorted=False).values
    cutoff = best.min()
    kept = best[best > 0]
    if kept.numel():
        threshold.copy_(decay * threshold + (1 - decay) * kept.min())
    return ((flat_values >= cutoff) & (flat_values > 0)).nonzero().squeeze(1)
