"""Matryoshka BatchTopK (dictionaries/arch/matryoshka.py) against its definition, in float64: the batch's top
k·rows kept with BatchTopK's running threshold, and the loss the sum of every nested prefix's reconstruction
error; the sparse step equals the dense one; a mutated loss is caught; it learns what its prefixes promise; it
is saved, loaded and read by SAELens as the JumpReLU it is at inference."""
import pytest
import torch

from circuitlab.dictionaries import CLTConfig, DictionaryConfig, SparseDictionary
from circuitlab.dictionaries.arch import get_architecture, register_architecture, unregister_architecture
from circuitlab.dictionaries.arch.matryoshka import MatryoshkaBatchTopK
from circuitlab.dictionaries.objectives import Coefficients, training_step
from circuitlab.dictionaries.planted import PlantedFeatures
from circuitlab.dictionaries.store import ActivationStore
from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
from circuitlab.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")
D_IN, D_OUT, D_SAE, K, ROWS, WIDTHS = 12, 10, 64, 3, 40, [4, 16, 64]
COEF = Coefficients(sparsity=0.0, aux=0.5, bandwidth=0.2, threshold_decay=0.5)


def _dictionary(skip: bool, arch: str = "matryoshka_batchtopk") -> SparseDictionary:
    extra = {"out_hook_name": "b", "d_out": D_OUT, "skip": True} if skip else {}
    cfg = DictionaryConfig(arch, d_in=D_IN, d_sae=D_SAE, k=K, matryoshka_widths=WIDTHS, hook_name="a",
                           dtype="float64", **extra)
    sae = SparseDictionary(cfg, seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # away from the initialisation: biases, a skip connection, a running threshold
        sae.b_enc.copy_(torch.randn(D_SAE, generator=g, dtype=torch.float64) - 0.3)
        sae.b_dec.copy_(torch.randn(sae.cfg.d_out, generator=g, dtype=torch.float64))
        if skip:
            sae.W_skip.copy_(torch.randn(D_IN, D_OUT, generator=g, dtype=torch.float64))
        sae.threshold.fill_(0.7)
    return sae


def _data(skip: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(ROWS, D_IN, generator=g, dtype=torch.float64)
    return x, (torch.randn(ROWS, D_OUT, generator=g, dtype=torch.float64) if skip else x)


def _definition(sae: SparseDictionary, x: torch.Tensor, y: torch.Tensor, threshold: float, decay: float):
    """The loss written out from the papers' description, autograd through plain tensors: the k·rows largest
    ReLU'd pre-activations of the whole batch are kept; each width m's output is b_dec (+ the skip) + the kept
    activations of latents < m through their decoder rows; the loss sums every width's squared error (summed
    over the output, mean over rows). Also the running threshold it leaves: decay·θ + (1 − decay)·(smallest
    kept value)."""
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc if sae.cfg.apply_b_dec_to_input else x @ sae.W_enc + sae.b_enc
    flat = pre.relu().flatten()
    top = flat.detach().topk(K * len(x)).indices
    acts = torch.zeros_like(flat).index_put((top,), flat[top]).view_as(pre)
    base = sae.b_dec + (x @ sae.W_skip if sae.cfg.skip else 0.0)
    loss = sum(((acts[:, :m] @ sae.W_dec[:m] + base - y) ** 2).sum(-1).mean() for m in WIDTHS)
    return loss, decay * threshold + (1 - decay) * float(flat[top].detach().min())


def _step(sae, x, y, sparse, coef=COEF):
    """One step's loss, gradients and running threshold, leaving the dictionary as it was."""
    saved = {k: v.clone() for k, v in sae.state_dict().items()}
    sae.zero_grad(set_to_none=True)
    out = training_step(sae, x, y, coef, None, sparse=sparse)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in sae.named_parameters() if p.grad is not None}
    after = float(sae.threshold[0])
    sae.load_state_dict(saved)
    return out, grads, after


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("skip", [False, True], ids=["sae", "skip-transcoder"])
def test_the_step_is_the_definition_loss_gradients_and_threshold(skip, sparse):
    sae, (x, y) = _dictionary(skip), _data(skip)
    out, grads, threshold = _step(sae, x, y, sparse)
    sae.zero_grad(set_to_none=True)
    want, want_threshold = _definition(sae, x, y, 0.7, COEF.threshold_decay)
    want.backward()
    torch.testing.assert_close(out.loss, want.detach(), rtol=0, atol=1e-10)
    assert out.l0 == K and threshold == pytest.approx(want_threshold, abs=1e-12)
    for name, p in sae.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-9, msg=name)
    # the full width's term is the step's own MSE; the nested ones come on top of it
    assert float(out.loss.detach()) > float(out.mse) > 0


