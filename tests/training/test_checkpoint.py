"""Training: exact resume, DDP equivalence, accumulation, NaN stop, checkpoints, CLI.

(Split out of the flat test_training module, issue 38.)"""
import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.training import load_checkpoint, train

from training.test_trainer import TINY, tiny  # noqa: F401 (shared with it)


def test_checkpoint_roundtrip_and_errors(tmp_path):
    result = train(tiny(tmp_path, steps=3), tmp_path / "r", progress=False)
    model, tokenizer, meta = load_checkpoint(tmp_path / "r")
    t = torch.tensor([tokenizer.encode("Once upon a time")])
    torch.testing.assert_close(model(t), result.model(t))
    assert meta["run"]["name"] == "tiny"
    with pytest.raises(CircuitlabError, match="not found"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "r" / "checkpoint" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CircuitlabError, match="corrupt"):
        load_checkpoint(tmp_path / "r" / "checkpoint")
    with pytest.raises(CircuitlabError, match="already holds a checkpoint"):
        train(tiny(tmp_path, steps=3), tmp_path / "r", progress=False)
