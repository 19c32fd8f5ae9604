"""Export a circuitlab Transformer to a Hugging Face folder that `transformers` loads and generates with.

    export_hf(model, "out/hf", tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained("out/hf")   # same logits as model

Three styles, chosen from the config:
- LLaMA (LlamaForCausalLM): rmsnorm, rotary over the whole head, SwiGLU, sequential blocks;
- GPT-2 (GPT2LMHeadModel): layernorm, learned positions, gelu_new / gelu / relu, d_head * n_heads == d_model;
- GPT-NeoX (GPTNeoXForCausalLM): layernorm, (partial) rotary, gelu / gelu_new / relu, parallel or not.
None of them has an unembedding bias, so ours must be absent or zero. load_pretrained(export_hf(m))
gives back m's weights exactly.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import torch

from circuitlab.atomic import atomic_dir, json_text
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model import Transformer
from circuitlab.pretrained.catalog import family_named
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


class _WritesItsConfig(Protocol):
    """The families of NEWER_STYLES: each says what it cannot export and writes its own HF config."""

    def export_problems(self, cfg: ModelConfig) -> list[str]: ...
    def hf_config(self, cfg: ModelConfig) -> dict: ...


def _newer_family(style: str) -> _WritesItsConfig:
    return cast(_WritesItsConfig, family_named(style))

_HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}


# ---------------------------------------------------------------------------------------- which style
def _style_problems(cfg: ModelConfig) -> dict[str, list[str]]:
    """For each export style, the config fields that rule it out (empty list: it fits)."""
    common = []
    if cfg.attn_only:
        common.append("attn_only=True (HF models all have MLPs)")
    if not cfg.use_attn_out:
        common.append("use_attn_out=False (V-only heads)")
    common += _newer_switches(cfg)
    sequential = ["parallel_attn_mlp=True"] if cfg.parallel_attn_mlp else []
    scaled = [] if cfg.scale_scores else ["scale_scores=False"]
    mha = [] if cfg.kv_heads == cfg.n_heads else [f"n_kv_heads={cfg.kv_heads} (grouped-query attention)"]
    square = [] if cfg.head_dim * cfg.n_heads == cfg.d_model else ["d_head * n_heads != d_model"]
    activation = [] if cfg.mlp in _HF_ACTIVATION else [f"mlp={cfg.mlp!r} (needs gelu_new, gelu or relu)"]
    layernorm = [] if cfg.norm == "layernorm" else [f"norm={cfg.norm!r} (needs layernorm)"]

    llama = common + sequential + scaled
    if cfg.norm != "rmsnorm":
        llama.append(f"norm={cfg.norm!r} (needs rmsnorm)")
    if cfg.positional != "rotary" or cfg.rot_dim != cfg.head_dim:
        llama.append("positions must be rotary over the whole head")
    if cfg.mlp != "swiglu":
        llama.append(f"mlp={cfg.mlp!r} (needs swiglu)")
    # GPT-2 can leave the scores unscaled (scale_attn_weights=False)
    gpt2 = common + sequential + mha + square + activation + layernorm
    if cfg.positional != "learned":
        gpt2.append(f"positional={cfg.positional!r} (needs learned)")
    # GPT-NeoX blocks may be parallel or sequential
    neox = common + scaled + mha + square + activation + layernorm
    if cfg.positional != "rotary":
        neox.append(f"positional={cfg.positional!r} (needs rotary)")
    found = {"llama": llama, "gpt2": gpt2, "gpt_neox": neox}
    for style in NEWER_STYLES:
        found[style] = _newer_family(style).export_problems(cfg)
    return found


# The architectures the newer families export to, after LLaMA / GPT-2 / GPT-NeoX (Phi-3 last: a model that
# fits it also fits LLaMA, unless it has a sliding window; ask for it with export_hf(..., style="phi3")).
NEWER_STYLES = ("qwen3", "gemma2", "gemma3_text", "olmo2", "gptj", "phi3")
STYLES = ("llama", "gpt2", "gpt_neox") + NEWER_STYLES


def _newer_switches(cfg: ModelConfig) -> list[str]:
    """The newer families' switches that are on: LLaMA, GPT-2 and GPT-NeoX have none of them."""
    defaults = dict(block_norms="pre", qk_norm="none", embed_scale=1.0, attn_scale=None, attn_softcap=None,
                    logit_softcap=None, sliding_window=None, local_rotary_base=None, rotary_interleaved=False)
    return [f"{k}={getattr(cfg, k)!r}" for k, v in defaults.items() if getattr(cfg, k) != v]


