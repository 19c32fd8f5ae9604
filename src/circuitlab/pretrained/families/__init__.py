"""One module per Hugging Face model family, each its config mapping, its tensor mapping both ways and its export
config, registered with base.register_family; catalog.py finds every module here (docs/pretrained.md, "Adding a
family"). The families: gpt2, gpt_neox, llama, mistral, qwen2, qwen3, gemma2, gemma3, olmo2, phi3, gptj;
base.py (the interface, the registry, the helpers) and decoder.py (what the newer LLaMA-like ones share).

The classes that were importable from here before (GPT2, GPTNeoX, Llama, GPTJ) still are, for one release, with a
DeprecationWarning: import them from their own modules.
"""
from __future__ import annotations

import importlib
import warnings

_MOVED = {"GPT2": "gpt2", "GPTNeoX": "gpt_neox", "Llama": "llama", "GPTJ": "gptj"}  # old name -> its module now


def __getattr__(name: str):
    if name in _MOVED:
        module = f"{__name__}.{_MOVED[name]}"
        warnings.warn(f"{__name__}.{name} moved to {module}.{name}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
