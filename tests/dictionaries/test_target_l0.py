"""Target-L0 mode: the trainer steers a penalty-based dictionary's sparsity coefficient to the L0 the user
names, then holds it; checked on planted features of scales and sparsities the defaults were not tuned on."""
import math

import pytest
import torch

from circuitlab.dictionaries import DictionaryConfig
from circuitlab.dictionaries.planted import PlantedFeatures, recovery
from circuitlab.dictionaries.store import ActivationStore
from circuitlab.dictionaries.target_l0 import L0Controller, cut_for_l0
from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
from circuitlab.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_controller_finds_the_coefficient_of_a_known_response_then_settles():
    """A plant whose L0 is 120 / coeff (per layer: 120 / coeff and 30 / coeff): the controller reaches the
    coefficients that give the targets; with its gain decayed to 0 (as the trainer's learning rate) the
    coefficient stays where it settled; its state round-trips."""
    ctl = L0Controller([4.0, 6.0], start=1.0, glide_until=1000)
    scale = torch.tensor([120.0, 30.0], dtype=torch.float64)
    for step in range(2000):
        ctl.update(step, scale / ctl.coefficient())
    want = scale / torch.tensor([4.0, 6.0], dtype=torch.float64)
    assert torch.allclose(ctl.coefficient(), want, rtol=0.02), (ctl.coefficient(), want)
    settled = ctl.coefficient()
    ctl.update(2000, scale / settled * 3, gain=0.0)  # far off, but the learning rate has decayed to 0
    assert torch.equal(ctl.coefficient(), settled)
    again = L0Controller([4.0, 6.0], start=1.0, glide_until=1000)
    again.load_state_dict(ctl.state_dict())
    assert torch.equal(again.coefficient(), ctl.coefficient()) and torch.equal(again.set_point(5), ctl.set_point(5))
    for bad in (0.0, [2.0, float("inf")]):
        with pytest.raises(ConfigError, match="positive and finite"):
            L0Controller(bad, start=1.0, glide_until=10)


def _train(planted, archs, target, d_sae, steps, batch=1024, k=None, **train):
    cfgs = [DictionaryConfig(a, d_in=planted.d, d_sae=d_sae, k=k if a in ("topk", "batchtopk") else None,
                             hook_name=planted.hook_name) for a in archs]
    own = [{"target_l0": target} if a in ("relu", "jumprelu") else {} for a in archs]
    trainer = DictionaryTrainer(cfgs, DictTrainConfig(steps=steps, batch_size=batch, **train), ActivationStore(planted, batch),
                                ActivationStore(planted, 2048, split="val"), overrides=own)
    return trainer.fit(progress=False)


def test_target_l0_recovers_planted_features_fast():
    """ReLU and JumpReLU steered to the true L0 of planted features (48 directions in 32 dimensions, L0 3,
    96 latents, 600 steps of 256 at lr 3e-3; a few seconds): the L0 ends within 10% of the target and the
    directions are recovered. Measured: ReLU L0 2.93, mean max cosine 0.983; JumpReLU 2.96, 0.995. Without
    the start at the target L0 (the encoder bias from target_l0.cut_for_l0) both stay dense for most of
    the run and this fails (cosine below 0.8)."""
    planted = PlantedFeatures(n_features=48, d=32, l0=3, zipf=0.5, seed=0)
    result = _train(planted, ("relu", "jumprelu"), 3.0, d_sae=96, steps=600, batch=256, lr=3e-3)
    for sae, m in zip(result.dictionaries, result.metrics):
        cos = float(recovery(sae.W_dec.detach(), planted.directions).mean())
        assert abs(m.l0 - 3.0) <= 0.3 and cos >= 0.9, (sae.cfg.architecture, m.l0, cos)
        assert sae.cfg.metadata["target_l0"] == 3.0 and sae.cfg.metadata["sparsity_coeff"] > 0


def test_the_start_fires_each_latent_on_its_share_of_rows():
    """cut_for_l0: b_enc − cut makes every latent fire on target / d_sae of the rows (L0 = target), per latent."""
    pre = torch.randn(4000, 50, dtype=torch.float64) * torch.linspace(0.5, 3.0, 50, dtype=torch.float64) + 1.0
    fires = pre > cut_for_l0(pre, 5.0)
    assert fires.sum(0).eq(400).all()                       # 5 / 50 of 4000 rows, each latent
    assert float(fires.sum(-1).double().mean()) == 5.0
    assert (pre > cut_for_l0(pre, 50.0)).all()              # every latent on every row


# (distribution, target, d_sae, steps, batch): the setting and two the defaults were not tuned on. The
# densest (L0 6, 4x superposition) trains at the budget, 2,000 steps of 1,024 rows: at 1,500 of 512 JumpReLU
# recovered 0.897 (0.783 before its decoder learned at the thresholds' rate), at 2,000 of 1,024 0.938 with the
# data's seed 0 and with seed 1 (docs/dictionaries.md). Every architecture must reach 0.9, as the issue asks.
SETTINGS = [(dict(n_features=256, d=64, l0=4), 4.0, 512, 2000, 1024),
            (dict(n_features=128, d=32, l0=2), 2.0, 256, 1500, 512),
            (dict(n_features=192, d=48, l0=6), 6.0, 384, 2000, 1024)]


