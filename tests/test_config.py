"""Core Transformer: config validation, hooks, cache, fast/eager agreement, per-head views.

(Split out of the flat test_model module, issue 38.)"""
import json
import re

import pytest
import torch

from circuitlab import ConfigError, ModelConfig, Transformer, presets

torch.manual_seed(0)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("bad, field", [
    (dict(d_model=100, n_heads=3), "d_model"),
    (dict(n_heads=4, n_kv_heads=3), "n_heads"),
    (dict(d_model=0), "d_model"),
    (dict(n_ctx=-1), "n_ctx"),
    (dict(norm="batchnorm"), "norm"),
    (dict(d_model="128"), "d_model"),
    (dict(use_attn_out=False), "use_attn_out"),
])
def test_invalid_config_names_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**bad)


def test_unknown_field_suggests_closest():
    with pytest.raises(ConfigError, match="n_layer.*did you mean 'n_layers'"):
        ModelConfig.from_dict({"n_layer": 2})


@pytest.mark.parametrize("name", list(presets()))
def test_presets_roundtrip_json_and_yaml(name, tmp_path):
    cfg = ModelConfig.from_preset(name)
    assert ModelConfig.from_dict(json.loads(cfg.to_json())) == cfg
    cfg.save(tmp_path / "c.yaml")
    assert ModelConfig.load(tmp_path / "c.yaml") == cfg


def test_quick_preset_size():
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_preset("quick"))
    assert 4.3e6 < model.num_params(include_embeddings=False) < 4.5e6
    assert model.num_params(include_embeddings=True) > model.num_params(include_embeddings=False)


@pytest.mark.parametrize("scaling, message", [
    ({"type": "yarn", "factor": 2.0}, "rope_scaling['type'] must be one of"),
    ({"type": "linear"}, "needs exactly the keys"),
    ({"type": "linear", "factor": -1.0}, "must be a positive number"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 64}, "high_freq_factor must be above"),
])
def test_bad_rope_scaling_names_the_rule(scaling, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelConfig.from_preset("llama-tiny", rope_scaling=scaling)


def test_rope_scaling_round_trips_through_yaml(tmp_path):
    cfg = ModelConfig.from_preset("llama-tiny", rope_scaling={"type": "linear", "factor": 2.0})
    cfg.save(tmp_path / "c.yaml")
    assert ModelConfig.load(tmp_path / "c.yaml") == cfg
