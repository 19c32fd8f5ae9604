"""Cross-layer transcoders: the sparse training step against the dense one (float64), the splice's exact
logits, the field's folder layouts bit for bit, and bad input refused in one line.

(Split out of the flat test_dictionaries_clt module, issue 38.)"""
import pytest
import torch

from circuitlab.dictionaries.clt import CLTConfig
from circuitlab.dictionaries.clt_train import CLTCoefficients, clt_training_step
from circuitlab.dictionaries.resample import resample_dead
from circuitlab.errors import CircuitlabError

from dictionaries.test_clt import N, L, D, _clt, _data  # noqa: F401 (shared with it)


@pytest.mark.parametrize("arch", ["jumprelu", "relu"])
def test_the_training_loss_is_the_definition(arch):
    """Dense step in float64 against the formula written out: Σ_layers MSE + λ Σ tanh(c a ‖W_dec‖) (JumpReLU) or
    λ Σ a ‖W_dec‖ (ReLU: L1) + λ_p Σ ReLU(θ − pre) ‖W_dec‖ (ReLU: θ = 0); θ gets no gradient from the last term."""
    clt = _clt(arch)
    xs, ys = _data()
    coef = CLTCoefficients(sparsity=0.3, aux=0.0, bandwidth=0.2, tanh_scale=2.0, preact=0.1)
    out = clt_training_step(clt, xs, ys, coef, None, sparse=False)
    with torch.no_grad():
        y_hat, acts = clt(xs)
        norms = clt.decoder_norms()                                       # [L, N]
        pre = torch.stack([clt.pre_acts(xs[:, l], l) for l in range(L)], 1)
        theta = torch.stack(list(clt.threshold)) if arch == "jumprelu" else torch.zeros(L, N, dtype=xs.dtype)
        penalty = torch.tanh(2.0 * acts * norms) if arch == "jumprelu" else acts * norms
        want = ((y_hat - ys) ** 2).sum((1, 2)).mean() + 0.3 * penalty.sum() / 40 + 0.1 * ((theta - pre).relu() * norms).sum() / 40
    torch.testing.assert_close(out.loss.detach(), want, rtol=1e-12, atol=1e-12)
    if arch == "jumprelu":  # θ's gradient is the sparsity term's alone (straight-through)
        clt.zero_grad(set_to_none=True)
        out.loss.backward()
        with_preact = clt.threshold[0].grad.clone()
        clt.zero_grad(set_to_none=True)
        clt_training_step(clt, xs, ys, CLTCoefficients(**{**vars(coef), "preact": 0.0}), None, sparse=False).loss.backward()
        torch.testing.assert_close(with_preact, clt.threshold[0].grad, rtol=0, atol=0)
    # the output at layer t is Σ_{s ≤ t} W_dec^{s→t} a^s + b^t
    t = 2
    manual = clt.b_dec[t] + sum(acts[:, s] @ clt.decoder(s, t) for s in range(t + 1))
    torch.testing.assert_close(y_hat[:, t], manual)


@pytest.mark.parametrize("arch,target", [("jumprelu", 0.0), ("topk", 0.0), ("jumprelu", 2.0), ("relu", [1.0, 3.0])])
def test_training_resumes_exactly(tmp_path, arch, target):
    """Also in target-L0 mode (one target, or one per layer), stopped while the per-layer controller steers (its
    state is checkpointed)."""
    from circuitlab.dictionaries.planted import PlantedCrossLayer
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    planted = PlantedCrossLayer(n_layers=2, d=8, n_per_layer=8, rows_per_chunk=256)
    cfg = CLTConfig(arch, n_layers=2, d_model=8, d_sae=12, k=2 if arch == "topk" else None)
    train = DictTrainConfig(steps=12, batch_size=64, dead_after=3, ckpt_every=5, target_l0=target)

    def trainer():
        return DictionaryTrainer([cfg], train, ActivationStore(planted, 64))

    whole = trainer().fit(tmp_path / "whole", progress=False).dictionaries[0]
    trainer().fit(tmp_path / "cut", progress=False, stop_at=7)
    resumed = trainer().fit(tmp_path / "cut", progress=False).dictionaries[0]
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if target:  # one coefficient per layer, saved with the CLT
        held = whole.cfg.metadata["sparsity_coeff"]
        assert len(held) == 2 and held == resumed.cfg.metadata["sparsity_coeff"] and held[0] != held[1]
        assert whole.cfg.metadata["target_l0"] == resumed.cfg.metadata["target_l0"] == ([target] * 2 if target == 2.0 else target)


def test_resampling_points_dead_latents_at_the_worst_rows():
    clt = _clt("jumprelu")
    xs, ys = _data(rows=64)
    opt = torch.optim.Adam(clt.parameters())
    clt_training_step(clt, xs, ys, CLTCoefficients(0.1, 0.0, 0.2), None).loss.backward()
    opt.step()
    before = {k: v.clone() for k, v in clt.state_dict().items()}
    dead = torch.zeros(L * N, dtype=torch.bool)
    dead[[3, N + 5]] = True  # latent 3 of layer 0, latent 5 of layer 1
    n = resample_dead(clt, opt, dead, xs, ys, torch.Generator().manual_seed(0), threshold=0.1)
    assert n == 2
    after = clt.state_dict()
    assert not torch.equal(after["W_dec.0"][3], before["W_dec.0"][3]) and not torch.equal(after["W_enc.1"][:, 5], before["W_enc.1"][:, 5])
    assert torch.equal(after["W_dec.0"][4], before["W_dec.0"][4]) and torch.equal(after["W_dec.2"], before["W_dec.2"])
    assert float(after["W_dec.1"][5].norm()) == pytest.approx(1.0) and float(after["threshold.0"][3]) == pytest.approx(0.1)
    assert float(opt.state[clt.W_dec[0]]["exp_avg"][3].abs().sum()) == 0
    with pytest.raises(CircuitlabError, match="not 'split'"):
        resample_dead(clt, opt, dead, xs, ys, torch.Generator(), method="split")
