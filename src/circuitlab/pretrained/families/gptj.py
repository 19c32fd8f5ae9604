"""GPT-J: config and tensor mapping, import and export side by side (the interface: base.py)."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import (_NORM, EXPORT_ACTIVATION, Family, Piece, _activation, _get, _n_ctx,
                                                 _rows, _state, register_family)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


class GPTJ(Family):
    """GPT-J: parallel attention and MLP reading one shared LayerNorm (ln_1: we give ln1 and ln2 the same
    weights), partial rotary over adjacent pairs, unbiased q/k/v/out, an untied unembedding with a bias."""

    name = "GPT-J"
    model_types = ("gptj",)
    architectures = ("GPTJForCausalLM",)
    unembed_bias = True  # the one architecture we export to with an unembedding bias
    ignore = re.compile(r"(^|\.)attn\.(masked_)?bias$|embed_positions$")

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        d_model, n_heads = hf["n_embd"], hf["n_head"]
        head_dim = d_model // n_heads
        rot = _get(hf, "rotary_dim", head_dim)
        return ModelConfig(
            n_layers=hf["n_layer"], d_model=d_model, n_heads=n_heads, d_vocab=hf["vocab_size"],
            n_ctx=_n_ctx(hf["n_positions"], n_ctx, learned=False), d_mlp=_get(hf, "n_inner", 4 * d_model),
            norm="layernorm", norm_eps=float(_get(hf, "layer_norm_epsilon", 1e-5)), positional="rotary",
            rotary_dim=None if rot == head_dim else rot, rotary_interleaved=True,
            mlp=_activation(_get(hf, "activation_function", "gelu_new")), bias=True,
            tied_embeddings=bool(_get(hf, "tie_word_embeddings", False)), parallel_attn_mlp=True)

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        key = key.removeprefix("transformer.")
        rows = _rows(cfg)
        table: dict[str, Callable[..., list[Piece] | None]] = {
            r"wte\.weight": lambda: [Piece("embed.weight")],
            r"lm_head\.weight": lambda: [] if cfg.tied_embeddings else [Piece("unembed.weight")],
            r"lm_head\.bias": lambda: [Piece("unembed.bias")],
            r"ln_f\.(weight|bias)": lambda p: [Piece(f"ln_final.{_NORM[p]}")],
            # one norm read by both sublayers: the same weights for our ln1 and ln2
            r"h\.(\d+)\.ln_1\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.ln1.{_NORM[p]}"),
                                                              Piece(f"blocks.{i}.ln2.{_NORM[p]}")],
            r"h\.(\d+)\.attn\.([qkv])_proj\.weight": lambda i, qkv: [Piece(f"blocks.{i}.attn.qkv.weight", rows[qkv])],
            r"h\.(\d+)\.attn\.out_proj\.weight": lambda i: [Piece(f"blocks.{i}.attn.out.weight")],
            r"h\.(\d+)\.mlp\.fc_(in|out)\.(weight|bias)": lambda i, n, p: [Piece(f"blocks.{i}.mlp.fc_{n}.{p}")],
        }
        return self._match(table, key)

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        return [r"blocks\.\d+\.attn\.(qkv|out)\.bias"]

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        found = []
        if cfg.attn_only or not cfg.use_attn_out or not cfg.scale_scores:
            found.append("attn_only, V-only heads or unscaled scores")
        if not cfg.parallel_attn_mlp:
            found.append("parallel_attn_mlp=False (needs parallel)")
        if cfg.norm != "layernorm" or not cfg.bias:
            found.append("needs norm='layernorm' with bias=True")
        if cfg.positional != "rotary" or not cfg.rotary_interleaved:
            found.append("positions must be interleaved rotary (rotary_interleaved=True)")
        if cfg.kv_heads != cfg.n_heads or cfg.head_dim * cfg.n_heads != cfg.d_model:
            found.append("needs plain multi-head attention with d_head * n_heads == d_model")
        if cfg.mlp not in EXPORT_ACTIVATION:
            found.append(f"mlp={cfg.mlp!r} (needs gelu_new, gelu or relu)")
        if cfg.rope_scaling is not None or cfg.rotary_base != 10000.0:
            found.append("GPT-J's rotary has base 10000 and no scaling")
        for name in ("embed_scale", "attn_scale", "attn_softcap", "logit_softcap", "sliding_window"):
            if getattr(cfg, name) not in (None, 1.0):
                found.append(f"{name}={getattr(cfg, name)!r}")
        return found

    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        cfg, s = model.cfg, _state(model)
        H, D = cfg.n_heads, cfg.head_dim
        for i in range(cfg.n_layers):
            p = f"blocks.{i}."
            if not (torch.equal(s[p + "ln1.w"], s[p + "ln2.w"]) and torch.equal(s[p + "ln1.b"], s[p + "ln2.b"])):
                raise CircuitlabError(f"GPT-J's blocks have one norm for attention and MLP, but this model's layer {i} "
                                      "has different ln1 and ln2 weights")
            for name in ("attn.qkv.bias", "attn.out.bias"):
                if bool((s[p + name] != 0).any()):
                    raise CircuitlabError(f"GPT-J's attention has no biases, but this model's {p + name} is non-zero")
        out = {"transformer.wte.weight": s["embed.weight"], "transformer.ln_f.weight": s["ln_final.w"],
               "transformer.ln_f.bias": s["ln_final.b"], "lm_head.weight": s["unembed.weight"],
               "lm_head.bias": s["unembed.bias"]}
        for i in range(cfg.n_layers):
            ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
            out[theirs + "ln_1.weight"], out[theirs + "ln_1.bias"] = s[ours + "ln1.w"], s[ours + "ln1.b"]
            q, k, v = s[ours + "attn.qkv.weight"].split(H * D)
            out.update({theirs + "attn.q_proj.weight": q, theirs + "attn.k_proj.weight": k,
                        theirs + "attn.v_proj.weight": v, theirs + "attn.out_proj.weight": s[ours + "attn.out.weight"]})
            for n in ("in", "out"):
                for part in ("weight", "bias"):
                    out[theirs + f"mlp.fc_{n}.{part}"] = s[ours + f"mlp.fc_{n}.{part}"]
        return out

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        return {**common, "architectures": ["GPTJForCausalLM"], "model_type": "gptj", "vocab_size": cfg.d_vocab,
                "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.mlp_dim,
                "n_positions": cfg.n_ctx, "rotary_dim": cfg.rot_dim, "layer_norm_epsilon": cfg.norm_eps,
                "activation_function": EXPORT_ACTIVATION[cfg.mlp], "tie_word_embeddings": cfg.tied_embeddings,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "use_cache": True}


register_family(GPTJ(), order=90, export_order=80)