@pytest.mark.slow
@pytest.mark.parametrize("setting", SETTINGS, ids=["256-in-64-L0-4", "128-in-32-L0-2", "192-in-48-L0-6"])
def test_target_l0_on_planted_features_the_defaults_were_not_tuned_on(setting):
    """The issue's setting (256 directions in 64 dims, Zipf firing, true L0 4, 512 latents, 2,000 steps,
    documented defaults plus target_l0 = 4) and two other scales and sparsities: ReLU and JumpReLU end
    within 10% of the target and recover the planted directions (mean max cosine >= 0.9), as TopK with k = the
    target does. Measured figures in docs/dictionaries.md (Target L0)."""
    dist, target, d_sae, steps, batch = setting
    planted = PlantedFeatures(zipf=0.5, seed=0, **dist)
    result = _train(planted, ("relu", "jumprelu", "topk"), target, d_sae=d_sae, steps=steps, batch=batch, k=int(target))
    for sae, m in zip(result.dictionaries, result.metrics):
        cos = float(recovery(sae.W_dec.detach(), planted.directions).mean())
        print(f"{sae.cfg.metadata.get('trained_as', sae.cfg.architecture)}: L0 {m.l0:.2f} (target {target}), "
              f"mean max cosine {cos:.3f}, explained variance {m.explained_variance:.3f}, dead {m.dead_frac:.1%}")
        if sae.cfg.architecture != "topk":
            assert abs(m.l0 - target) <= 0.1 * target, (sae.cfg.architecture, m.l0)
        assert cos >= 0.9, (sae.cfg.architecture, cos)


def test_target_l0_is_refused_for_topk_and_negative():
    planted = PlantedFeatures(n_features=8, d=4)
    cfg = DictionaryConfig("topk", d_in=4, d_sae=8, k=2, hook_name="planted")
    with pytest.raises(ConfigError, match="sets its L0 with k"):
        DictionaryTrainer([cfg], DictTrainConfig(), ActivationStore(planted, 64), overrides=[{"target_l0": 2}])
    with pytest.raises(ConfigError, match="target_l0 must be a finite number >= 0"):
        DictTrainConfig(target_l0=-1)
    assert math.isclose(DictTrainConfig(target_l0="4").target_l0, 4.0)


def test_a_clt_reaches_a_different_target_at_each_layer():
    """target_l0 = [1, 2, 3] on a ReLU CLT over planted cross-layer features firing 1, 2 and 3 per row at
    their source layers (16 per layer in d = 32, writing into 3 layers; 1,200 steps of 256, a few seconds):
    each layer ends within 10% of its own target, the directions are recovered, and the targets and the
    coefficients settled on are saved per layer. Measured (seeds 0 / 1 / 2): L0 1.03 / 1.97 / 2.98,
    1.02 / 1.95 / 2.98, 0.97 / 1.99 / 2.95; mean max cosine 0.949, 0.947, 0.968."""
    from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
    from circuitlab.dictionaries.planted import PlantedCrossLayer

    targets = [1.0, 2.0, 3.0]
    planted = PlantedCrossLayer(n_layers=3, d=32, n_per_layer=16, reach=2, l0=targets, zipf=0.0, seed=0)
    train = DictTrainConfig(steps=1200, batch_size=256, lr=3e-3, target_l0=targets)
    trainer = DictionaryTrainer([CLTConfig("relu", n_layers=3, d_model=32, d_sae=16)], train,
                                ActivationStore(planted, 256), ActivationStore(planted, 1024, split="val"))
    result = trainer.fit(None, progress=False)
    clt, metrics = result.dictionaries[0], result.metrics[0]
    assert all(abs(l0 - t) <= 0.1 * t for l0, t in zip(metrics.layer_l0, targets)), metrics.layer_l0
    assert float(planted.clt_recovery(clt).mean()) >= 0.9
    assert clt.cfg.metadata["target_l0"] == targets and len(clt.cfg.metadata["sparsity_coeff"]) == 3
    assert isinstance(clt, CrossLayerTranscoder)


@pytest.mark.parametrize("target,message", [
    ([1.0, 2.0], "train.target_l0 names 2 L0s but the CLT has 3 layers"),
    ([1.0, 0.0, 2.0], "non-empty list of finite numbers > 0 (item 1 is 0.0)"),
    ([1.0, float("nan"), 2.0], "(item 1 is nan)"),
    ([], "non-empty list"),
    ("1,x,2", "(item 1 is 'x')"),
])
def test_per_layer_targets_are_refused_in_one_line(target, message):
    from circuitlab.dictionaries.clt import CLTConfig
    from circuitlab.dictionaries.planted import PlantedCrossLayer

    planted = PlantedCrossLayer(n_layers=3, d=8, n_per_layer=4, rows_per_chunk=256)
    with pytest.raises(ConfigError) as e:
        DictionaryTrainer([CLTConfig("relu", n_layers=3, d_model=8, d_sae=8)], DictTrainConfig(target_l0=target),
                          ActivationStore(planted, 64))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_list_of_targets_is_per_layer_only():
    """An SAE has one layer: a list of two targets is refused; a list of one is that number; text with commas
    (the command line's --target-l0 8,8,4) is a list."""
    planted = PlantedFeatures(n_features=8, d=4)
    cfg = DictionaryConfig("relu", d_in=4, d_sae=8, hook_name="planted")
    with pytest.raises(ConfigError, match="the relu dictionary for planted has one layer"):
        DictionaryTrainer([cfg], DictTrainConfig(target_l0=[2.0, 3.0]), ActivationStore(planted, 64))
    trainer = DictionaryTrainer([cfg], DictTrainConfig(target_l0=[2]), ActivationStore(planted, 64))
    assert trainer.controllers[0].target.tolist() == [2.0]
    assert DictTrainConfig(target_l0="8,8,4").target_l0 == [8.0, 8.0, 4.0]
    assert DictTrainConfig(target_l0=(8, 4)).target_l0 == [8.0, 4.0]   # a list, as JSON gives it back on resume
