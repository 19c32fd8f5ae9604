"""Training-time forward passes and losses of each architecture (inference lives in sae.py).

    relu       ReLU; loss = MSE + l1_coeff · Σ_i a_i ‖W_dec,i‖ (the decoder-norm-weighted L1)
    topk       top k pre-activations per row (ReLU'd); decoded sparsely (k rows of W_dec per token)
    batchtopk  top k·batch over the whole batch; tracks the threshold it is saved with (as JumpReLU)
    jumprelu   a · H(a − θ) with a rectangle-kernel straight-through estimator for θ;
               loss = MSE + l0_coeff · Σ_i H(a_i − θ_i)
TopK, BatchTopK and JumpReLU add AuxK (dead latents reconstruct the residual; Gao et al. 2024).
MSE is the squared error summed over the output dimension and averaged over rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from circuitlab.dictionaries.sae import SparseDictionary


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


def sparse_decode(sae: SparseDictionary, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Σ_j values[:, j] · W_dec[indices[:, j]]: [rows, k], [rows, k] -> [rows, d_out] (no bias), k rows per token."""
    return F.embedding_bag(indices, sae.W_dec, per_sample_weights=values, mode="sum")


def training_step(sae: SparseDictionary, x: torch.Tensor, y: torch.Tensor, coef: Coefficients,
                  dead: torch.Tensor | None) -> StepOutput:
    """x [rows, d_in] (normalised), target y [rows, d_out]; dead [d_sae] bool (for AuxK) or None."""
    arch = sae.cfg.architecture
    pre = _pre_acts(sae, x)  # [rows, d_sae]
    zero = pre.new_zeros(())
    skip = x @ sae.W_skip if sae.cfg.skip else 0.0
    if arch in ("topk", "batchtopk"):
        if arch == "topk":
            values, indices = pre.topk(sae.cfg.k, dim=-1, sorted=False)
            values = values.relu()
            y_hat = sparse_decode(sae, values, indices)
        else:
            values, rows, indices = _batch_topk(sae, pre, coef.threshold_decay)
            y_hat = _decode_pairs(sae, values, rows, indices, len(x))
        y_hat = y_hat + sae.b_dec + skip
        fires = torch.bincount(indices[values > 0], minlength=pre.shape[-1])
        l0 = float((values > 0).sum()) / len(x)
        sparsity = zero
    else:
        if arch == "relu":
            acts = pre.relu()
            sparsity = coef.sparsity * (acts * sae.W_dec.norm(dim=-1)).sum(-1).mean()
        else:  # jumprelu
            acts = _JumpReLU.apply(pre, sae.threshold, coef.bandwidth)
            sparsity = coef.sparsity * _Step.apply(pre, sae.threshold, coef.bandwidth).sum(-1).mean()
        y_hat = acts @ sae.W_dec + sae.b_dec + skip
        fires = torch.count_nonzero(acts, dim=0)  # no [rows, d_sae] bool-to-int64 copy
        l0 = float(fires.sum()) / len(x)
    mse = (y_hat - y).pow(2).sum(-1).mean()
    aux = zero
    if arch != "relu" and dead is not None and bool(dead.any()):
        aux = coef.aux * _auxk(sae, pre, (y - y_hat).detach(), dead)
    return StepOutput(mse + sparsity + aux, mse.detach(), sparsity.detach(), aux.detach(), fires, l0)


def _pre_acts(sae: SparseDictionary, x: torch.Tensor) -> torch.Tensor:
    """sae.pre_acts(x) [rows, d_sae] as (x @ W_enc) + (b_enc − b_dec @ W_enc): the same numbers, but b_dec's
    gradient is a vector-matrix product instead of a third [rows, d_sae] x [d_sae, d_in] matmul per step."""
    sae._check_width(x, sae.cfg.d_in, "input")
    bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc
    return x.to(sae.W_enc.dtype) @ sae.W_enc + bias


