"""LLaMA's adapter and its two model_type siblings (Mistral, Qwen2: modules of their own that subclass it): export
and import are inverses, and each sibling keeps its own reading of the same config fields."""
import pytest

from circuitlab.pretrained.families.llama import Llama
from circuitlab.pretrained.families.mistral import Mistral
from circuitlab.pretrained.families.qwen2 import Qwen2
from pretrained.families.roundtrip import assert_same_weights, random_model, round_trip

HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 24, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 20, "max_position_embeddings": 32, "vocab_size": 61}


@pytest.mark.parametrize("fields", [{}, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
                                    {"head_dim": 8, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}])
def test_export_then_import_gives_back_every_weight(fields):
    model = random_model(Llama(), {**HF, **fields})
    assert_same_weights(round_trip(Llama(), model), model)


def test_mistral_and_qwen2_read_the_window_and_the_biases_their_own_way():
    window = {**HF, "sliding_window": 8}
    assert Llama().config(window).n_ctx == Mistral().config(window).n_ctx == 8   # the window bounds the context
    assert Qwen2().config(window).n_ctx == 32                                     # off unless turned on
    assert Qwen2().config({**window, "use_sliding_window": True}).n_ctx == 8
    assert not Mistral().config(HF).bias and Qwen2().config(HF).bias              # Qwen2: q/k/v biases always
    assert r"blocks\.\d+\.(attn|mlp)\.out\.bias" in Qwen2().zero_targets(HF, Qwen2().config(HF))
