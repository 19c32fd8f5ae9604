"""Mistral: LLaMA's layout and mapping under its own model_type (its sliding window, when shorter than the
context, bounds the context instead: within the window it is full causal attention). Exports as LLaMA."""
from __future__ import annotations

from circuitlab.pretrained.families.base import register_family
from circuitlab.pretrained.families.llama import Llama


class Mistral(Llama):
    """Mistral: a LLaMA checkpoint (llama.py) whose config.json says model_type "mistral"."""

    name = "Mistral"
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)


register_family(Mistral(), order=31)
