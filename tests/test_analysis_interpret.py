"""The ready-made experiments behind `circuitlab interpret`: figures written, findings JSON-able."""
import json

import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.experiments.interpret_circuits import EXPERIMENTS


class CharTokenizer:
    vocab_size, eos_id = 128, 0

    def encode(self, text: str) -> list[int]:
        return [min(ord(c), 127) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("preset", ["gpt2-tiny", pytest.param("attn-only-2l", marks=pytest.mark.slow)])
def test_every_experiment_writes_figures_and_json(preset, tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset(preset, d_model=32, n_heads=2, d_vocab=128, n_ctx=48))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert set(EXPERIMENTS) == {"circuits", "heads", "logit_lens", "attribution"}
    for name, run in EXPERIMENTS.items():
        found = run(model, CharTokenizer(), tmp_path, "Tom saw a cat. Tom saw a")
        json.dumps(found.to_dict())
        assert found.summary and found.figures, name
        for fig in found.figures:
            assert (tmp_path / fig).read_bytes()[:4] == b"\x89PNG", (name, fig)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    lens = EXPERIMENTS["logit_lens"](model, CharTokenizer(), tmp_path, None)  # default prompt
    assert lens.data["labels"] == ["embed", "L0", "L1"] and len(lens.data["tokens"]) == 48  # cropped to n_ctx
    with pytest.raises(CircuitlabError, match="no tokens"):
        EXPERIMENTS["attribution"](model, type("Empty", (CharTokenizer,), {"encode": lambda s, t: []})(),
                                   tmp_path, "x")
