"""Moved: Gemma-2, Gemma-3, Qwen3, OLMo-2 and Phi-3 each have their module in circuitlab.pretrained.families
(gemma2.py, gemma3.py, qwen3.py, olmo2.py, phi3.py; what they share: decoder.py). This module keeps the old import
path for one release, with a DeprecationWarning."""
from __future__ import annotations

import warnings

from circuitlab.pretrained.catalog import model_type
from circuitlab.pretrained.families.decoder import _Decoder
from circuitlab.pretrained.families.gemma2 import Gemma2
from circuitlab.pretrained.families.gemma3 import Gemma3
from circuitlab.pretrained.families.olmo2 import Olmo2
from circuitlab.pretrained.families.phi3 import Phi3
from circuitlab.pretrained.families.qwen3 import Qwen3

__all__ = ["Gemma2", "Gemma3", "Olmo2", "Phi3", "Qwen3", "_Decoder", "is_gemma3_multimodal"]

warnings.warn("circuitlab.pretrained.llama_like moved to circuitlab.pretrained.families (one module per family); "
              "the old path goes in the next release", DeprecationWarning, stacklevel=2)


def is_gemma3_multimodal(hf: dict) -> bool:
    return model_type(hf) == "gemma3"
