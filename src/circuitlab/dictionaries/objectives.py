"""An SAE's or transcoder's training step (inference lives in sae.py; each architecture's part in arch/).

    relu       ReLU; loss = MSE + l1_coeff · Σ_i a_i ‖W_dec,i‖ (the decoder-norm-weighted L1)
    topk       top k pre-activations per row (ReLU'd)
    batchtopk  top k·batch over the whole batch; tracks the threshold it is saved with (as JumpReLU)
    jumprelu   a · H(a − θ) with a rectangle-kernel straight-through estimator for θ;
               loss = MSE + l0_coeff · Σ_i H(a_i − θ_i)
    matryoshka_batchtopk  batchtopk, loss + the MSE of each nested prefix of latents (arch/matryoshka.py)
Architectures whose penalty is not weighted by decoder norms (TopK, BatchTopK, JumpReLU) add AuxK (dead
latents reconstruct the residual; Gao et al. 2024). MSE is the squared error summed over the output
dimension and averaged over rows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from circuitlab.dictionaries.arch import Coefficients
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.dictionaries.sparse_ops import SPARSE_BELOW, SPARSE_DTYPES, SPARSE_MIN_WORK, DecodeKept, Kept, KeptPreActs
from circuitlab.errors import CircuitlabError


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
    arch, (rows, d_sae) = sae.cfg.arch, (len(x), sae.cfg.d_sae)
    sae._check_width(x, sae.cfg.d_in, "input")
    x = x.to(sae.W_enc.dtype)
    bias = _pre_bias(sae)
    pre = x @ sae.W_enc + bias  # [rows, d_sae]; the sparse path takes only its values, not its graph
    kept, mask = arch.keep(pre.detach(), sae.cfg.k, sae.latent_threshold(), coef, replicas)
    n_kept = len(kept) if kept is not None else int(torch.count_nonzero(mask))
    if sparse is None:
        sparse = (x.device.type == "cpu" and x.dtype in SPARSE_DTYPES and n_kept < SPARSE_BELOW * rows * d_sae
                  and rows * d_sae * max(sae.cfg.d_in, sae.cfg.d_out) >= SPARSE_MIN_WORK)
    elif sparse and x.dtype not in SPARSE_DTYPES:
        raise CircuitlabError(f"the sparse training step needs a float32 or float64 dictionary, not {x.dtype}")
    threshold: torch.Tensor | None = sae.threshold if arch.learns_threshold else None
    norms = sae.W_dec.norm(dim=-1) if arch.penalty_uses_norms else None  # [d_sae]
    if sparse:
        kept = kept if kept is not None else Kept.from_mask(mask)
        pre_kept = KeptPreActs.apply(pre.detach(), x, sae.W_enc, bias, kept)      # [nnz]
        at = kept.latents
        threshold = threshold[at] if threshold is not None else None
        norms = norms[at] if norms is not None else None
    else:  # dense [rows, d_sae]: pairs not kept are masked out
        pre_kept = pre if kept is None else pre * kept.dense_mask()
    acts = arch.train_activate(pre_kept, threshold, coef)
    y_hat = DecodeKept.apply(acts, sae.W_dec, kept) if sparse else acts @ sae.W_dec
    base = sae.b_dec + (x @ sae.W_skip if sae.cfg.skip else 0.0)   # the output without latents
    y_hat = y_hat + base
    fires = (torch.bincount(kept.latents[acts > 0], minlength=d_sae) if sparse
             else torch.count_nonzero(acts, dim=0))  # [d_sae] long (no [rows, d_sae] bool-to-int64 copy)
    zero = pre.new_zeros(())
    sparsity = arch.penalty(acts, pre_kept, threshold, norms, coef, rows)
    sparsity = zero if sparsity is None else sparsity
    mse = (y_hat - y).pow(2).sum(-1).mean()
    nested = arch.reconstruction_terms(_partial_decoder(sae, acts, kept, sparse), base, y,
                                       sae.cfg.matryoshka_widths)   # Matryoshka's prefixes; none for the others
    aux = zero
    if arch.unit_decoder(clt=False) and dead is not None and bool(dead.any()):
        dead_pre = x @ sae.W_enc[:, dead] + bias[dead] if sparse else pre[:, dead]  # [rows, n_dead]
        aux = coef.aux * _auxk(sae, dead_pre, dead.nonzero().squeeze(1), (y - y_hat).detach(), sparse)
    return StepOutput(mse + sum(nested, zero) + sparsity + aux, mse.detach(), sparsity.detach(), aux.detach(), fires,
                      float(fires.sum()) / rows)


def _partial_decoder(sae: SparseDictionary, acts: torch.Tensor, kept: Kept | None, sparse: bool
                     ) -> Callable[[int, int], torch.Tensor]:
    """partial(lo, hi): the output [rows, d_out] of latents lo..hi-1 alone, with gradients (the training
    activations acts through their decoder rows; acts [nnz] at the kept pairs on the sparse path, else
    [rows, d_sae])."""
    def partial(lo: int, hi: int) -> torch.Tensor:
        if sparse:
            assert kept is not None
            inside = (kept.latents >= lo) & (kept.latents < hi)
            return DecodeKept.apply(acts * inside, sae.W_dec, kept)
        return acts[:, lo:hi] @ sae.W_dec[lo:hi]
    return partial


def _pre_bias(sae: SparseDictionary) -> torch.Tensor:
    """The pre-activations' bias [d_sae]: sae.pre_acts(x) = x @ W_enc + (b_enc − b_dec @ W_enc). The same
    numbers as subtracting b_dec from x, but b_dec's gradient is a vector-matrix product instead of a
    [rows, d_sae] x [d_sae, d_in] matmul per step."""
    return sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc


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
