"""Which family reads a checkpoint, and which writes an export: the registry of families (families/base.py), filled
by importing every module of the families package (each registers itself: no list kept here), looked up by
config.json's model_type. It stands above the family modules, so they never import each other in a circle.
"""
from __future__ import annotations

import importlib
import pkgutil

import circuitlab.pretrained.families as families
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import Family, registered

_found = False


def _discover() -> None:
    """Import every module of circuitlab.pretrained.families once: each registers its family."""
    global _found
    if not _found:
        for module in pkgutil.iter_modules(families.__path__):
            importlib.import_module(f"{families.__name__}.{module.name}")
        _found = True


def _all_families() -> tuple[Family, ...]:
    """Every registered family (the package's and any registered since), in catalogue order."""
    _discover()
    return tuple(r.family for r in registered())


def export_families() -> tuple[Family, ...]:
    """The families export writes, in the order export_style tries them (the first that holds a model wins)."""
    _discover()
    ranked = sorted((r for r in registered() if r.export_order is not None), key=lambda r: r.export_order or 0)
    return tuple(r.family for r in ranked)


def supported_names() -> list[str]:
    """Every model family the importer reads, as users name them (each Family's covers), in catalogue order."""
    return [name for family in _all_families() for name in (family.covers or (family.name,))]


def supported() -> str:
    """The families the importer reads, for messages ("GPT-2, ..., Phi-3 and GPT-J")."""
    names = supported_names()
    return f"{', '.join(names[:-1])} and {names[-1]}"


SUPPORTED = supported()   # for `circuitlab import --help`: the package's own families


def model_type(hf: dict) -> str | None:
    """config.json's model_type, or the one its architectures list implies."""
    if hf.get("model_type"):
        return hf["model_type"]
    for arch in hf.get("architectures") or []:
        for family in _all_families():
            if arch in family.architectures:
                return family.model_types[0]
    return None


def family_for(hf: dict) -> Family:
    """The family of a checkpoint's config.json."""
    kind = model_type(hf)
    for family in _all_families():
        if kind in family.model_types:
            return family
    what = f"model_type {kind!r}" if kind else f"architectures {hf.get('architectures')}"
    raise CircuitlabError(f"this checkpoint's architecture ({what}) is not supported; circuitlab imports "
                          f"{supported()} checkpoints")


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
