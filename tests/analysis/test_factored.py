"""FactoredMatrix against the dense product it stands for."""
import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.analysis.factored import FactoredMatrix

torch.manual_seed(0)


def close(a, b, tol=1e-4):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.fixture
def fm():
    # leading dims broadcast: A [2, 1, 9, 3] with B [4, 3, 7] -> [2, 4, 9, 7]
    return FactoredMatrix(torch.randn(2, 1, 9, 3, dtype=torch.float64), torch.randn(4, 3, 7, dtype=torch.float64))


def test_shape_and_materialise(fm):
    assert fm.shape == (2, 4, 9, 7) and (fm.ldim, fm.mdim, fm.rdim) == (9, 3, 7)
    assert fm.AB.shape == (2, 4, 9, 7)
    close(fm.T.AB, fm.AB.transpose(-1, -2))


def test_matmul_with_vectors_matrices_and_factored(fm):
    dense = fm.AB
    v, u = torch.randn(7, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    close(fm @ v, dense @ v)
    close(u @ fm, u @ dense)
    M, N = torch.randn(7, 5, dtype=torch.float64), torch.randn(6, 9, dtype=torch.float64)
    assert isinstance(fm @ M, FactoredMatrix) and isinstance(N @ fm, FactoredMatrix)
    close((fm @ M).AB, dense @ M)
    close((N @ fm).AB, N @ dense)
    small = FactoredMatrix(torch.randn(7, 2, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64))
    wide = FactoredMatrix(torch.randn(7, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    for other in (small, wide):  # both inner-size branches
        prod = fm @ other
        assert prod.mdim == min(fm.mdim, other.mdim)
        close(prod.AB, dense @ other.AB)
    close((fm * 2.5).AB, 2.5 * dense)


def test_svd_norm_and_eigenvalues_match_dense():
    A, B = torch.randn(3, 20, 4, dtype=torch.float64), torch.randn(3, 4, 20, dtype=torch.float64)
    fm, dense = FactoredMatrix(A, B), A @ B
    U, S, V = fm.svd()
    assert U.shape == (3, 20, 4) and S.shape == (3, 4) and V.shape == (3, 20, 4)
    close(U @ torch.diag_embed(S) @ V.transpose(-1, -2), dense)
    close(S, torch.linalg.svdvals(dense)[:, :4])
    close(U.transpose(-1, -2) @ U, torch.eye(4, dtype=torch.float64).expand(3, 4, 4))
    close(fm.norm(), torch.linalg.matrix_norm(dense))
    # AB has 4 non-zero eigenvalues, those of the 4 x 4 matrix BA
    ours = fm.eigenvalues
    theirs = torch.linalg.eigvals(dense)
    theirs = torch.stack([row[row.abs().argsort(descending=True)[:4]] for row in theirs])
    key = lambda z: z.real * 1000 + z.imag  # noqa: E731 - sort complex numbers consistently
    close(torch.sort(key(ours)).values, torch.sort(key(theirs)).values)


def test_svd_when_inner_size_exceeds_outer():
    fm = FactoredMatrix(torch.randn(5, 12, dtype=torch.float64), torch.randn(12, 6, dtype=torch.float64))
    U, S, V = fm.svd()
    assert S.shape == (5,)
    close(U @ torch.diag(S) @ V.T, fm.AB)


def test_views_and_topk(fm):
    dense = fm.AB
    close(fm[1, 2].AB, dense[1, 2])
    close(fm[1].AB, dense[1])
    close(fm.corner(3), dense[..., :3, :3])
    close(fm.rows([0, 4]).AB, dense[..., [0, 4], :])
    close(fm.cols([1, 6]).AB, dense[..., :, [1, 6]])
    close(fm.submatrix([2, 3], [5, 0]), dense[..., [2, 3], :][..., [5, 0]])
    one = fm[0, 3]
    for largest in (True, False):
        values, rows, cols = one.topk(5, largest=largest, chunk_rows=2)  # several chunks
        expected = dense[0, 3].flatten().topk(5, largest=largest).values
        close(values, expected)
        close(dense[0, 3][rows, cols], values)
    values, rows, cols = fm.topk(4, chunk_rows=4)  # batched over the leading dims
    assert values.shape == (2, 4, 4)
    close(values, dense.flatten(-2).topk(4).values)


def test_bad_shapes_raise_clear_errors(fm):
    with pytest.raises(CircuitlabError, match="do not chain"):
        FactoredMatrix(torch.randn(4, 3), torch.randn(4, 3))
    with pytest.raises(CircuitlabError, match="inner sizes 7 and 8 differ"):
        fm @ torch.randn(8)
    with pytest.raises(CircuitlabError, match="leading dim"):
        fm[0, 0, 1]
    with pytest.raises(CircuitlabError, match="square"):
        fm.eigenvalues


def test_topk_over_chunks_equals_the_dense_top_k():
    """The chunked top-k (later chunks only compared with the k-th best so far) finds the dense matrix's k largest
    and smallest entries and where they are, also when a first chunk holds fewer than k entries."""
    torch.manual_seed(5)
    fm = FactoredMatrix(torch.randn(37, 3, dtype=torch.float64), torch.randn(3, 11, dtype=torch.float64))
    dense = fm.AB
    for largest in (True, False):
        for chunk_rows in (1, 4, 64):
            values, rows, cols = fm.topk(12, largest=largest, chunk_rows=chunk_rows)
            expected = dense.flatten().topk(12, largest=largest).values
            assert torch.equal(values, expected) and torch.equal(dense[rows, cols], values)
