"""FactoredMatrix: a low-rank product A @ B kept in factored form.

The circuits of a transformer are products of weight matrices whose outer size is huge
(d_vocab x d_vocab for W_E W_QK W_Eᵀ) but whose rank is at most d_head. Keeping the factors
makes everything cheap: the Frobenius norm, SVD and eigenvalues all come from matrices of the
small inner size, and nothing d_vocab x d_vocab is built unless `.AB` is asked for.

    fm = FactoredMatrix(W_E @ W_V, W_O @ W_U)     # [..., d_vocab, d_vocab], inner size d_head
    fm.eigenvalues                               # [..., d_head] via the d_head x d_head matrix B A
    fm[1, 3].corner(5)                           # dense top-left 5 x 5 of layer 1 head 3
    values, rows, cols = fm[1, 3].topk(10)       # largest entries, computed in row chunks

Leading (batch) dimensions broadcast like torch.matmul: A [..., m, k] and B [..., k, n].
"""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.errors import CircuitlabError


class FactoredMatrix:
    """The matrix A @ B with A [..., m, k] and B [..., k, n], never multiplied out unless asked."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor) -> None:
        if A.dim() < 2 or B.dim() < 2:
            raise CircuitlabError(
                f"FactoredMatrix needs two matrices (at least 2-D), got shapes {tuple(A.shape)} and {tuple(B.shape)}"
            )
        if A.shape[-1] != B.shape[-2]:
            raise CircuitlabError(
                f"FactoredMatrix factors do not chain: A is {tuple(A.shape)} and B is {tuple(B.shape)} "
                f"(A's last dim must equal B's second-to-last)"
            )
        try:
            lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError:
            raise CircuitlabError(
                f"FactoredMatrix leading dims do not broadcast: {tuple(A.shape[:-2])} vs {tuple(B.shape[:-2])}"
            ) from None
        # Materialise the broadcast (as views) so indexing the leading dims is straightforward.
        self.A = A.expand(*lead, *A.shape[-2:])
        self.B = B.expand(*lead, *B.shape[-2:])

    # ------------------------------------------------------------------ sizes
    @property
    def shape(self) -> torch.Size:
        """[..., m, n]: the shape of A @ B."""
        return torch.Size((*self.A.shape[:-1], self.B.shape[-1]))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def ldim(self) -> int:
        return self.A.shape[-2]

    @property
    def mdim(self) -> int:
        """The inner size k; the rank of A @ B is at most this."""
        return self.A.shape[-1]

    @property
    def rdim(self) -> int:
        return self.B.shape[-1]

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.mdim})"

    # ------------------------------------------------------------------ products
    @property
    def AB(self) -> torch.Tensor:
        """The full product [..., m, n]. This is the only place the outer-size matrix is built."""
        return self.A @ self.B

    @property
    def BA(self) -> torch.Tensor:
        """The inner product B @ A [..., k, k] (needs m == n). Same non-zero eigenvalues as A @ B."""
        if self.ldim != self.rdim:
            raise CircuitlabError(f"BA needs a square matrix, this one is {self.ldim} x {self.rdim}")
        return self.B @ self.A

    @property
    def T(self) -> "FactoredMatrix":
        """The transpose (A B)ᵀ = Bᵀ Aᵀ, [..., n, m]."""
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __matmul__(self, other: Any) -> "FactoredMatrix | torch.Tensor":
        """self @ other. other: a vector [n] (-> tensor [..., m]), a matrix [..., n, p]
        (-> FactoredMatrix [..., m, p]) or a FactoredMatrix [..., n, p] (-> FactoredMatrix)."""
        if isinstance(other, FactoredMatrix):
            self._check_chain(self.rdim, other.ldim, other.shape)
            # Keep the smaller inner size so the product stays as cheap as its cheapest factor.
            if self.mdim <= other.mdim:
                return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
            return FactoredMatrix(self.A @ (self.B @ other.A), other.B)
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if other.dim() == 1:
            self._check_chain(self.rdim, other.shape[0], other.shape)
            return (self.A @ (self.B @ other)[..., None])[..., 0]  # [..., m]; a trailing dim keeps batches aligned
        self._check_chain(self.rdim, other.shape[-2], other.shape)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Any) -> "FactoredMatrix | torch.Tensor":
        """other @ self. other: a vector [m] (-> tensor [..., n]) or a matrix [..., p, m]
        (-> FactoredMatrix [..., p, n])."""
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if other.dim() == 1:
            self._check_chain(other.shape[0], self.ldim, other.shape)
            return ((other @ self.A)[..., None, :] @ self.B)[..., 0, :]  # [..., n]
        self._check_chain(other.shape[-1], self.ldim, other.shape)
        return FactoredMatrix(other @ self.A, self.B)

    def __mul__(self, scalar: float) -> "FactoredMatrix":
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    def _check_chain(self, left: int, right: int, other_shape: Any) -> None:
        if left != right:
            raise CircuitlabError(
                f"cannot multiply FactoredMatrix of shape {tuple(self.shape)} with shape {tuple(other_shape)}: "
                f"inner sizes {left} and {right} differ"
            )

    # ------------------------------------------------------------------ indexing and views
    def __getitem__(self, index: Any) -> "FactoredMatrix":
        """Index the leading (batch) dims only, e.g. fm[layer, head]; use rows()/cols() for the matrix dims."""
        index = index if isinstance(index, tuple) else (index,)
        n_lead = self.ndim - 2
        if len(index) > n_lead or any(i is Ellipsis or i is None for i in index):
            raise CircuitlabError(
                f"FactoredMatrix indexing covers its {n_lead} leading dim(s) only; "
                "use .rows(idx) / .cols(idx) to select matrix rows or columns"
            )
        return FactoredMatrix(self.A[index], self.B[index])

    def rows(self, index: Any) -> "FactoredMatrix":
        """Keep the rows index (an int list, slice or tensor): [..., len(index), n]."""
        return FactoredMatrix(self.A[..., index, :], self.B)

    def cols(self, index: Any) -> "FactoredMatrix":
        """Keep the columns index: [..., m, len(index)]."""
        return FactoredMatrix(self.A, self.B[..., :, index])

    def submatrix(self, rows: Any, cols: Any) -> torch.Tensor:
        """Dense [..., len(rows), len(cols)]: e.g. a QK circuit restricted to a few tokens for a heatmap."""
        return self.A[..., rows, :] @ self.B[..., :, cols]

    def corner(self, k: int = 3) -> torch.Tensor:
        """Dense top-left k x k block [..., k, k] (a quick look at a huge matrix)."""
        return self.A[..., :k, :] @ self.B[..., :, :k]

    def topk(self, k: int, largest: bool = True, chunk_rows: int = 1024
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The k largest (or smallest) entries: (values, rows, cols), each [..., k], best first.

        Works through the rows in chunks of chunk_rows, so memory is chunk_rows x n, never m x n.
        """
        m, n = self.ldim, self.rdim
        k = min(k, m * n)
        best_vals = best_idx = None
        for start in range(0, m, chunk_rows):
            block = self.A[..., start:start + chunk_rows, :] @ self.B  # [..., c, n]
            flat = block.flatten(-2)
            if best_vals is not None and block.dim() == 2 and best_vals.shape[-1] == k:
                # Only entries beating the k-th best so far can enter: a comparison pass, then top-k of those few
                # (a top-k over every entry of the chunk costs more than its product).
                kth = best_vals[-1]
                idx = (flat > kth if largest else flat < kth).nonzero()[:, 0]
                vals = flat[idx]
            else:
                vals, idx = flat.topk(min(k, block.shape[-2] * n), dim=-1, largest=largest)
            idx = idx + start * n  # flat index into the full m x n matrix
            if best_vals is None or best_idx is None:
                best_vals, best_idx = vals, idx
            elif vals.shape[-1]:
                vals, idx = torch.cat([best_vals, vals], -1), torch.cat([best_idx, idx], -1)
                best_vals, order = vals.topk(k, dim=-1, largest=largest)
                best_idx = idx.gather(-1, order)
        assert best_vals is not None and best_idx is not None  # m >= 1 rows: the loop ran
        return best_vals, best_idx // n, best_idx % n

    # ------------------------------------------------------------------ spectra and norms
    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Compact SVD A @ B = U diag(S) Vᵀ: U [..., m, r], S [..., r] (descending), V [..., n, r],
        r = min(m, n, k).

        Via QR of the factors, A = Qa Ra and Bᵀ = Qb Rb, so A B = Qa (Ra Rbᵀ) Qbᵀ and only the small
        core Ra Rbᵀ needs an SVD.
        """
        Qa, Ra = torch.linalg.qr(self.A)                   # [..., m, ra], [..., ra, k]
        Qb, Rb = torch.linalg.qr(self.B.transpose(-1, -2))  # [..., n, rb], [..., rb, k]
        Uc, S, Vhc = torch.linalg.svd(Ra @ Rb.transpose(-1, -2), full_matrices=False)
        return Qa @ Uc, S, Qb @ Vhc.transpose(-1, -2)

    @property
    def S(self) -> torch.Tensor:
        """Singular values [..., r], descending."""
        return self.svd()[1]

    @property
    def eigenvalues(self) -> torch.Tensor:
        """Eigenvalues (complex) [..., k] of the square A @ B, from the k x k matrix B A.

        A B and B A share their non-zero eigenvalues; when k > m the extra ones are zeros.
        """
        inner = self.BA
        if inner.dtype in (torch.float16, torch.bfloat16):  # eig has no half-precision kernels
            inner = inner.float()
        return torch.linalg.eigvals(inner)

    def norm(self) -> torch.Tensor:
        """Frobenius norm [...]: ‖A B‖² = trace(Aᵀ A B Bᵀ), from two k x k Gram matrices."""
        gram_a = self.A.transpose(-1, -2) @ self.A
        gram_b = self.B @ self.B.transpose(-1, -2)
        return (gram_a * gram_b).sum(dim=(-2, -1)).clamp(min=0).sqrt()
