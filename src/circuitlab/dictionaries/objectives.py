"""Training-time forward passes and losses of each architecture (inference lives in sae.py).

    relu       ReLU; loss = MSE + l1_coeff · Σ_i a_i ‖W_dec,i‖ (the decoder-norm-weighted L1)
    topk       top k pre-activations per row (ReLU'd)
    batchtopk  top k·batch over the whole batch; tracks the threshold it is saved with (as JumpReLU)
    jumprelu   a · H(a − θ) with a rectangle-kernel straight-through estimator for θ;
               loss = MSE + l0_coeff · Σ_i H(a_i − θ_i)
TopK, BatchTopK and JumpReLU add AuxK (dead latents reconstruct the residual; Gao et al. 2024).
MSE is the squared error summed over the output dimension and averaged over rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.dictionaries.sparse_ops import SPARSE_BELOW, SPARSE_DTYPES, SPARSE_MIN_WORK, DecodeKept, Kept, KeptPreActs
from circuitlab.errors import CircuitlabError


def _rectangle(x: torch.Tensor) -> torch.Tensor:
    return ((x > -0.5) & (x < 0.5)).to(x)


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        bw = ctx.bandwidth
        d_threshold = -(threshold / bw) * _rectangle((pre - threshold) / bw) * grad
        return (pre > threshold) * grad, d_threshold.reshape(-1, threshold.shape[-1]).sum(0), None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        bw = ctx.bandwidth
        d_threshold = -(1.0 / bw) * _rectangle((pre - threshold) / bw) * grad
        return None, d_threshold.reshape(-1, threshold.shape[-1]).sum(0), None


@dataclass
class Coefficients:
    sparsity: float        # l1_coeff (relu) or l0_coeff (jumprelu), after warm-up; unused by the TopK family
    aux: float             # AuxK coefficient
    bandwidth: float       # JumpReLU straight-through kernel width
    threshold_decay: float = 0.99  # BatchTopK: running average of the batch threshold (0 on the first step)


@dataclass
class StepOutput:
    loss: torch.Tensor
    mse: torch.Tensor
    sparsity: torch.Tensor
    aux: torch.Tensor
    fires: torch.Tensor    # [d_sae] long: on how many rows of this batch each latent fired
    l0: float


def training_step(sae: SparseDictionary, x: torch.Tensor, y: torch.Tensor, coef: Coefficients,
                  dead: torch.Tensor | None, sparse: bool | None = None, replicas: Any = None) -> StepOutput:
    """x [rows, d_in] (normalised), target y [rows, d_out]; dead [d_sae] bool (for AuxK) or None.
    replicas: data-parallel ranks (dictionaries.parallel.DataParallel) whose rows together are the batch
    (BatchTopK's top k·rows is over all of them); None: x is the whole batch.

    Every architecture keeps some (row, latent) pairs of the pre-activations: the top k per row, the
    top k·rows of the batch, or (ReLU, JumpReLU) those that can fire or move the threshold. With
    `sparse` (default: on the CPU, when fewer than SPARSE_BELOW of the pairs are kept and the step is
    not tiny) the rest of the step reads only those pairs (sparse_ops); otherwise it runs the dense
    products. Same numbers.
    """
    arch, (rows, d_sae) = sae.cfg.architecture, (len(x), sae.cfg.d_sae)
    sae._check_width(x, sae.cfg.d_in, "input")
    x = x.to(sae.W_enc.dtype)
    bias = _pre_bias(sae)
    pre = x @ sae.W_enc + bias  # [rows, d_sae]; the sparse path takes only its values, not its graph
    kept, mask = _keep(sae, pre.detach(), coef, replicas)
    n_kept = len(kept) if kept is not None else int(torch.count_nonzero(mask))
    if sparse is None:
        sparse = (x.device.type == "cpu" and x.dtype in SPARSE_DTYPES and n_kept < SPARSE_BELOW * rows * d_sae
                  and rows * d_sae * max(sae.cfg.d_in, sae.cfg.d_out) >= SPARSE_MIN_WORK)
    elif sparse and x.dtype not in SPARSE_DTYPES:
        raise CircuitlabError(f"the sparse training step needs a float32 or float64 dictionary, not {x.dtype}")
    threshold = sae.threshold if arch == "jumprelu" else None
    norms = sae.W_dec.norm(dim=-1) if arch == "relu" else None  # [d_sae]
    if sparse:
        kept = kept if kept is not None else Kept.from_mask(mask)
        pre_kept = KeptPreActs.apply(pre.detach(), x, sae.W_enc, bias, kept)      # [nnz]
        at = kept.latents
        threshold = threshold[at] if threshold is not None else None
        norms = norms[at] if norms is not None else None
    else:  # dense [rows, d_sae]: pairs not kept are masked out
        pre_kept = pre if kept is None else pre * kept.dense_mask()
    acts = (_JumpReLU.apply(pre_kept, threshold, coef.bandwidth) if arch == "jumprelu" else pre_kept.relu())
    y_hat = DecodeKept.apply(acts, sae.W_dec, kept) if sparse else acts @ sae.W_dec
    y_hat = y_hat + sae.b_dec + (x @ sae.W_skip if sae.cfg.skip else 0.0)
    fires = (torch.bincount(kept.latents[acts > 0], minlength=d_sae) if sparse
             else torch.count_nonzero(acts, dim=0))  # [d_sae] long (no [rows, d_sae] bool-to-int64 copy)
    zero = pre.new_zeros(())
    if arch == "relu":
        sparsity = coef.sparsity * (acts * norms).sum() / rows
    elif arch == "jumprelu":
        sparsity = coef.sparsity * _Step.apply(pre_kept, threshold, coef.bandwidth).sum() / rows
    else:
        sparsity = zero
    mse = (y_hat - y).pow(2).sum(-1).mean()
    aux = zero
    if arch != "relu" and dead is not None and bool(dead.any()):
        dead_pre = x @ sae.W_enc[:, dead] + bias[dead] if sparse else pre[:, dead]  # [rows, n_dead]
        aux = coef.aux * _auxk(sae, dead_pre, dead.nonzero().squeeze(1), (y - y_hat).detach(), sparse)
    return StepOutput(mse + sparsity + aux, mse.detach(), sparsity.detach(), aux.detach(), fires,
                      float(fires.sum()) / rows)


def _pre_bias(sae: SparseDictionary) -> torch.Tensor:
    """The pre-activations' bias [d_sae]: sae.pre_acts(x) = x @ W_enc + (b_enc − b_dec @ W_enc). The same
    numbers as subtracting b_dec from x, but b_dec's gradient is a vector-matrix product instead of a
    [rows, d_sae] x [d_sae, d_in] matmul per step."""
    return sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc


def _keep(sae: SparseDictionary, pre: torch.Tensor, coef: Coefficients, replicas: Any = None
          ) -> tuple[Kept | None, torch.Tensor | None]:
    """The (row, latent) pairs of pre [rows, d_sae] the architecture keeps, as Kept (TopK family) or a
    [rows, d_sae] bool mask (ReLU: pre > 0; JumpReLU: pre > θ − bandwidth/2, the pairs that fire or are
    in the threshold's straight-through window — the others get no gradient)."""
    arch, (rows, d_sae) = sae.cfg.architecture, pre.shape
    if arch == "topk":
        return Kept.per_row(pre.topk(sae.cfg.k, dim=-1, sorted=False).indices.sort(dim=-1).values, d_sae), None
    if arch == "batchtopk":
        return Kept(_batch_topk(sae, pre, coef.threshold_decay, replicas), rows, d_sae), None
    if arch == "relu":
        return None, pre > 0
    return None, pre > sae.threshold.detach() - coef.bandwidth / 2


def _batch_topk(sae: SparseDictionary, pre: torch.Tensor, decay: float, replicas: Any = None) -> torch.Tensor:
    """The flat positions [k·rows] (increasing) of the k·rows largest ReLU'd pre-activations of the whole
    batch [rows, d_sae]; updates the running threshold (the smallest kept value, averaged over batches)
    that inference uses instead. With data-parallel replicas, of the whole batch of all ranks."""
    if replicas is not None:
        return _batch_topk_across(sae, pre, decay, replicas)
    n_keep = min(sae.cfg.k * pre.shape[0], pre.numel())
    pre = pre.flatten()
    # The kept values sit near the running threshold: when at least n_keep exceed half of it, the top
    # n_keep of those are the batch's, and topk runs on a few times n_keep values instead of rows · d_sae.
    candidates = (pre > 0.5 * float(sae.threshold.min())).nonzero().squeeze(1)
    if len(candidates) >= n_keep:
        values, which = pre[candidates].topk(n_keep, sorted=False)
        flat = candidates[which]
    else:
        values, flat = pre.relu().topk(n_keep, sorted=False)
    kept = values[values > 0]
    if kept.numel():
        sae.threshold.copy_(decay * sae.threshold + (1 - decay) * kept.min())
    return flat.sort().values


def _batch_topk_across(sae: SparseDictionary, pre: torch.Tensor, decay: float, replicas: Any) -> torch.Tensor:
    """_batch_topk over the rows of every rank: each rank's own top k·rows_global candidates are gathered
    (those hold the global top k·rows_global), the global cutoff is the smallest value kept among them, and
    each rank keeps its values above it. A cutoff of 0 (fewer positive values than k·rows) keeps the positive
    ones: the zeros one process would also keep add nothing (ReLU'd, no gradient)."""
    flat_values = pre.flatten().relu()
    n_keep = min(sae.cfg.k * pre.shape[0], pre.numel()) * replicas.world
    mine = flat_values.topk(min(n_keep, flat_values.numel()), sorted=False).values
    best = replicas.gather(mine).topk(n_keep, sorted=False).values
    cutoff = best.min()
    kept = best[best > 0]
    if kept.numel():
        sae.threshold.copy_(decay * sae.threshold + (1 - decay) * kept.min())
    return ((flat_values >= cutoff) & (flat_values > 0)).nonzero().squeeze(1)


def _auxk(sae: SparseDictionary, dead_pre: torch.Tensor, dead_ids: torch.Tensor, residual: torch.Tensor,
          sparse: bool) -> torch.Tensor:
    """The dead latents' top pre-activations (dead_pre [rows, n_dead], latents dead_ids [n_dead])
    reconstruct what the live ones missed (residual [rows, d_out]): their squared error."""
    rows, n_dead = dead_pre.shape
    k_aux = min(max(sae.cfg.d_out // 2, 1), n_dead)
    values, which = dead_pre.topk(k_aux, dim=-1, sorted=False)                      # [rows, k_aux]
    values = values.relu()
    if sparse:
        which, order = which.sort(dim=-1)  # dead_ids is sorted, so the latents are too, as CSR wants
        kept = Kept.per_row(dead_ids[which], sae.cfg.d_sae)
        recon = DecodeKept.apply(values.gather(-1, order).flatten(), sae.W_dec, kept)
    else:
        recon = values.new_zeros(rows, sae.cfg.d_sae).scatter(-1, dead_ids[which], values) @ sae.W_dec
    return (recon - residual).pow(2).sum(-1).mean()


@torch.no_grad()
def resample_dead(sae: SparseDictionary, optimizer: torch.optim.Optimizer, dead: torch.Tensor, x: torch.Tensor,
                  y: torch.Tensor, generator: torch.Generator, threshold: float | None = None,
                  method: str = "inputs") -> int:
    """Re-initialise dead latents [d_sae] bool from rows x [rows, d_in] with targets y [rows, d_out].

    "inputs" (Anthropic, 2023): toward inputs the dictionary reconstructs worst. Picks rows with
    probability ∝ squared error; the decoder row becomes that row's residual direction, the encoder
    column its input direction at 0.2 × the live latents' mean encoder norm; Adam moments zeroed.

    "split" (SAEs only): each dead latent splits a live latent that serves two features at once
    (see split_targets); the two take the two directions it was averaging, both at the parent's
    encoder norm. Both get fresh Adam moments: first moments zeroed (the parent's pointed back to the
    merge), second moments set to the live latents' mean, because zeroed second moments under Adam's
    global bias correction make the next ~100 steps 3-6x the learning rate, which throws a latent
    placed on a good direction off it. Dead latents left without a latent to split (none with
    structure in its residual) get "inputs".

    For JumpReLU a resampled latent's threshold goes back to `threshold`. Returns how many were resampled.
    """
    idx = dead.nonzero().flatten()
    if not len(idx):
        return 0
    x, y = x.to(sae.W_enc.dtype), y.to(sae.W_dec.dtype)  # a float64 dictionary on float32 activations
    y_hat, acts = sae(x)  # inference activations: BatchTopK as the threshold it is used with
    residual = y - y_hat
    children, parents = idx[:0], idx[:0]
    if method == "split":
        children, parents, child_dirs, parent_dirs = split_targets(sae, dead, acts, residual)
        gain = sae.W_enc[:, parents].norm(dim=0)  # both keep the parent's encoder scale
        sae.W_dec[children], sae.W_enc[:, children] = child_dirs, (child_dirs * gain[:, None]).T
        sae.W_dec[parents], sae.W_enc[:, parents] = parent_dirs, (parent_dirs * gain[:, None]).T
    rest = idx[~torch.isin(idx, children)]
    if len(rest):
        err = residual.pow(2).sum(-1)
        pick = torch.multinomial(err.cpu() + 1e-12, len(rest), replacement=True, generator=generator).to(x.device)
        enc = (x - sae.b_dec if sae.cfg.apply_b_dec_to_input else x)[pick]
        alive_norm = sae.W_enc[:, ~dead].norm(dim=0).mean() if bool((~dead).any()) else torch.tensor(1.0)
        sae.W_dec[rest] = _unit(residual[pick])
        sae.W_enc[:, rest] = (_unit(enc) * alive_norm * 0.2).T
    sae.b_enc[idx] = 0
    if threshold is not None and sae.cfg.architecture == "jumprelu":
        sae.threshold[idx] = threshold
    live = (~dead).nonzero().flatten()
    for p, axis in ((sae.W_dec, 0), (sae.W_enc, 1), (sae.b_enc, 0)):
        state = optimizer.state.get(p, {})
        if "exp_avg" not in state:
            continue
        moved = torch.cat([idx, parents])  # a split parent moved too: its old moments point back to the merge
        where = (slice(None), moved) if axis else (moved,)
        state["exp_avg"][where] = 0
        if method == "split" and len(live):
            state["exp_avg_sq"][where] = state["exp_avg_sq"].index_select(axis, live).mean(axis, keepdim=True)
        else:
            state["exp_avg_sq"][where] = 0
    return len(idx)


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1e-8)


@torch.no_grad()
def split_targets(sae: SparseDictionary, dead: torch.Tensor, acts: torch.Tensor, residual: torch.Tensor,
                  candidates: int = 64, iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which live latents to split for the dead ones, and into what (k-means' cluster splitting).

    A latent that serves two features (two features merged into one latent, the usual reason a
    threshold dictionary leaves a latent dead) decodes their average direction, so on the rows where
    it fires the residual [rows, d_out] is large and two-sided along the direction that separates
    them. Score each of the `candidates` live latents carrying the most squared error by how much more
    residual energy its rows have along their own principal direction than the other rows have; the
    best-scoring (score > 0) are split, one per dead latent: 2-means on what the latent explains
    there (residual + its own contribution), started from the sign of the residual along that
    direction. The child takes the centroid farther from the parent's decoder, the parent the other.

    Returns (children, parents) [n] latent indices and their unit directions (child_dirs, parent_dirs) [n, d_out].
    """
    fired = acts > 0                                                  # [rows, d_sae]
    err = residual.pow(2).sum(-1)                                     # [rows]
    load = (fired.to(err.dtype) * err[:, None]).sum(0).masked_fill(dead | (fired.sum(0) < 8), -1)
    cand = load.topk(min(candidates, int((load > 0).sum()))).indices  # [m]
    mask = fired[:, cand].to(err.dtype)                               # [rows, m]
    # principal direction of each candidate's residuals on its rows (power iteration), from its worst row
    v = _unit(residual[(mask * err[:, None]).argmax(0)])              # [m, d_out]
    for _ in range(iters):
        v = _unit((mask * (residual @ v.T)).T @ residual)
    along = (residual @ v.T).pow(2)                                   # [rows, m]
    n = mask.sum(0)
    elsewhere = ((1 - mask) * along).sum(0) / (len(residual) - n).clamp(min=1)
    score = (mask * along).sum(0) - n * elsewhere                     # [m]
    order = score.argsort(descending=True)
    free = dead.nonzero().flatten().tolist()
    children, parents, child_dirs, parent_dirs = [], [], [], []
    for c in order[score[order] > 0].tolist():
        if len(children) == len(free):
            break
        latent, rows = int(cand[c]), mask[:, c] > 0
        explained = residual[rows] + acts[rows, latent, None] * sae.W_dec[latent]  # [n, d_out]
        side = residual[rows] @ v[c] > 0
        for _ in range(5):
            if side.all() or not side.any():
                break
            a, b = _unit(explained[side].sum(0)), _unit(explained[~side].sum(0))
            side = explained @ a > explained @ b
        if side.all() or not side.any():  # one group only: nothing to split here
            continue
        a, b = _unit(explained[side].sum(0)), _unit(explained[~side].sum(0))
        if a @ sae.W_dec[latent] > b @ sae.W_dec[latent]:
            a, b = b, a
        children.append(free[len(children)])
        parents.append(latent)
        child_dirs.append(a)
        parent_dirs.append(b)
    index = torch.tensor(children, dtype=torch.long, device=residual.device)
    if not children:
        empty = residual.new_zeros(0, residual.shape[-1])
        return index, index, empty, empty
    return index, torch.tensor(parents, dtype=torch.long, device=residual.device), torch.stack(child_dirs), torch.stack(parent_dirs)
