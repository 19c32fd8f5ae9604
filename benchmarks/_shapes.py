"""Published model shapes with random weights (configs only, nothing downloaded), and dictionaries at
published widths, for the scale benchmark.

    model = build_model("gpt2-small")                     # a Transformer of GPT-2 small's shape
    tc = build_transcoders(model, "gpt2-small")           # 24,576-wide TopK transcoders, one per layer
"""
from __future__ import annotations

import torch

# The published config.json fields that decide each shape (Hugging Face's own values).
HF_CONFIGS = {
    "gpt2-small": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
                   "n_positions": 1024, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"},
    "qwen3-0.6b": {"model_type": "qwen3", "num_hidden_layers": 28, "hidden_size": 1024, "intermediate_size": 3072,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
                   "hidden_act": "silu", "tie_word_embeddings": True},
    "llama-3.2-1b": {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                     "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                     "hidden_act": "silu", "tie_word_embeddings": True},
    "gemma-2-2b": {"model_type": "gemma2", "num_hidden_layers": 26, "hidden_size": 2304, "intermediate_size": 9216,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                   "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "tie_word_embeddings": True},
}
# Published dictionary widths: GPT-2 small's transcoders (24,576), Gemma Scope's 16k, Llama Scope's 32k-ish
# (Llama-3.2-1B / Qwen3-0.6B transcoders of circuit-tracer's collections are 8x-16x d_model; 16x here).
WIDTHS = {"gpt2-small": 24576, "qwen3-0.6b": 16384, "llama-3.2-1b": 32768, "gemma-2-2b": 16384}
K = 64   # active latents per token (TopK): L0 ~ 64, what the GPT-2 numbers had
SHAPES = tuple(HF_CONFIGS)


def model_config(shape: str, n_layers: int | None = None, n_ctx: int = 2048, **changes):
    """The ModelConfig of a published shape (n_layers: fewer layers, the rest of the shape kept; changes:
    ModelConfig fields set after, e.g. logit_softcap=None)."""
    import dataclasses

    from circuitlab.pretrained.catalog import model_config_from_hf

    hf = dict(HF_CONFIGS[shape])
    key = "n_layer" if "n_layer" in hf else "num_hidden_layers"
    if n_layers:
        hf[key] = n_layers
    cfg = model_config_from_hf(hf, n_ctx=min(n_ctx, hf.get("n_positions", n_ctx)))
    return dataclasses.replace(cfg, **changes) if changes else cfg


def build_model(shape: str, n_layers: int | None = None, seed: int = 0, storage: str | None = None, **changes):
    """A Transformer of the shape, random weights (seeded), eval mode. storage: hold the matrices in this dtype
    (bfloat16: float32 arithmetic), written straight into it (no float32 copy of the model first: Gemma-2-2B's
    is 10.5 GB)."""
    from circuitlab import Transformer

    torch.manual_seed(seed)
    if storage is None:
        return Transformer(model_config(shape, n_layers, **changes)).eval()
    from circuitlab.model.loading import uninitialised_model

    model = uninitialised_model(model_config(shape, n_layers, **changes), storage)
    model.reset_parameters(seed)
    return model.eval()


def transcoder_configs(model, shape: str, width: int | None = None):
    from circuitlab.dictionaries import DictionaryConfig

    w = width or WIDTHS[shape]
    return [DictionaryConfig("topk", d_in=model.cfg.d_model, d_sae=w, k=K,
                             hook_name=f"blocks.{layer}.ln2.hook_normalized",
                             out_hook_name=f"blocks.{layer}.hook_mlp_out") for layer in range(model.cfg.n_layers)]


def build_transcoders(model, shape: str, width: int | None = None, seed: int = 0, storage: str | None = None):
    """One TopK transcoder per layer at the published width, random weights; storage: each held in this dtype
    as soon as it is built (one float32 transcoder at a time), computing in float32."""
    from circuitlab.dictionaries import SparseDictionary
    from circuitlab.graphs import Transcoders

    dicts = []
    for layer, cfg in enumerate(transcoder_configs(model, shape, width)):
        d = SparseDictionary(cfg, seed=seed + layer)
        dicts.append(d.set_dtypes(storage, "float32") if storage else d)
    return Transcoders.per_layer(model, dicts)