def export_style(cfg: ModelConfig, style: str | None = None) -> str:
    """The HF architecture (its model_type: 'llama', 'gpt2', 'gpt_neox', 'qwen3', 'gemma2', 'gemma3_text',
    'olmo2', 'gptj' or 'phi3') this config exports to: the first that holds it exactly, or `style` when
    given and it fits (a CircuitlabError says what does not)."""
    problems = _style_problems(cfg)
    if style is not None:
        if style not in problems:
            raise CircuitlabError(f"unknown export style {style!r}; choose one of {', '.join(STYLES)}")
        if problems[style]:
            raise CircuitlabError(f"this model cannot be exported as {style}: {'; '.join(problems[style])}")
        return style
    for name, found in problems.items():
        if not found:
            return name
    closest = min(problems, key=lambda s: len(problems[s]))
    raise CircuitlabError(f"this model cannot be exported to Hugging Face: it fits none of {', '.join(STYLES)}; "
                          f"closest is {closest}, which it misses by {'; '.join(problems[closest])}")


# ---------------------------------------------------------------------------------------- configs
def _special_ids(tokenizer) -> dict[str, int | None]:
    """bos/eos ids from the tokenizer; None without one (rather than the HF classes' defaults,
    which name tokens of their original vocabularies)."""
    hf = _as_hf_tokenizer(tokenizer)
    if hf is None:
        return {"bos_token_id": None, "eos_token_id": None}
    return {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id}


def _hf_rope_scaling(cfg: ModelConfig) -> dict | None:
    """ModelConfig.rope_scaling in HF's spelling (rope_type instead of type)."""
    if cfg.rope_scaling is None:
        return None
    return {"rope_type": cfg.rope_scaling["type"], **{k: v for k, v in cfg.rope_scaling.items() if k != "type"}}


def _hf_config(cfg: ModelConfig, style: str, dtype: torch.dtype, tokenizer) -> dict:
    common = {"vocab_size": cfg.d_vocab, "tie_word_embeddings": cfg.tied_embeddings,
              "dtype": str(dtype).removeprefix("torch."), "torch_dtype": str(dtype).removeprefix("torch."),
              "use_cache": True, **_special_ids(tokenizer)}
    if style in NEWER_STYLES:
        return {**common, **_newer_family(style).hf_config(cfg)}
    if style == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
                "max_position_embeddings": cfg.n_ctx, "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu",
                "rope_theta": cfg.rotary_base, "rope_scaling": _hf_rope_scaling(cfg),
                "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base,
                                    **(_hf_rope_scaling(cfg) or {})},
                "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "attention_dropout": 0.0, "pretraining_tp": 1}
    if style == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", **common,
                "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.mlp_dim,
                "n_positions": cfg.n_ctx, "activation_function": _HF_ACTIVATION[cfg.mlp],
                "layer_norm_epsilon": cfg.norm_eps, "scale_attn_weights": cfg.scale_scores,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    partial = cfg.rot_dim / cfg.head_dim
    if int(cfg.head_dim * partial) != cfg.rot_dim:  # transformers rounds head_dim * partial down
        partial = math.nextafter(partial, 1.0)
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", **common,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "max_position_embeddings": cfg.n_ctx, "layer_norm_eps": cfg.norm_eps,
            "hidden_act": _HF_ACTIVATION[cfg.mlp], "use_parallel_residual": cfg.parallel_attn_mlp,
            "rotary_pct": partial, "rotary_emb_base": cfg.rotary_base,
            "rope_scaling": _hf_rope_scaling(cfg),
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base,
                                "partial_rotary_factor": partial, **(_hf_rope_scaling(cfg) or {})},
            "attention_bias": True, "attention_dropout": 0.0, "hidden_dropout": 0.0}


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
    b_U = model.unembed.bias
    if style != "gptj" and b_U is not None and bool((b_U != 0).any()):
        raise CircuitlabError("this model's unembedding has a non-zero bias, which no Hugging Face architecture "
                              "we export to can hold; the export would change its logits")
    tensors = family_named(style).export_tensors(model)
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

