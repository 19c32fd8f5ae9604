"""GPT-2's adapter: its export and its import are inverses (Conv1D transposes, fused c_attn, learned positions)."""
import pytest

from circuitlab import CircuitlabError
from circuitlab.pretrained.families.gpt2 import GPT2
from pretrained.families.roundtrip import assert_same_weights, random_model, round_trip

HF = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 4, "n_positions": 16, "vocab_size": 61,
      "n_inner": 40}


@pytest.mark.parametrize("fields", [{}, {"tie_word_embeddings": False, "activation_function": "relu",
                                         "scale_attn_weights": False}])
def test_export_then_import_gives_back_every_weight(fields):
    model = random_model(GPT2(), {**HF, **fields})
    assert_same_weights(round_trip(GPT2(), model), model)


def test_what_gpt2_cannot_express_is_refused_or_named():
    with pytest.raises(CircuitlabError, match="scale_attn_by_inverse_layer_idx"):
        GPT2().config({**HF, "scale_attn_by_inverse_layer_idx": True})
    cfg = GPT2().config(HF).replace(positional="rotary", n_kv_heads=2)
    assert GPT2().export_problems(cfg) == ["n_kv_heads=2 (grouped-query attention)",
                                           "positional='rotary' (needs learned)"]
