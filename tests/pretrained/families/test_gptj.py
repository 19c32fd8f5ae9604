"""GPT-J's adapter: its export and its import are inverses (one norm read twice, unbiased attention, a biased
unembedding), and the export refuses what GPT-J's blocks cannot hold."""
import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.pretrained.families.gptj import GPTJ
from pretrained.families.roundtrip import assert_same_weights, random_model, round_trip

HF = {"model_type": "gptj", "n_layer": 2, "n_embd": 24, "n_head": 4, "rotary_dim": 4, "n_inner": 30,
      "n_positions": 16, "vocab_size": 61}


def tied_norms(model):
    with torch.no_grad():
        for block in model.blocks:
            block.ln2.w.copy_(block.ln1.w)
            block.ln2.b.copy_(block.ln1.b)
    return model


def test_export_then_import_gives_back_every_weight():
    model = tied_norms(random_model(GPTJ(), HF))
    assert GPTJ.unembed_bias and bool((model.unembed.bias != 0).any())
    assert_same_weights(round_trip(GPTJ(), model), model)


def test_the_export_refuses_two_norms_per_block():
    with pytest.raises(CircuitlabError, match="layer 0 has different ln1 and ln2"):
        GPTJ().export_tensors(random_model(GPTJ(), HF))
