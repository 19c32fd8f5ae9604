"""Coalitions of input features and the linear surrogates fitted to them: KernelSHAP and LIME in the
interpretable space. A coalition is a 0/1 row over M features (1: the feature keeps its input value, 0: it
takes the baseline's); the caller evaluates the model on each and fits here. No model in this module.

    z = shap_coalitions(M, samples, generator)        # [samples, M]: the full and empty coalitions, then draws
    phi = shapley_fit(z, y, v_full, v_empty)           # [M]; Σ phi = v_full − v_empty exactly (efficiency)
    z, w = all_coalitions(M)                           # every coalition but the two ends, with the Shapley kernel
    z = lime_coalitions(M, samples, generator); w = lime_weights(z, kernel_width)
    coef, intercept = lasso_fit(z, y, w, alpha)        # weighted Lasso (alpha 0: least squares)

Sampling follows Captum 0.9's conventions draw for draw, so that one seed gives the same coalitions:
KernelShap yields the full and the empty coalition first, then per draw a size k from p(k) ∝ (M−1)/(k(M−k))
(torch.multinomial) and the k features with the largest of M standard normals (torch.randn(1, M)); the
Shapley kernel is in the sampling, so every draw weighs 1. Lime draws each feature present with probability
1/2 and weighs a draw by exp(−d² / (2·width²)), d the cosine distance from the all-present row; its default
surrogate is sklearn's Lasso(alpha=0.01), whose objective lasso_fit minimises. Where Captum enforces the two
ends of KernelSHAP with a weight of 10⁶, shapley_fit solves the constrained least squares exactly (float64).
"""
from __future__ import annotations

import math

import numpy as np
import torch

CD_TOL = 1e-12        # coordinate descent stops when no coefficient moves more than this (relative)
CD_MAX_SWEEPS = 20_000


def shap_coalitions(n_features: int, samples: int, generator: torch.Generator, paired: bool = False
                    ) -> torch.Tensor:
    """[samples, n_features] 0/1 rows (bool): all present, none present, then samples − 2 draws by the Shapley
    kernel (Captum's KernelShap order: one multinomial size draw and one randn(1, M) per row). paired: every
    other row is the complement of the row before it (the kernel is symmetric in k and M − k, so each row
    keeps its distribution; the pairs' errors cancel in part: Covert & Lee 2021), not Captum's sampling."""
    M = n_features
    rows = torch.zeros(samples, M, dtype=torch.bool)
    rows[0] = True
    if M < 2:  # one feature: the two ends say everything; no size in 1..M-1 to draw
        return rows
    sizes = torch.arange(M, dtype=torch.float)
    p = torch.tensor(M - 1) / (sizes * (M - sizes))  # float32 as Captum's, so the draws agree bit for bit
    p[0] = 0.0
    p = (p / p.sum(-1, keepdim=True))[None]  # torch.distributions.Categorical normalises the same way
    for i in range(2, samples):
        if paired and i % 2 == 1:
            rows[i] = ~rows[i - 1]
            continue
        k = int(torch.multinomial(p, 1, True, generator=generator))
        r = torch.randn(1, M, generator=generator)
        rows[i] = r[0] > torch.kthvalue(r, M - k).values.item()
    return rows


def shapley_kernel(n_features: int, size: torch.Tensor) -> torch.Tensor:
    """The Shapley kernel of a coalition of `size` present features (float64): (M−1) / (C(M, k)·k·(M−k))."""
    M = n_features
    k = size.double()
    log_binom = math.lgamma(M + 1) - torch.lgamma(k + 1) - torch.lgamma(M - k + 1)
    return (M - 1) / (torch.exp(log_binom) * k * (M - k))


