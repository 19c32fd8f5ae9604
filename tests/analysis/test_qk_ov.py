"""Weight circuits as factored matrices, against dense products of the weight views."""
import json

import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.qk_ov import (
    composition_baseline,
    composition_scores,
    copying_scores,
    direct_path,
    k_composition_qk_circuit,
    ov_circuit,
    pos_qk_circuit,
    qk_circuit,
    top_token_pairs,
)

TOL = dict(atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Transformer(ModelConfig.from_preset("attn-only-3l", d_model=32, n_heads=4, d_vocab=30, n_ctx=12))
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(10)
    return m


def test_circuits_equal_dense_products(model):
    W_E, W_pos, W_U = model.W_E, model.W_pos, model.W_U
    qk, ov = qk_circuit(model), ov_circuit(model)
    assert qk.shape == (3, 4, 30, 30) and qk.mdim == model.cfg.head_dim
    with torch.no_grad():
        torch.testing.assert_close(qk.AB, W_E @ model.W_QK @ W_E.T, **TOL)
        torch.testing.assert_close(ov.AB, W_E @ model.W_OV @ W_U, **TOL)
        torch.testing.assert_close(pos_qk_circuit(model, 1).AB, W_pos @ model.W_QK[1] @ W_pos.T, **TOL)
        torch.testing.assert_close(qk_circuit(model, 2).AB, qk.AB[2], **TOL)
        torch.testing.assert_close(direct_path(model).AB, W_E @ W_U, **TOL)
        # QK of L2H1 whose keys read what L0H3 wrote: W_E W_QK (W_E W_OV)ᵀ
        expected = W_E @ model.W_QK[2, 1] @ (W_E @ model.W_OV[0, 3]).T
        torch.testing.assert_close(k_composition_qk_circuit(model, (2, 1), (0, 3)).AB, expected, **TOL)


def test_top_token_pairs_and_copying_scores(model):
    ov = ov_circuit(model, 1)[2]
    pairs = top_token_pairs(ov, k=4, tokenizer=type("Tok", (), {"decode": lambda self, ids: f"<{ids[0]}>"})())
    dense = ov.AB
    assert pairs.values == pytest.approx(dense.flatten().topk(4).values.tolist(), abs=1e-5)
    assert [dense[r, c].item() for r, c in zip(pairs.rows, pairs.cols)] == pytest.approx(pairs.values, abs=1e-5)
    assert pairs.row_strs[0] == f"<{pairs.rows[0]}>"
    # copying score from the full d_vocab eigen-decomposition agrees with the small-matrix one
    lam = torch.linalg.eigvals(dense.double())
    expected = (lam.sum().real / lam.abs().sum()).item()
    assert copying_scores(model).scores[1, 2].item() == pytest.approx(expected, abs=1e-4)
    with pytest.raises(CircuitlabError, match="2-D circuit"):
        top_token_pairs(ov_circuit(model))


def test_composition_scores_structure_and_baseline(model):
    comp = composition_scores(model, n_baseline=50)
    assert comp.k.shape == (3, 4, 3, 4)
    assert torch.isnan(comp.k[1, :, 0]).all() and torch.isnan(comp.k[1, :, 1]).all()  # no path backwards/sideways
    assert not torch.isnan(comp.k[0, :, 2]).any()
    mean, std = composition_baseline(32, 8, 50)
    assert (mean, std) == (comp.baseline_mean, comp.baseline_std)
    assert 0 < mean < 1 and 0 < std < mean
    best = comp.top("v", 3)
    assert [s for _, _, s in best] == sorted([s for _, _, s in best], reverse=True)
    (l1, h1), (l2, h2), s = best[0]
    assert l1 < l2 and s == pytest.approx(float(comp.v[l1, h1, l2, h2]))
    d = comp.to_dict()
    assert d["k"][1][0][0][0] is None  # NaN -> null in JSON
    json.dumps(d)


def test_perfect_composition_beats_the_baseline():
    """A reader whose W_QK reads exactly the writer's output scores far above random matrices."""
    torch.manual_seed(1)
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=1, d_head=4, d_vocab=10, n_ctx=8, attn_only=True, norm="none",
                      bias=False)
    model = Transformer(cfg)
    attn0, attn1 = model.blocks[0].attn, model.blocks[1].attn
    with torch.no_grad():
        out_dirs = attn0.out.weight  # [d_model, d_head]: the subspace layer 0 writes to
        attn1.qkv.weight[4:8] = out_dirs.T  # layer-1 keys read exactly that subspace
    comp = composition_scores(model, n_baseline=100)
    assert comp.k[0, 0, 1, 0] > comp.threshold
    assert comp.k[0, 0, 1, 0] > 2 * comp.baseline_mean
    assert comp.q[0, 0, 1, 0] < comp.k[0, 0, 1, 0]  # the queries were left random


