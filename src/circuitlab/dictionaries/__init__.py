"""Sparse dictionaries (SAEs and transcoders): architectures, activation store, training, metrics.

    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    sae = SparseDictionary.load("runs/sae/blocks.0.hook_resid_post")
    acts = sae.encode(x)                                      # [..., d_sae]
    sae = SparseDictionary.load(".../gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71", model=model)
    transcoders = load_transcoders("path/to/circuit-tracer-set", model=model)   # one per layer
    clt = CrossLayerTranscoder.load("runs/clt-demo/dictionaries/clt-batchtopk")   # cross-layer transcoder
    register_architecture(MyArchitecture)    # a new architecture (an arch.Architecture subclass) for all three

A layer beside analysis/: imports model, data and training, nothing above.
"""
from circuitlab.dictionaries.arch import Architecture, register_architecture
from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
from circuitlab.dictionaries.config import ARCHITECTURES, DictionaryConfig
from circuitlab.dictionaries.published import load_transcoders
from circuitlab.dictionaries.sae import SparseDictionary, base_model_id, check_base_model

__all__ = ["ARCHITECTURES", "Architecture", "CLTConfig", "CrossLayerTranscoder", "DictionaryConfig", "SparseDictionary", "base_model_id",
           "check_base_model", "load_transcoders", "register_architecture"]