def all_coalitions(n_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every coalition but the two ends, [2^M − 2, M] (bool), and its Shapley kernel weight [2^M − 2]."""
    M = n_features
    codes = torch.arange(1, 2 ** M - 1)
    rows = (codes[:, None] >> torch.arange(M)) & 1 == 1
    return rows, shapley_kernel(M, rows.sum(1))


def shapley_fit(rows: torch.Tensor, values: torch.Tensor, v_full: float, v_empty: float,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """KernelSHAP's regression: phi [M] minimising Σ_z w_z (v(z) − v_empty − z·phi)² subject to
    Σ phi = v_full − v_empty (rows [n, M] 0/1, values [n] = v(z), weights [n], default 1). The two ends, if among
    the rows, are dropped (the constraint holds them). phi = (Δ/M)·1 + N·u with N an orthonormal basis of the
    sum-zero space, u the least-squares solution of least norm (a tie between features splits evenly)."""
    M = rows.shape[1]
    delta = float(v_full) - float(v_empty)
    if M == 1:
        return torch.tensor([delta], dtype=torch.float64)
    z = rows.double()
    size = z.sum(1)
    inner = (size > 0) & (size < M)
    z, y = z[inner], values.double()[inner] - float(v_empty)
    w = torch.ones(len(z), dtype=torch.float64) if weights is None else weights.double()[inner]
    if len(z) == 0:
        return torch.full((M,), delta / M, dtype=torch.float64)
    ones = torch.ones(M, 1, dtype=torch.float64)
    basis = torch.linalg.qr(torch.cat([ones, torch.eye(M, dtype=torch.float64)[:, :M - 1]], 1)).Q[:, 1:]  # [M, M-1]
    target = y - size[inner] * (delta / M)
    root = w.sqrt()
    u = _min_norm_lstsq(root[:, None] * (z @ basis), root * target)
    return delta / M + basis @ u


def _min_norm_lstsq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """argmin ‖a x − b‖ of least norm (a [n, m], b [n]; float64), by SVD as LAPACK's gelsd (sklearn's solver)."""
    x, *_ = np.linalg.lstsq(a.numpy(), b.numpy(), rcond=None)
    return torch.from_numpy(x)


def lime_coalitions(n_features: int, samples: int, generator: torch.Generator) -> torch.Tensor:
    """[samples, n_features] (bool): each feature present with probability 1/2 (Captum's Lime: torch.bernoulli
    of one row per draw; one call for all rows draws the same numbers)."""
    return torch.bernoulli(torch.full((samples, n_features), 0.5), generator=generator).bool()


def lime_weights(rows: torch.Tensor, kernel_width: float) -> torch.Tensor:
    """exp(−d² / (2·width²)) [n] (float64), d = 1 − cos(1, z) = 1 − sqrt(|z| / M) (1 for the empty row): the
    cosine distance of each coalition from the input, as Captum's default similarity measures it on a
    presence vector. Scaled so that the largest is 1 (the fits divide by Σw, so a constant factor changes
    nothing; it keeps a narrow kernel from underflowing to all zeros)."""
    M = rows.shape[1]
    d2 = (1.0 - (rows.sum(1).double() / M).sqrt()) ** 2
    return torch.exp(-(d2 - d2.min()) / (2.0 * kernel_width ** 2))


def lasso_fit(rows: torch.Tensor, values: torch.Tensor, weights: torch.Tensor, alpha: float
              ) -> tuple[torch.Tensor, float]:
    """(coef [M], intercept) minimising (1 / (2 Σw)) Σ w (y − b − z·coef)² + alpha·‖coef‖₁ (sklearn's Lasso with
    sample weights; the intercept unpenalised), float64. alpha 0: weighted least squares of least norm
    (sklearn's LinearRegression). Coordinate descent on the weighted Gram matrix, to convergence."""
    z, y, w = rows.double(), values.double(), weights.double()
    total = float(w.sum())
    z_mean, y_mean = (w @ z) / total, float(w @ y) / total
    zc, yc = z - z_mean, y - y_mean
    if alpha == 0:
        root = w.sqrt()
        coef = _min_norm_lstsq(root[:, None] * zc, root * yc)
    else:
        gram = ((zc * w[:, None]).T @ zc / total).numpy()  # [M, M]
        corr = ((zc * w[:, None]).T @ yc / total).numpy()  # [M]
        coef = torch.from_numpy(_lasso_cd(gram, corr, alpha))
    return coef, y_mean - float(z_mean @ coef)


def _lasso_cd(gram: np.ndarray, corr: np.ndarray, alpha: float) -> np.ndarray:
    """argmin ½ βᵀGβ − cᵀβ + α‖β‖₁ by cyclic coordinate descent, keeping the gradient c − Gβ up to date."""
    M = len(corr)
    beta = np.zeros(M)
    grad = corr.copy()
    diag = np.diag(gram).copy()
    for _ in range(CD_MAX_SWEEPS):
        moved = 0.0
        for j in range(M):
            if diag[j] <= 0:  # a feature constant over the draws: no information, coefficient 0
                continue
            rho = grad[j] + diag[j] * beta[j]
            new = math.copysign(max(abs(rho) - alpha, 0.0), rho) / diag[j]
            step = new - beta[j]
            if step != 0.0:
                grad -= gram[:, j] * step
                beta[j] = new
                moved = max(moved, abs(step))
        if moved <= CD_TOL * max(1.0, float(np.abs(beta).max())):
            break
    return beta


def weighted_r2(rows: torch.Tensor, values: torch.Tensor, weights: torch.Tensor, coef: torch.Tensor,
                intercept: float) -> float:
    """How much of the values' weighted variance the linear surrogate explains (1: all; can be < 0)."""
    y, w = values.double(), weights.double()
    fit = rows.double() @ coef.double() + intercept
    mean = float(w @ y) / float(w.sum())
    total = float(w @ (y - mean) ** 2)
    return 1.0 - float(w @ (y - fit) ** 2) / total if total > 0 else 1.0
