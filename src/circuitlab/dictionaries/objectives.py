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
                  dead: torch.Tensor | None, sparse: bool | None = None) -> StepOutput:
    """x [rows, d_in] (normalised), target y [rows, d_out]; dead [d_sae] bool (for AuxK) or None.

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
    kept, mask = _keep(sae, pre.detach(), coef)
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
        aux = coef.aux * _auxk(sae, dead_pre, dead.nonzero().squeeze(1), (y - y_hat).detach())
    return StepOutput(mse + sparsity + aux, mse.detach(), sparsity.detach(), aux.detach(), fires,
                      float(fires.sum()) / rows)


def _pre_bias(sae: SparseDictionary) -> torch.Tensor:
    """The pre-activations' bias [d_sae]: sae.pre_acts(x) = x @ W_enc + (b_enc − b_dec @ W_enc). The same
    numbers as subtracting b_dec from x, but b_dec's gradient is a vector-matrix product instead of a
    [rows, d_sae] x [d_sae, d_in] matmul per step."""
    return sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc


def _keep(sae: SparseDictionary, pre: torch.Tensor, coef: Coefficients) -> tuple[Kept | None, torch.Tensor | None]:
    """The (row, latent) pairs of pre [rows, d_sae] the architecture keeps, as Kept (TopK family) or a
    [rows, d_sae] bool mask (ReLU: pre > 0; JumpReLU: pre > θ − bandwidth/2, the pairs that fire or are
    in the threshold's straight-through window — the others get no gradient)."""
    arch, (rows, d_sae) = sae.cfg.architecture, pre.shape
    if arch == "topk":
        latents = pre.topk(sae.cfg.k, dim=-1, sorted=False).indices.sort(dim=-1).values  # [rows, k]
        flat = (latents + torch.arange(rows, device=pre.device)[:, None] * d_sae).flatten()
        return Kept(flat, rows, d_sae), None
    if arch == "batchtopk":
        return Kept(_batch_topk(sae, pre, coef.threshold_decay), rows, d_sae), None
    if arch == "relu":
        return None, pre > 0
    return None, pre > sae.threshold.detach() - coef.bandwidth / 2


def _batch_topk(sae: SparseDictionary, pre: torch.Tensor, decay: float) -> torch.Tensor:
    """The flat positions [k·rows] (increasing) of the k·rows largest ReLU'd pre-activations of the whole
    batch [rows, d_sae]; updates the running threshold (the smallest kept value, averaged over batches)
    that inference uses instead."""
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


def _auxk(sae: SparseDictionary, dead_pre: torch.Tensor, dead_ids: torch.Tensor,
          residual: torch.Tensor) -> torch.Tensor:
    """The dead latents' top pre-activations (dead_pre [rows, n_dead], latents dead_ids [n_dead])
    reconstruct what the live ones missed (residual [rows, d_out]): their squared error."""
    rows, n_dead = dead_pre.shape
    k_aux = min(max(sae.cfg.d_out // 2, 1), n_dead)
    values, which = dead_pre.topk(k_aux, dim=-1, sorted=False)                      # [rows, k_aux]
    which, order = which.sort(dim=-1)
    latents = dead_ids[which]                                                       # increasing per row (dead_ids is sorted)
    flat = (latents + torch.arange(rows, device=latents.device)[:, None] * sae.cfg.d_sae).flatten()
    recon = DecodeKept.apply(values.gather(-1, order).relu().flatten(), sae.W_dec, Kept(flat, rows, sae.cfg.d_sae))
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
