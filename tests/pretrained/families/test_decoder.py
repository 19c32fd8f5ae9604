"""The newer LLaMA-like adapters that share decoder.py (Gemma-2, Gemma-3, Qwen3, OLMo-2, Phi-3): each one's export
and import are inverses (Gemma's 1 + w gains, sandwich and post norms, q/k norms, Phi-3's fused projections)."""
import pytest

from circuitlab.pretrained.families.decoder import _Decoder
from circuitlab.pretrained.families.gemma2 import Gemma2
from circuitlab.pretrained.families.gemma3 import Gemma3
from circuitlab.pretrained.families.olmo2 import Olmo2
from circuitlab.pretrained.families.phi3 import Phi3
from circuitlab.pretrained.families.qwen3 import Qwen3
from pretrained.families.roundtrip import assert_same_weights, random_model, round_trip

BASE = {"num_hidden_layers": 3, "hidden_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 20, "max_position_embeddings": 32, "vocab_size": 61}
CASES = {
    "gemma2": (Gemma2(), {"model_type": "gemma2", "head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 16,
                          "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
    "gemma3": (Gemma3(), {"model_type": "gemma3_text", "head_dim": 6, "sliding_window": 4,
                          "sliding_window_pattern": 2, "rope_local_base_freq": 100.0, "rope_theta": 5000.0}),
    "qwen3": (Qwen3(), {"model_type": "qwen3", "head_dim": 6, "attention_bias": True}),
    "olmo2": (Olmo2(), {"model_type": "olmo2", "tie_word_embeddings": True}),
    "phi3": (Phi3(), {"model_type": "phi3", "sliding_window": 6, "partial_rotary_factor": 0.5, "num_attention_heads": 3,
                        "num_key_value_heads": 3}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_then_import_gives_back_every_weight(case):
    family, fields = CASES[case]
    assert isinstance(family, _Decoder)
    model = random_model(family, {**BASE, **fields})
    assert_same_weights(round_trip(family, model), model)
