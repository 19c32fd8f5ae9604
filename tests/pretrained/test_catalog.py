"""Hugging Face import: every family gives HF's own logits and residual streams, offline.

(Split out of the flat test_pretrained module, issue 38.)"""
import pytest

from circuitlab import CircuitlabError
from circuitlab.cli import main
from circuitlab.pretrained import model_config_from_hf


def test_unsupported_architectures_are_named():
    with pytest.raises(CircuitlabError, match="'bert'.*GPT-2, GPT-NeoX/Pythia, LLaMA, .*Gemma-2.*GPT-J"):
        model_config_from_hf({"model_type": "bert"})
    llama = dict(model_type="llama", hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                 intermediate_size=8, vocab_size=10, max_position_embeddings=8)
    with pytest.raises(CircuitlabError, match="'yarn' rotary scaling, which circuitlab's Transformer does not"):
        model_config_from_hf({**llama, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}})
    with pytest.raises(CircuitlabError, match="'llama3' rotary scaling lacks low_freq_factor"):
        model_config_from_hf({**llama, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(CircuitlabError, match="activation 'gelu'"):
        model_config_from_hf({**llama, "hidden_act": "gelu"})
    with pytest.raises(CircuitlabError, match="lacks the field 'vocab_size'"):
        model_config_from_hf({k: v for k, v in llama.items() if k != "vocab_size"})


def test_import_help_lists_every_family_of_the_catalogue(capsys):
    from circuitlab.pretrained.catalog import _all_families, supported_names

    with pytest.raises(SystemExit):
        main(["import", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    names = supported_names()
    assert len(names) == 11 and all(name in text for name in names), text
    for family in _all_families():   # each family is named by at least one of its covers
        assert all(name in text for name in (family.covers or (family.name,))), family.name
