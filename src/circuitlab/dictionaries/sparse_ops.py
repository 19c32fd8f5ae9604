"""Training a dictionary on only the latents that fire: the encoder and decoder products at the kept pairs.

A trained dictionary keeps a few dozen of its thousands of latents per row, so after the one dense
product it cannot avoid (the pre-activations x @ W_enc, to find the kept ones), every other product
of a training step touches only the kept (row, latent) pairs:

    step                    dense                                   here (nnz kept pairs)
    decode                  acts @ W_dec            [rows, d_sae]   CSR(acts) @ W_dec
    grad of acts            grad_y @ W_dec^T        [rows, d_sae]   at the kept pairs only (sampled_addmm)
    grad of W_dec           acts^T @ grad_y         [d_sae, d_out]  CSR(acts)^T @ grad_y
    grad of W_enc           x^T @ grad_pre          [d_in, d_sae]   (CSR(grad_pre)^T @ x)^T

Each costs nnz · d instead of rows · d_sae · d, plus some bookkeeping per pair. A whole ReLU step on
one CPU core, dense time / sparse time (`benchmarks/bench_dictionaries.py --crossover --threads 1`):

    kept fraction          2%      5%      10%     15%     20%
    1024 x 512 -> 4096     2.9x    1.9x    1.2x    1.1x    1.0x
    1024 x 128 -> 1024     2.0x    1.7x    1.2x    0.8x    0.7x
    4096 x 768 -> 16384    3.3x    2.1x    1.2x    0.7x    0.6x

so training_step switches to these products below SPARSE_BELOW = 10% of the pairs kept, when a dense
product is large enough (SPARSE_MIN_WORK) for the per-pair bookkeeping not to dominate: at 256 x 32 ->
256 the sparse step is slower even at 2%.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

SPARSE_BELOW = 0.10  # kept fraction of [rows, d_sae] under which the sparse products are used (CPU)
SPARSE_MIN_WORK = 2**24  # rows · d_sae · d: smaller steps stay dense
SPARSE_DTYPES = (torch.float32, torch.float64)  # torch's CPU sparse products have no half-precision kernels


class Kept:
    """The kept (row, latent) pairs of a [rows, d_sae] batch, in row-major order (CSR).

    flat [nnz] long: row * d_sae + latent, increasing."""

    def __init__(self, flat: torch.Tensor, n_rows: int, d_sae: int) -> None:
        self.flat, self.shape = flat, (n_rows, d_sae)
        self.rows, self.latents = flat // d_sae, flat % d_sae                      # [nnz] each
        self.crow = _offsets(self.rows, n_rows)                                    # [rows + 1]
        self._by_latent: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> "Kept":
        """mask [rows, d_sae] bool."""
        return cls(mask.view(-1).nonzero().squeeze(1), *mask.shape)

    @classmethod
    def per_row(cls, latents: torch.Tensor, d_sae: int) -> "Kept":
        """latents [rows, k] long, increasing along each row: the same number of pairs in every row."""
        rows = torch.arange(len(latents), device=latents.device)[:, None]
        return cls((latents + rows * d_sae).flatten(), len(latents), d_sae)

    def __len__(self) -> int:
        return len(self.flat)

    def matrix(self, values: torch.Tensor) -> torch.Tensor:
        """values [nnz] as a sparse CSR [rows, d_sae]."""
        return _csr(self.crow, self.latents, values, self.shape)

    def matrix_t(self, values: torch.Tensor) -> torch.Tensor:
        """values [nnz] as the sparse CSR transpose [d_sae, rows] (pairs regrouped by latent, once per batch)."""
        if self._by_latent is None:
            order = self.latents.argsort(stable=True)  # stable: rows stay sorted within each latent
            self._by_latent = order, _offsets(self.latents[order], self.shape[1])
        order, ccol = self._by_latent
        return _csr(ccol, self.rows[order], values[order], self.shape[::-1])

    def dense_mask(self) -> torch.Tensor:
        """[rows, d_sae] bool."""
        mask = torch.zeros(self.shape[0] * self.shape[1], dtype=torch.bool, device=self.flat.device)
        mask[self.flat] = True
        return mask.view(self.shape)


def _csr(offsets: torch.Tensor, columns: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # torch calls CSR "beta" (once per process); these products are tested here
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(offsets, columns, values, shape, check_invariants=False)


def _offsets(sorted_ids: torch.Tensor, n: int) -> torch.Tensor:
    """CSR offsets [n + 1] of sorted ids in [0, n)."""
    counts = torch.bincount(sorted_ids, minlength=n)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


class KeptPreActs(torch.autograd.Function):
    """pre [rows, d_sae] (computed without a graph) read at the kept pairs -> [nnz], with the gradient
    of pre = x @ W_enc + bias for W_enc and bias computed from the kept pairs alone. x gets none."""

    @staticmethod
    def forward(ctx: Any, pre: torch.Tensor, x: torch.Tensor, W_enc: torch.Tensor, bias: torch.Tensor,
                kept: Kept) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.kept = kept
        return pre.view(-1)[kept.flat]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor | None, torch.Tensor | None, None]:
        (x,) = ctx.saved_tensors
        kept: Kept = ctx.kept
        d_W = (kept.matrix_t(grad) @ x).T if ctx.needs_input_grad[2] else None              # [d_in, d_sae]
        d_bias = grad.new_zeros(kept.shape[1]).index_add_(0, kept.latents, grad) if ctx.needs_input_grad[3] else None
        return None, None, d_W, d_bias, None


class DecodeKept(torch.autograd.Function):
    """Σ over kept pairs of value · W_dec[latent] into its row: values [nnz], W_dec [d_sae, d_out] -> [rows, d_out]."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, W_dec: torch.Tensor, kept: Kept) -> torch.Tensor:
        ctx.save_for_backward(values, W_dec)
        ctx.kept = kept
        return kept.matrix(values) @ W_dec

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        values, W_dec = ctx.saved_tensors
        kept: Kept = ctx.kept
        d_values = d_W = None
        if ctx.needs_input_grad[0]:  # grad @ W_dec^T, only where a pair is kept
            d_values = torch.sparse.sampled_addmm(kept.matrix(values), grad, W_dec.T, beta=0.0).values()
        if ctx.needs_input_grad[1]:
            d_W = kept.matrix_t(values) @ grad                                                 # [d_sae, d_out]
        return d_values, d_W, None
