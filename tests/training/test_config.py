"""Training: exact resume, DDP equivalence, accumulation, NaN stop, checkpoints, CLI.

(Split out of the flat test_training module, issue 38.)"""
import pytest

from circuitlab import ConfigError
from circuitlab.training import RunConfig


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="train.lr"):
        RunConfig.from_dict({"train": {"lr": "fast"}})
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        RunConfig.from_dict({"train": {"step": 3}})
    with pytest.raises(ConfigError, match="seq_len"):
        RunConfig.from_dict({"model": {"preset": "attn-only-1l", "n_ctx": 16}, "train": {"seq_len": 32}}).model_config(10)


@pytest.mark.parametrize("name", ["demo", "attn-only-1l", "attn-only-8l", "quick", "small", "medium", "mlp-4l"])
def test_bundled_configs_parse(name):
    from circuitlab.training.config_files import resolve_config

    run = RunConfig.load(resolve_config(name))
    cfg = run.model_config(d_vocab=1000)
    assert cfg.n_ctx >= run.train.seq_len