def test_a_mutated_loss_fails_the_definition():
    """The check above catches a plausible slip: prefixes that forget the earlier groups (each group
    reconstructing on its own) give another loss; so does dropping the nested terms (plain BatchTopK)."""

    class EachGroupAlone(MatryoshkaBatchTopK):
        name = "toy_matryoshka_groups_alone"

        def reconstruction_terms(self, partial, base, y, widths):
            return [((base + partial(lo, hi) - y) ** 2).sum(-1).mean() for lo, hi in zip([0, *widths], widths[:-1])]

    sae, (x, y) = _dictionary(False), _data(False)
    with torch.no_grad():
        want, _ = _definition(sae, x, y, 0.7, COEF.threshold_decay)
    register_architecture(EachGroupAlone)
    try:
        for arch in ("toy_matryoshka_groups_alone", "batchtopk"):
            mutant = _dictionary(False, arch) if arch != "batchtopk" else None
            if mutant is None:  # BatchTopK: the same weights without the widths
                mutant = SparseDictionary(sae.cfg.replace(architecture="batchtopk", matryoshka_widths=None))
                mutant.load_state_dict(sae.state_dict())
            out, _, _ = _step(mutant, x, y, sparse=False)
            assert abs(float(out.loss.detach()) - float(want)) > 1e-3, arch
    finally:
        unregister_architecture("toy_matryoshka_groups_alone")


def _fit(arch: str, tmp_path, steps: int = 300):
    planted = PlantedFeatures(n_features=48, d=16, l0=3, zipf=1.0, seed=0, rows_per_chunk=4096)
    cfg = DictionaryConfig(arch, d_in=16, d_sae=48, k=3, hook_name="planted",
                           matryoshka_widths=[6, 48] if arch == "matryoshka_batchtopk" else None)
    train = DictTrainConfig(steps=steps, batch_size=256, lr=3e-3, log_every=100, dead_after=50)
    trainer = DictionaryTrainer([cfg], train, ActivationStore(planted, 256), ActivationStore(planted, 1024, split="val"))
    result = trainer.fit(tmp_path / arch, progress=False)
    return planted, result.dictionaries[0], result.metrics[0], result.folders[0]


