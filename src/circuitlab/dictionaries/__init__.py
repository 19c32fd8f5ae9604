"""Sparse dictionaries (SAEs and transcoders): architectures, activation store, training, metrics.

    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    sae = SparseDictionary.load("runs/sae/blocks.0.hook_resid_post")
    acts = sae.encode(x)                                      # [..., d_sae]

A layer beside analysis/: imports model, data and training, nothing above.
"""
from circuitlab.dictionaries.config import ARCHITECTURES, DictionaryConfig
from circuitlab.dictionaries.sae import SparseDictionary, base_model_id, check_base_model

__all__ = ["ARCHITECTURES", "DictionaryConfig", "SparseDictionary", "base_model_id", "check_base_model"]