def test_bad_arguments(model):
    with pytest.raises(CircuitlabError, match="layer 5 is out of range"):
        qk_circuit(model, 5)
    with pytest.raises(CircuitlabError, match="earlier layer"):
        k_composition_qk_circuit(model, (1, 0), (1, 1))
    rotary = Transformer(ModelConfig.from_preset("llama-tiny", d_model=32, d_mlp=48, d_vocab=30, n_ctx=12))
    with pytest.raises(CircuitlabError, match="rotary"):
        pos_qk_circuit(rotary)


def _naive_composition(model) -> dict[str, torch.Tensor]:
    """The definition, dense: ‖W_OV1 M2‖_F / (‖W_OV1‖_F ‖M2‖_F) with every d_model x d_model product formed."""
    torch.set_grad_enabled(False)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    ov = model.W_V @ model.W_O
    readers = {"q": model.W_Q @ model.W_K.transpose(-1, -2), "k": model.W_K @ model.W_Q.transpose(-1, -2), "v": ov}
    out = {m: torch.full((L, H, L, H), float("nan"), dtype=torch.float64) for m in readers}
    for m, r in readers.items():
        for l1 in range(L):
            for h1 in range(H):
                for l2 in range(l1 + 1, L):
                    for h2 in range(H):
                        w, x = ov[l1, h1], r[l2, h2]
                        denom = torch.linalg.norm(w) * torch.linalg.norm(x)   # a dead head: 0, as documented
                        out[m][l1, h1, l2, h2] = torch.linalg.norm(w @ x) / denom if denom > 0 else 0.0
    torch.set_grad_enabled(True)
    return out


@pytest.mark.parametrize("chunk", [None, 1])
def test_composition_scores_from_gram_matrices_equal_the_dense_definition(chunk, monkeypatch):
    """float64: the Gram-product scores equal the naive dense products for every (writer, reader, mode), also when
    the writers are packed one layer at a time; the modes differ, so a reader built for the wrong mode fails."""
    import circuitlab.analysis.qk_ov as qk_ov

    torch.manual_seed(3)
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", n_layers=4, d_model=24, n_heads=3, d_vocab=17,
                                                n_ctx=8)).double()
    if chunk is not None:   # one writer layer's packed Grams at a time
        monkeypatch.setattr(qk_ov, "WRITER_CHUNK_BYTES", 1)
    with torch.no_grad():
        model.blocks[2].attn.out.weight[:, :8] = 0   # a dead head (L2H0) composes with nothing: 0, not NaN
    comp = composition_scores(model, n_baseline=10)
    naive = _naive_composition(model)
    for m in ("q", "k", "v"):
        got = getattr(comp, m).double()
        assert torch.equal(torch.isnan(got), torch.isnan(naive[m]))
        torch.testing.assert_close(got.nan_to_num(), naive[m].nan_to_num().float().double(), atol=1e-6, rtol=0)
    assert (comp.v[2, 0, 3] == 0).all() and (comp.q[2, 0, 3] == 0).all()
    assert (naive["q"] - naive["k"]).nan_to_num().abs().max() > 0.02   # q and k differ: a swapped reader fails
    assert (naive["q"] - naive["v"]).nan_to_num().abs().max() > 0.02
