"""Hugging Face checkpoints in and out.

Import GPT-2, GPT-NeoX/Pythia, LLaMA, Mistral, Qwen2, Qwen3, Gemma-2, Gemma-3 (text), OLMo-2, Phi-3 and
GPT-J checkpoints into circuitlab's Transformer (exactly: the same logits), and export models of those
architectures to a folder that `transformers` loads and generates with.

    from circuitlab.pretrained import load_pretrained, export_hf
    from circuitlab.training import save_checkpoint, load_checkpoint
    model, tokenizer = load_pretrained("path/to/hf/checkpoint")      # or a hub name
    save_checkpoint("models/x", model, tokenizer)                    # circuitlab's own folder
    export_hf(model, "out/hf", tokenizer)                            # back to Hugging Face
    tl_model = to_transformer_lens(model)                            # HookedTransformer (TL 3) / TransformerBridge (TL 4)
    nn_model = to_nnsight(model)                                     # nnsight tracing over the model

circuitlab's own model folders are training checkpoints (circuitlab.training.checkpoint).
"""
from circuitlab.pretrained.bridges import (BridgeError, every_hook_point, to_hooked_transformer, to_nnsight,
                                           to_transformer_bridge, to_transformer_lens, transformer_lens_major)
from circuitlab.pretrained.export import export_hf, export_style
from circuitlab.pretrained.catalog import SUPPORTED, model_config_from_hf
from circuitlab.pretrained.importer import load_hf_tokenizer, load_pretrained

__all__ = ["SUPPORTED", "BridgeError", "every_hook_point", "export_hf", "export_style", "load_hf_tokenizer",
           "load_pretrained", "model_config_from_hf", "to_hooked_transformer", "to_nnsight", "to_transformer_bridge",
           "to_transformer_lens", "transformer_lens_major"]