@pytest.mark.slow
def test_its_first_latents_reconstruct_on_their_own_where_batchtopks_do_not(tmp_path):
    """The point of the nesting: on planted Zipf-distributed features the first 6 of 48 latents, alone,
    explain much more of the variance than BatchTopK's first 6 (whose latents come in no order), at a
    similar full-width fit. Measured (seed 0, 300 steps of 256): prefix 0.49 vs 0.02, all 48: 0.71 vs 0.73."""
    fits = {arch: _fit(arch, tmp_path) for arch in ("matryoshka_batchtopk", "batchtopk")}
    planted = fits["batchtopk"][0]
    x = planted.chunk(0, "val")["planted"]

    def prefix_ev(sae: SparseDictionary, m: int) -> float:
        with torch.no_grad():
            acts = sae.encode(x)
            out = acts[:, :m] @ sae.W_dec[:m] + sae.b_dec
        return 1 - float((out - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())

    ours, theirs = (prefix_ev(fits[a][1], 6) for a in ("matryoshka_batchtopk", "batchtopk"))
    assert ours > theirs + 0.3, (ours, theirs)
    full = [fits[a][2].explained_variance for a in ("matryoshka_batchtopk", "batchtopk")]
    assert full[0] > full[1] - 0.05 and full[0] > 0.6, full


def test_it_is_saved_as_the_jumprelu_it_is_and_loads_back_and_in_saelens(tmp_path):
    sae_lens = pytest.importorskip("sae_lens")
    planted, trained, metrics, folder = _fit("matryoshka_batchtopk", tmp_path, steps=40)
    assert trained.cfg.architecture == "jumprelu" and trained.cfg.matryoshka_widths is None
    assert trained.cfg.metadata["trained_as"] == "matryoshka_batchtopk"
    assert trained.cfg.metadata["matryoshka_widths"] == [6, 48] and trained.cfg.metadata["k"] == 3
    x = planted.chunk(1, "val")["planted"][:64]
    loaded = SparseDictionary.load(folder)
    with torch.no_grad():
        assert loaded.cfg == trained.cfg and torch.equal(loaded(x)[0], trained(x)[0])
        # inference is per token: the JumpReLU with the running threshold
        torch.testing.assert_close(trained.encode(x), trained.pre_acts(x) * (trained.pre_acts(x) > trained.threshold))
        from circuitlab.dictionaries.saelens import save_saelens
        theirs = sae_lens.SAE.load_from_disk(str(save_saelens(trained, tmp_path / "saelens")))
        torch.testing.assert_close(theirs.encode(x), trained.encode(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(theirs(x), trained(x)[0], rtol=1e-5, atol=1e-5)


def test_its_widths_are_checked_in_one_line():
    def cfg(arch="matryoshka_batchtopk", **kw):
        return DictionaryConfig(arch, d_in=8, d_sae=32, k=2, hook_name="a", **kw)

    assert cfg(matryoshka_widths=[4, 16]).matryoshka_widths == [4, 16, 32]   # d_sae appended, as SAELens does
    for widths, match in (((None), "must be a list of positive ints .*e.g. \\[2, 8, 32\\]"),
                          ([4, 4, 32], "strictly increasing"), ([8, 64], "more than d_sae=32"),
                          ([0, 32], "positive ints"), ([2.5, 32], "positive ints")):
        with pytest.raises(ConfigError, match=match):
            cfg(matryoshka_widths=widths)
    with pytest.raises(ConfigError, match="'batchtopk' has none: drop it"):
        cfg("batchtopk", matryoshka_widths=[4, 32])
    with pytest.raises(ConfigError, match="a CLT cannot be a matryoshka_batchtopk dictionary"):
        CLTConfig("matryoshka_batchtopk", n_layers=2, d_model=8, d_sae=16, k=2)
    assert get_architecture("matryoshka_batchtopk").saved_as == "jumprelu"


def test_the_loss_and_gradients_are_saelenss_on_the_same_weights():
    """SAELens's MatryoshkaBatchTopKTrainingSAE (the peer) on the same weights and batch: the same loss (its
    MSE plus its inner_mse_loss_<width> terms) and the same gradients."""
    pytest.importorskip("sae_lens")
    from sae_lens.saes.matryoshka_batchtopk_sae import (
        MatryoshkaBatchTopKTrainingSAE, MatryoshkaBatchTopKTrainingSAEConfig,
    )
    from sae_lens.saes.sae import TrainStepInput

    sae, (x, y) = _dictionary(False), _data(False)
    peer = MatryoshkaBatchTopKTrainingSAE(MatryoshkaBatchTopKTrainingSAEConfig(
        d_in=D_IN, d_sae=D_SAE, k=K, matryoshka_widths=list(WIDTHS), dtype="float64", apply_b_dec_to_input=True))
    peer.load_state_dict({k: v.clone() for k, v in sae.state_dict().items() if k != "threshold"}, strict=False)
    step = peer.training_forward_pass(TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=None,
                                                     n_training_steps=0, is_logging_step=False))
    assert {f"inner_mse_loss_{m}" for m in WIDTHS[:-1]} <= set(step.losses)
    step.loss.backward()
    out, grads, _ = _step(sae, x, y, sparse=True, coef=Coefficients(0.0, 0.0, 0.2, 0.5))
    torch.testing.assert_close(out.loss.detach(), step.loss.detach(), rtol=0, atol=1e-10)
    for name, p in peer.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-9, msg=name)
