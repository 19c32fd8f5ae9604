"""Export a circuitlab Transformer to a Hugging Face folder that `transformers` loads and generates with.

    export_hf(model, "out/hf", tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained("out/hf")   # same logits as model

The styles are the registered families that export (catalog.export_families), tried in their export order; each
family (pretrained/families/) says what it cannot hold, writes its tensors and its config.json. The first three:
- LLaMA (LlamaForCausalLM): rmsnorm, rotary over the whole head, SwiGLU, sequential blocks;
- GPT-2 (GPT2LMHeadModel): layernorm, learned positions, gelu_new / gelu / relu, d_head * n_heads == d_model;
- GPT-NeoX (GPTNeoXForCausalLM): layernorm, (partial) rotary, gelu / gelu_new / relu, parallel or not.
None but GPT-J has an unembedding bias, so ours must otherwise be absent or zero. load_pretrained(export_hf(m))
gives back m's weights exactly.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from circuitlab.atomic import atomic_dir, json_text
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer
from circuitlab.pretrained.catalog import export_families, family_named
from circuitlab.spec import Options, option


@dataclass(frozen=True)
class HfExportOptions(Options):
    """What `circuitlab export` takes, declared once (circuitlab.spec): each flag's default, rule and help (its flags
    are these fields, in this order). style is plain text: export_style refuses an unknown one, naming the styles."""

    checkpoint: str | Path = option(None, required=True, aliases=("--model",),
                                    help="a circuitlab model folder (from `circuitlab import` or training) or a run "
                                         "folder")
    out: str | Path = option(None, required=True,
                             help="folder to write (config.json, model.safetensors, tokenizer files)")
    style: str | None = option(None, help="the Hugging Face model_type to write (default: the first that holds the "
                                          "model; e.g. phi3 for a LLaMA-like model as Phi-3 with fused projections)")


# ---------------------------------------------------------------------------------------- which style
def _style_problems(cfg: ModelConfig) -> dict[str, list[str]]:
    """For each export style (a registered family's first model_type), in catalog.export_families' order, the
    config fields that rule it out (empty list: it fits)."""
    return {family.model_types[0]: family.export_problems(cfg) for family in export_families()}


def export_style(cfg: ModelConfig, style: str | None = None) -> str:
    """The HF architecture (its model_type: 'llama', 'gpt2', 'gpt_neox', 'qwen3', 'gemma2', 'gemma3_text',
    'olmo2', 'gptj' or 'phi3') this config exports to: the first that holds it exactly, or `style` when
    given and it fits (a CircuitlabError says what does not)."""
    problems = _style_problems(cfg)
    styles = ", ".join(problems)
    if style is not None:
        if style not in problems:
            raise CircuitlabError(f"unknown export style {style!r}; choose one of {styles}")
        if problems[style]:
            raise CircuitlabError(f"this model cannot be exported as {style}: {'; '.join(problems[style])}")
        return style
    for name, found in problems.items():
        if not found:
            return name
    closest = min(problems, key=lambda s: len(problems[s]))
    raise CircuitlabError(f"this model cannot be exported to Hugging Face: it fits none of {styles}; "
                          f"closest is {closest}, which it misses by {'; '.join(problems[closest])}")


# ---------------------------------------------------------------------------------------- configs
def _special_ids(tokenizer) -> dict[str, int | None]:
    """bos/eos ids from the tokenizer; None without one (rather than the HF classes' defaults,
    which name tokens of their original vocabularies)."""
    hf = _as_hf_tokenizer(tokenizer)
    if hf is None:
        return {"bos_token_id": None, "eos_token_id": None}
    return {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id}


def _hf_config(cfg: ModelConfig, style: str, dtype: torch.dtype, tokenizer) -> dict:
    """config.json: what every export writes, placed by the style's family among its own fields."""
    common = {"vocab_size": cfg.d_vocab, "tie_word_embeddings": cfg.tied_embeddings,
              "dtype": str(dtype).removeprefix("torch."), "torch_dtype": str(dtype).removeprefix("torch."),
              "use_cache": True, **_special_ids(tokenizer)}
    return family_named(style).hf_config(cfg, common)


# ---------------------------------------------------------------------------------------- tokenizer
def _as_hf_tokenizer(tokenizer):
    """A transformers tokenizer for `tokenizer` (itself, or a circuitlab Tokenizer's to_hf()), or None."""
    if tokenizer is None or hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    return tokenizer.to_hf() if hasattr(tokenizer, "to_hf") else None


# ---------------------------------------------------------------------------------------- export
def export_hf(model: Transformer, out_dir: str | os.PathLike, tokenizer=None, style: str | None = None) -> Path:
    """Write `model` as a Hugging Face checkpoint folder (config.json, model.safetensors and, when
    given and convertible, the tokenizer's files). Returns the folder.

    style: the HF model_type to write (see export_style); None picks the first that holds the model.
    Raises CircuitlabError when the config fits no HF architecture, or the unembedding has a
    non-zero bias (only GPT-J's has one).
    """
    from safetensors.torch import save_file

    cfg = model.cfg
    style = export_style(cfg, style)
    family = family_named(style)
    b_U = model.unembed.bias
    if not family.unembed_bias and b_U is not None and bool((b_U != 0).any()):
        raise CircuitlabError("this model's unembedding has a non-zero bias, which no Hugging Face architecture "
                              "we export to can hold; the export would change its logits")
    tensors = family.export_tensors(model)
    # safetensors refuses tensors that share memory (our fused matrices' slices): copy each one
    tensors = {k: v.to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CircuitlabError(f"{out_dir} is a file; choose a folder for the export")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise CircuitlabError(f"{out_dir} exists and is not a Hugging Face model folder; choose a new or empty folder")
    hf_tokenizer = _as_hf_tokenizer(tokenizer)
    if hf_tokenizer is None and tokenizer is not None:
        warnings.warn(f"the tokenizer {tokenizer!r} has no Hugging Face form; the export has no tokenizer files",
                      stacklevel=2)
    with atomic_dir(out_dir) as tmp:  # the whole folder at once: no mix of an earlier export's files
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json_text(_hf_config(cfg, style, model.embed.weight.dtype, tokenizer),
                                                    indent=2))
        if hf_tokenizer is not None:
            hf_tokenizer.save_pretrained(str(tmp))
    return out_dir

