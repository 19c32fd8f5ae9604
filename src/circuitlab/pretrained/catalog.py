"""Which family reads a checkpoint: the catalogue of every Family (families.py, llama_like.py), looked up
by config.json's model_type. It stands above the family modules, so they never import each other in a circle.
"""
from __future__ import annotations

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families import GPT2, GPTJ, GPTNeoX, Llama
from circuitlab.pretrained.family_base import Family, model_type
from circuitlab.pretrained.llama_like import Gemma2, Gemma3, Olmo2, Phi3, Qwen3


def _all_families() -> tuple[Family, ...]:
    return (GPT2(), GPTNeoX(), Llama(), Qwen3(), Gemma2(), Gemma3(), Olmo2(), Phi3(), GPTJ())


def supported_names() -> list[str]:
    """Every model family the importer reads, as users name them (each Family's covers), in catalogue order."""
    return [name for family in _all_families() for name in (family.covers or (family.name,))]


_names = supported_names()
SUPPORTED = f"{', '.join(_names[:-1])} and {_names[-1]}"   # for messages and `circuitlab import --help`


def family_for(hf: dict) -> Family:
    """The family of a checkpoint's config.json."""
    kind = model_type(hf)
    for family in _all_families():
        if kind in family.model_types:
            return family
    what = f"model_type {kind!r}" if kind else f"architectures {hf.get('architectures')}"
    raise CircuitlabError(f"this checkpoint's architecture ({what}) is not supported; circuitlab imports "
                          f"{SUPPORTED} checkpoints")


def family_named(model_type: str) -> Family:
    """The family that imports and exports HF model_type (e.g. "gpt2", "gpt_neox", "llama")."""
    return family_for({"model_type": model_type})


def model_config_from_hf(hf: dict, n_ctx: int | None = None) -> ModelConfig:
    """The ModelConfig equivalent to a Hugging Face config.json (a dict).

    n_ctx shortens the context (for rotary models any length works; learned positions keep
    their first n_ctx rows).
    """
    family = family_for(hf)
    try:
        return family.config(hf, n_ctx)
    except KeyError as e:
        raise CircuitlabError(f"this {family.name} config.json lacks the field {e.args[0]!r}; "
                              "is it complete?") from None
