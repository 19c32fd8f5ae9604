"""Cross-layer transcoders against planted truth: features that write into several layers' MLP outputs.

A CLT learns each as one latent (its decoder blocks match the planted output directions, mean max cosine
>= 0.9, no dead latents); per-layer transcoders of the same total width need one latent per layer the
feature writes to. Measured (TopK, k = 2, 3 layers, 24 features
per layer in d = 64, 2,000 steps): CLT mean max cosine 0.907, no dead latent, explained variance 0.79
(per layer 0.79 / 0.80 / 0.79); per-layer transcoders 0.75 / 0.46 / 0.33, using 1.33 latents (cosine >
0.9) for each feature that writes into 3 layers. Slow (a few minutes on one core): `pytest -m slow tests/dictionaries/test_clt_planted.py -s`.
"""
import pytest
import torch

from circuitlab.dictionaries import DictionaryConfig
from circuitlab.dictionaries.clt import CLTConfig
from circuitlab.dictionaries.planted import PlantedCrossLayer
from circuitlab.dictionaries.store import ActivationStore
from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

L, D, PER_LAYER, REACH, D_SAE = 3, 64, 24, 2, 24   # 24 true features per layer, 24 latents per layer


def test_a_clt_recovers_cross_layer_features_that_per_layer_transcoders_split():
    planted = PlantedCrossLayer(n_layers=L, d=D, n_per_layer=PER_LAYER, reach=REACH, l0=2.0, zipf=0.0, seed=0)
    clt = CLTConfig("topk", n_layers=L, d_model=D, d_sae=D_SAE, k=2)
    per_layer = [DictionaryConfig("topk", d_in=D, d_sae=D_SAE, k=2, hook_name=planted.input_hook.format(layer=l),
                                  out_hook_name=planted.output_hook.format(layer=l)) for l in range(L)]
    train = DictTrainConfig(steps=2000, batch_size=512, lr=3e-3, dead_after=100, eval_batches=4, log_every=500,
                            resample_every=250)
    trainer = DictionaryTrainer([clt, *per_layer], train, ActivationStore(planted, 512),
                                ActivationStore(planted, 512, split="val"))
    result = trainer.fit(None, progress=False)
    found, metrics = result.dictionaries[0], result.metrics[0]
    cos = planted.clt_recovery(found)
    per_feature = planted.latents_per_feature([d.W_dec.detach() for d in result.dictionaries[1:]])
    writes = planted.writes.sum(-1)                                   # layers each feature writes to
    print(f"\nCLT: mean max cosine {float(cos.mean()):.3f} (min {float(cos.min()):.3f}), dead {metrics.dead_frac:.1%}, "
          f"explained variance {metrics.explained_variance:.3f}, L0 per layer {[round(x, 2) for x in metrics.layer_l0]}")
    for w in sorted(set(writes.tolist())):
        sel = writes == w
        print(f"features writing into {w} layer(s): per-layer transcoders use {float(per_feature[sel].float().mean()):.2f} "
              f"latents each (cosine > 0.9), the CLT 1")
    print("per-layer transcoders' explained variance:", [round(m.explained_variance, 3) for m in result.metrics[1:]],
          "CLT's by layer:", [round(x, 3) for x in metrics.layer_explained_variance])
    assert float(cos.mean()) >= 0.9
    assert metrics.dead_frac == 0
    # per-layer transcoders split a feature that writes into 3 layers into more than one latent (measured: 1.33)
    assert float(per_feature[writes == 3].float().mean()) > 1.25


# (architecture, latents per layer, recovery floor). With one latent per true feature (16) a CLT can settle
# with two features on one latent (ReLU: layers 1 and 2 at 0.87 / 0.84 on seed 0, seeds 1 and 2 at 0.97 / 0.94);
# with 24 the ReLU CLT recovers 0.98.
PENALTY_SETTINGS = [("relu", 16, 0.88), ("jumprelu", 16, 0.88), ("relu", 24, 0.9)]


@pytest.mark.parametrize("arch,d_sae,floor", PENALTY_SETTINGS, ids=["relu-16", "jumprelu-16", "relu-24"])
def test_target_l0_steers_each_layer_of_a_penalty_clt(arch, d_sae, floor):
    """target_l0 on a ReLU / JumpReLU CLT: one coefficient per layer, each steered by its layer's L0, from a start at
    the target (each layer's encoder bias from target_l0.cut_for_l0). Planted: 3 layers of 16 features in d = 32
    writing into 3 layers, true L0 2 per layer; 1,200 steps of 256. Every layer ends within 10% of the target.
    Measured (seed 0): ReLU-16 L0 2.03 / 1.99 / 2.06, mean max cosine 0.887, no latent dead (it was 2.34 / 2.03 / 1.95
    and 0.878 with the tanh penalty: layer 0's coefficient climbed to 6–67 and killed latents); JumpReLU-16
    1.98 / 1.94 / 2.00, 0.893; ReLU-24 2.01 / 2.03 / 2.04, 0.977."""
    planted = PlantedCrossLayer(n_layers=3, d=32, n_per_layer=16, reach=2, l0=2.0, zipf=0.0, seed=0)
    train = DictTrainConfig(steps=1200, batch_size=256, lr=3e-3, target_l0=2.0)
    trainer = DictionaryTrainer([CLTConfig(arch, n_layers=3, d_model=32, d_sae=d_sae)], train,
                                ActivationStore(planted, 256), ActivationStore(planted, 1024, split="val"))
    result = trainer.fit(None, progress=False)
    clt, metrics = result.dictionaries[0], result.metrics[0]
    cos = float(planted.clt_recovery(clt).mean())
    print(f"\n{arch}, {d_sae} latents per layer: L0 per layer {[round(x, 2) for x in metrics.layer_l0]}, mean max cosine "
          f"{cos:.3f}, dead {[round(x, 3) for x in metrics.layer_dead_frac]}, coefficients "
          f"{[round(c, 3) for c in clt.cfg.metadata['sparsity_coeff']]}")
    assert all(abs(l0 - 2.0) <= 0.2 for l0 in metrics.layer_l0), metrics.layer_l0
    assert cos >= floor
    assert len(clt.cfg.metadata["sparsity_coeff"]) == 3
