"""The sparse training step (dictionaries/sparse_ops.py) against the dense definition, in float64:
the same loss, firing counts and gradients for every architecture, a skip transcoder and AuxK."""
from unittest import mock

import pytest
import torch

from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.dictionaries import objectives
from circuitlab.dictionaries.arch.batchtopk import batch_topk
from circuitlab.dictionaries.objectives import Coefficients, training_step
from circuitlab.dictionaries.sparse_ops import DecodeKept, Kept, KeptPreActs
from circuitlab.errors import CircuitlabError

ARCHS = ("relu", "topk", "batchtopk", "jumprelu")


def _dictionary(arch: str, skip: bool = False, d_sae: int = 64) -> SparseDictionary:
    extra = {"out_hook_name": "b", "d_out": 10, "skip": True} if skip else {}
    cfg = DictionaryConfig(arch, d_in=12, d_sae=d_sae, k=3 if arch in ("topk", "batchtopk") else None,
                           hook_name="a", dtype="float64", **extra)
    sae = SparseDictionary(cfg, seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # away from the initialisation: biases, a skip, a JumpReLU threshold near the data
        sae.b_enc.copy_(torch.randn(d_sae, generator=g, dtype=torch.float64) - (1.5 if arch == "relu" else 0.3))
        sae.b_dec.copy_(torch.randn(sae.cfg.d_out, generator=g, dtype=torch.float64))
        if skip:
            sae.W_skip.copy_(torch.randn(12, 10, generator=g, dtype=torch.float64))
        if arch == "jumprelu":
            sae.threshold.fill_(0.4)
    return sae


def _step(sae, x, y, dead, sparse):
    """One step's outputs, gradients and BatchTopK threshold, leaving the dictionary as it was."""
    saved = {k: v.clone() for k, v in sae.state_dict().items()}
    sae.zero_grad(set_to_none=True)
    out = training_step(sae, x, y, Coefficients(sparsity=0.3, aux=0.5, bandwidth=0.2, threshold_decay=0.5), dead, sparse=sparse)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in sae.named_parameters() if p.grad is not None}
    after = sae.state_dict()["threshold"].clone() if "threshold" in saved else None
    sae.load_state_dict(saved)
    return out, grads, after


@pytest.mark.parametrize("skip", [False, True], ids=["sae", "skip-transcoder"])
@pytest.mark.parametrize("arch", ARCHS)
def test_sparse_step_is_the_dense_step(arch, skip):
    sae = _dictionary(arch, skip)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 12, generator=g, dtype=torch.float64)
    y = torch.randn(40, 10, generator=g, dtype=torch.float64) if skip else x
    dead = torch.zeros(64, dtype=torch.bool)
    dead[::5] = True  # AuxK for the TopK family and JumpReLU
    dense, dense_grads, dense_threshold = _step(sae, x, y, dead, sparse=False)
    sparse, sparse_grads, sparse_threshold = _step(sae, x, y, dead, sparse=True)
    assert 0 < sparse.l0 < 64 and (arch == "relu" or float(sparse.aux) > 0)
    torch.testing.assert_close(sparse.loss, dense.loss, rtol=0, atol=1e-10)
    torch.testing.assert_close(sparse.aux, dense.aux, rtol=0, atol=1e-10)
    assert torch.equal(sparse.fires, dense.fires) and sparse.l0 == dense.l0
    assert sparse_grads.keys() == dense_grads.keys() and "W_enc" in sparse_grads
    assert (arch == "jumprelu") == ("threshold" in sparse_grads)
    for name in dense_grads:
        torch.testing.assert_close(sparse_grads[name], dense_grads[name], rtol=0, atol=1e-9, msg=name)
    if arch == "batchtopk":
        torch.testing.assert_close(sparse_threshold, dense_threshold)


@pytest.mark.parametrize("running", [1e-3, 1e3], ids=["prefiltered", "full-topk"])
def test_batch_topk_keeps_the_batch_largest_with_or_without_the_prefilter(running):
    """The candidates above half the running threshold hold the batch's top k·rows when there are
    enough of them; otherwise the whole batch is searched. Either way: the exact top k·rows."""
    sae = _dictionary("batchtopk")
    sae.threshold.data.fill_(running)
    pre = torch.randn(50, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    flat = batch_topk(pre, sae.cfg.k, sae.threshold, decay=0.0)
    want = pre.relu().flatten().topk(3 * 50).indices.sort().values
    assert torch.equal(flat, want)
    assert float(sae.threshold[0]) == pytest.approx(float(pre.flatten()[want].min()))


def test_sparse_products_pass_gradcheck():
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(6, 9, generator=g) < 0.3
    kept = Kept.from_mask(mask)
    values = torch.randn(len(kept), generator=g, dtype=torch.float64, requires_grad=True)
    W_dec = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, w: DecodeKept.apply(v, w, kept), (values, W_dec))
    x = torch.randn(6, 5, generator=g, dtype=torch.float64)
    W_enc = torch.randn(5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True)
    kept_pre = lambda w, b: KeptPreActs.apply((x @ w + b).detach(), x, w, b, kept)  # noqa: E731
    assert torch.autograd.gradcheck(kept_pre, (W_enc, bias))
    torch.testing.assert_close(kept_pre(W_enc, bias), (x @ W_enc + bias)[mask])


@pytest.mark.parametrize("rows, bias, sparse", [(512, -3.0, True), (512, 0.0, False), (16, -3.0, False)],
                         ids=["few-fire", "half-fire", "tiny-step"])
def test_the_sparse_path_is_taken_when_few_latents_fire_in_a_step_of_some_size(rows, bias, sparse):
    sae = _dictionary("relu", d_sae=4096)
    sae.b_enc.data.fill_(bias)
    x = torch.randn(rows, 12, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with mock.patch.object(DecodeKept, "apply", wraps=DecodeKept.apply) as decode:
        out = training_step(sae, x, x, Coefficients(sparsity=0.1, aux=0.0, bandwidth=0.1), None)
    assert (out.l0 / 4096 < objectives.SPARSE_BELOW) == (bias < 0)
    assert decode.called == sparse


def test_half_precision_dictionaries_train_with_the_dense_step():
    """torch's CPU sparse products have no bf16/fp16 kernels: the default falls back (AuxK included),
    forcing says so."""
    sae = SparseDictionary(DictionaryConfig("topk", d_in=64, d_sae=1024, k=4, hook_name="a", dtype="bfloat16"), seed=0)
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    dead = torch.zeros(1024, dtype=torch.bool)
    dead[::3] = True
    out = training_step(sae, x, x, Coefficients(sparsity=0.0, aux=0.5, bandwidth=0.1), dead)
    out.loss.backward()
    assert out.l0 == 4 and float(out.aux) > 0 and sae.W_enc.grad is not None
    with pytest.raises(CircuitlabError, match="needs a float32 or float64 dictionary"):
        training_step(sae, x, x, Coefficients(sparsity=0.0, aux=0.0, bandwidth=0.1), None, sparse=True)
