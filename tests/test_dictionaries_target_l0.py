"""Target-L0 mode: the trainer steers a penalty-based dictionary's sparsity coefficient to the L0 the user
names, then holds it; checked on planted features of scales and sparsities the defaults were not tuned on."""
import math

import pytest
import torch

from circuitlab.dictionaries import DictionaryConfig
from circuitlab.dictionaries.planted import PlantedFeatures, recovery
from circuitlab.dictionaries.store import ActivationStore
from circuitlab.dictionaries.target_l0 import L0Controller
from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
from circuitlab.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_controller_finds_the_coefficient_of_a_known_response_then_holds_it():
    """A plant whose L0 is 120 / coeff (per layer: 120 / coeff and 30 / coeff): the controller reaches the
    coefficients that give the targets, holds them after steering, and its state round-trips."""
    ctl = L0Controller([4.0, 6.0], start=1.0, steer_until=2000)
    scale = torch.tensor([120.0, 30.0], dtype=torch.float64)
    for step in range(2200):
        ctl.update(step, scale / ctl.coefficient(step))
    want = scale / torch.tensor([4.0, 6.0], dtype=torch.float64)
    assert torch.allclose(ctl.held(), want, rtol=0.02), (ctl.held(), want)
    assert torch.equal(ctl.coefficient(2100), ctl.held())  # held: no more steering
    again = L0Controller([4.0, 6.0], start=1.0, steer_until=2000)
    again.load_state_dict(ctl.state_dict())
    assert torch.equal(again.coefficient(5), ctl.coefficient(5)) and torch.equal(again.held(), ctl.held())
    with pytest.raises(ConfigError, match="positive"):
        L0Controller(0.0, start=1.0, steer_until=10)


def _train(planted, archs, target, d_sae, steps, batch=1024, k=None, **train):
    cfgs = [DictionaryConfig(a, d_in=planted.d, d_sae=d_sae, k=k if a in ("topk", "batchtopk") else None,
                             hook_name=planted.hook_name) for a in archs]
    own = [{"target_l0": target} if a in ("relu", "jumprelu") else {} for a in archs]
    trainer = DictionaryTrainer(cfgs, DictTrainConfig(steps=steps, batch_size=batch, **train), ActivationStore(planted, batch),
                                ActivationStore(planted, 2048, split="val"), overrides=own)
    return trainer.fit(progress=False)


@pytest.mark.slow
def test_target_l0_on_planted_features_the_defaults_were_not_tuned_on():
    """The issue's setting: 256 directions in 64 dims, Zipf firing, true L0 4, 512 latents, 2,000 steps,
    documented defaults plus target_l0 = 4 (~11 min on a busy core). ReLU ends within 10% of the target
    (measured 3.83; without a target: 100) and TopK (k = 4) recovers the directions (0.990).

    Not met yet, so not asserted (docs/dictionaries.md): ReLU's recovery at that L0 (mean max cosine
    0.45 — the L1 coefficient that gives L0 4 shrinks the reconstruction away, explained variance 0.02),
    JumpReLU's L0 (3.06: once its thresholds have risen, lowering the coefficient does not bring them
    down) and recovery (0.62)."""
    planted = PlantedFeatures(n_features=256, d=64, l0=4, zipf=0.5, seed=0)
    result = _train(planted, ("relu", "jumprelu", "topk"), 4.0, d_sae=512, steps=2000, k=4)
    relu, _, topk = result.metrics
    assert abs(relu.l0 - 4.0) <= 0.4, relu.l0
    assert recovery(result.dictionaries[2].W_dec.detach(), planted.directions).mean() >= 0.9


def test_target_l0_is_refused_for_topk_and_negative():
    planted = PlantedFeatures(n_features=8, d=4)
    cfg = DictionaryConfig("topk", d_in=4, d_sae=8, k=2, hook_name="planted")
    with pytest.raises(ConfigError, match="sets its L0 with k"):
        DictionaryTrainer([cfg], DictTrainConfig(), ActivationStore(planted, 64), overrides=[{"target_l0": 2}])
    with pytest.raises(ConfigError, match="target_l0 must be a finite number >= 0"):
        DictTrainConfig(target_l0=-1)
    assert math.isclose(DictTrainConfig(target_l0="4").target_l0, 4.0)
