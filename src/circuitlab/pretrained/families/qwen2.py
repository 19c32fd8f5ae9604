"""Qwen2: LLaMA with q/k/v biases (always, and only those) and a sliding window only when the config turns it on.
Exports as LLaMA."""
from __future__ import annotations

from circuitlab.pretrained.families.base import register_family
from circuitlab.pretrained.families.llama import Llama


class Qwen2(Llama):
    """Qwen2: LLaMA's mapping (llama.py); biased q/k/v projections; sliding_window counts only with
    use_sliding_window or a sliding_attention layer type."""

    name = "Qwen2"
    model_types = ("qwen2",)
    architectures = ("Qwen2ForCausalLM",)

    def _sliding_window(self, hf: dict) -> int | None:
        if not (hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or [])):
            return None
        return super()._sliding_window(hf)

    def _biases(self, hf: dict) -> set[str]:
        return {"qkv"}


register_family(Qwen2(), order=32)