def _batch_topk(sae: SparseDictionary, pre: torch.Tensor,
                decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k·rows largest ReLU'd pre-activations of the whole batch [rows, d_sae], as (values, row,
    latent) triples [k·rows] each, grouped by row; updates the running threshold (the smallest kept
    value, averaged over batches) that inference uses instead."""
    d_sae = pre.shape[-1]
    n_keep = min(sae.cfg.k * pre.shape[0], pre.numel())
    values, flat = pre.relu().flatten().topk(n_keep, sorted=False)
    flat, order = flat.sort()  # by row, so that each row's latents are contiguous for the decode
    values = values[order]
    with torch.no_grad():
        kept = values[values > 0]
        if kept.numel():
            sae.threshold.copy_(decay * sae.threshold + (1 - decay) * kept.min())
    return values, flat // d_sae, flat % d_sae


def _decode_pairs(sae: SparseDictionary, values: torch.Tensor, rows: torch.Tensor, latents: torch.Tensor,
                  n_rows: int) -> torch.Tensor:
    """Σ over the (value, row, latent) triples of value · W_dec[latent] into its row: [n_rows, d_out]
    (rows sorted; a row with no latent decodes to 0), reading only the kept rows of W_dec."""
    counts = torch.bincount(rows, minlength=n_rows)
    offsets = counts.cumsum(0) - counts
    return F.embedding_bag(latents, sae.W_dec, offsets, per_sample_weights=values, mode="sum")


def _auxk(sae: SparseDictionary, pre: torch.Tensor, residual: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """The dead latents' top pre-activations reconstruct what the live ones missed [rows, d_out]."""
    k_aux = min(max(sae.cfg.d_out // 2, 1), int(dead.sum()))
    values, indices = pre.masked_fill(~dead, float("-inf")).topk(k_aux, dim=-1, sorted=False)
    recon = sparse_decode(sae, values.relu(), indices)
    return (recon - residual).pow(2).sum(-1).mean()


@torch.no_grad()
def resample_dead(sae: SparseDictionary, optimizer: torch.optim.Optimizer, dead: torch.Tensor, x: torch.Tensor,
                  y: torch.Tensor, generator: torch.Generator, threshold: float | None = None) -> int:
    """Re-initialise dead latents toward inputs the dictionary reconstructs worst (Anthropic, 2023).

    Picks inputs with probability ∝ squared error; the decoder row becomes that input's residual
    direction, the encoder column its input direction at 0.2 × the live latents' mean encoder norm;
    the latents' Adam moments are reset (stale moments from when they were alive would freeze them)
    and, for JumpReLU, their threshold goes back to `threshold`. Returns how many were resampled.
    """
    idx = dead.nonzero().flatten()
    if not len(idx):
        return 0
    y_hat, _ = sae(x)
    err = (y - y_hat).pow(2).sum(-1)
    pick = torch.multinomial(err.cpu() + 1e-12, len(idx), replacement=True, generator=generator).to(x.device)
    dec = (y - y_hat)[pick]
    dec = dec / dec.norm(dim=-1, keepdim=True).clamp(min=1e-8)
    enc = (x - sae.b_dec if sae.cfg.apply_b_dec_to_input else x)[pick]
    enc = enc / enc.norm(dim=-1, keepdim=True).clamp(min=1e-8)
    alive_norm = sae.W_enc[:, ~dead].norm(dim=0).mean() if bool((~dead).any()) else torch.tensor(1.0)
    sae.W_dec[idx] = dec
    sae.W_enc[:, idx] = (enc * alive_norm * 0.2).T
    sae.b_enc[idx] = 0
    if threshold is not None and sae.cfg.architecture == "jumprelu":
        sae.threshold[idx] = threshold
    for p, where in ((sae.W_dec, (idx,)), (sae.W_enc, (slice(None), idx)), (sae.b_enc, (idx,))):
        for key in ("exp_avg", "exp_avg_sq"):
            if key in optimizer.state.get(p, {}):
                optimizer.state[p][key][where] = 0
    return len(idx)
