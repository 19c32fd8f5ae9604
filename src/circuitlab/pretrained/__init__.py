"""Hugging Face checkpoints in and out.

Import GPT-2, GPT-NeoX/Pythia, LLaMA, Mistral and Qwen2 checkpoints into circuitlab's
Transformer (exactly: the same logits), and export LLaMA-, GPT-2- and GPT-NeoX-style models to a
folder that `transformers` loads and generates with.

    from circuitlab.pretrained import load_pretrained, export_hf, save_model_dir, load_model_dir
    model, tokenizer = load_pretrained("path/to/hf/checkpoint")      # or a hub name
    save_model_dir(model, "models/x", tokenizer=tokenizer)           # circuitlab's own folder
    export_hf(model, "out/hf", tokenizer)                            # back to Hugging Face
    tl_model = to_transformer_lens(model)                            # a TransformerLens HookedTransformer
    nn_model = to_nnsight(model)                                     # nnsight tracing over the model
"""
from circuitlab.pretrained.bridges import BridgeError, every_hook_point, to_nnsight, to_transformer_lens
from circuitlab.pretrained.checkpoint_io import find_model_dir, load_model_dir, save_model_dir
from circuitlab.pretrained.export import export_hf, export_style
from circuitlab.pretrained.families import SUPPORTED, model_config_from_hf
from circuitlab.pretrained.importer import load_hf_tokenizer, load_pretrained

__all__ = ["SUPPORTED", "BridgeError", "every_hook_point", "export_hf", "export_style", "find_model_dir",
           "load_hf_tokenizer", "load_model_dir", "load_pretrained", "model_config_from_hf", "save_model_dir",
           "to_nnsight", "to_transformer_lens"]
