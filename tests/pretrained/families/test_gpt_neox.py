"""GPT-NeoX's adapter: its export and its import are inverses (per-head fused query_key_value, partial rotary)."""
import pytest
import torch

from circuitlab.pretrained.families.gpt_neox import GPTNeoX
from circuitlab.pretrained.source import LoadedTensor
from pretrained.families.roundtrip import assert_same_weights, random_model, round_trip

HF = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 24, "num_attention_heads": 2,
      "intermediate_size": 40, "max_position_embeddings": 16, "vocab_size": 61, "rotary_pct": 0.5}


@pytest.mark.parametrize("fields", [{}, {"use_parallel_residual": False, "tie_word_embeddings": True,
                                         "hidden_act": "gelu_new"}])
def test_export_then_import_gives_back_every_weight(fields):
    model = random_model(GPTNeoX(), {**HF, **fields})
    assert_same_weights(round_trip(GPTNeoX(), model), model)


def test_query_key_value_rows_are_regrouped_per_head():
    cfg = GPTNeoX().config(HF)
    (piece,) = GPTNeoX().pieces("gpt_neox.layers.0.attention.query_key_value.bias", cfg)
    H, D = cfg.n_heads, cfg.head_dim
    theirs = torch.arange(3 * H * D, dtype=torch.float32)  # [head, (q|k|v), d_head]
    ours = piece.transform(LoadedTensor(theirs).read())
    assert ours[:D].tolist() == theirs[:D].tolist()              # head 0's q first in both
    assert ours[D:2 * D].tolist() == theirs[3 * D:4 * D].tolist()  # then head 1's q (theirs: after head 0's v)
