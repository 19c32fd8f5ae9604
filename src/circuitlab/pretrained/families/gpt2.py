"""GPT-2: config and tensor mapping, import and export side by side (the interface: base.py)."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import (EXPORT_ACTIVATION, Family, Piece, _activation, _bias,
                                                 _classic_problems, _get, _n_ctx, _plain_attention_layernorm,
                                                 _sequential, _state, _transpose, register_family)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


class GPT2(Family):
    """GPT-2: Conv1D weights [in, out], fused c_attn (q, k, v blocks), learned positions, tied unembedding."""

    name = "GPT-2"
    model_types = ("gpt2",)
    architectures = ("GPT2LMHeadModel",)
    ignore = re.compile(r"(^|\.)attn\.(masked_)?bias$")

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        if hf.get("scale_attn_by_inverse_layer_idx"):
            raise CircuitlabError("GPT-2 with scale_attn_by_inverse_layer_idx=True cannot be expressed by "
                                  "circuitlab's Transformer")
        d_model = hf["n_embd"]
        return ModelConfig(
            n_layers=hf["n_layer"], d_model=d_model, n_heads=hf["n_head"], d_vocab=hf["vocab_size"],
            n_ctx=_n_ctx(hf["n_positions"], n_ctx, learned=True), d_mlp=_get(hf, "n_inner", 4 * d_model),
            norm="layernorm", norm_eps=float(_get(hf, "layer_norm_epsilon", 1e-5)), positional="learned",
            mlp=_activation(_get(hf, "activation_function", "gelu_new")), bias=True,
            tied_embeddings=bool(_get(hf, "tie_word_embeddings", True)),
            scale_scores=bool(_get(hf, "scale_attn_weights", True)),
        )

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        key = key.removeprefix("transformer.")
        n_ctx = cfg.n_ctx
        table: dict[str, Callable[..., list[Piece] | None]] = {
            r"wte\.weight": lambda: [Piece("embed.weight")],
            r"wpe\.weight": lambda: [Piece("pos_embed.weight", 0, lambda t: t[:n_ctx])],
            r"ln_f\.weight": lambda: [Piece("ln_final.w")],
            r"ln_f\.bias": lambda: [Piece("ln_final.b")],
            r"lm_head\.weight": lambda: [] if cfg.tied_embeddings else [Piece("unembed.weight")],
            r"h\.(\d+)\.ln_([12])\.weight": lambda i, n: [Piece(f"blocks.{i}.ln{n}.w")],
            r"h\.(\d+)\.ln_([12])\.bias": lambda i, n: [Piece(f"blocks.{i}.ln{n}.b")],
            r"h\.(\d+)\.attn\.c_attn\.weight": lambda i: [Piece(f"blocks.{i}.attn.qkv.weight", None, _transpose)],
            r"h\.(\d+)\.attn\.c_attn\.bias": lambda i: [Piece(f"blocks.{i}.attn.qkv.bias")],
            r"h\.(\d+)\.attn\.c_proj\.weight": lambda i: [Piece(f"blocks.{i}.attn.out.weight", None, _transpose)],
            r"h\.(\d+)\.attn\.c_proj\.bias": lambda i: [Piece(f"blocks.{i}.attn.out.bias")],
            r"h\.(\d+)\.mlp\.c_fc\.weight": lambda i: [Piece(f"blocks.{i}.mlp.fc_in.weight", None, _transpose)],
            r"h\.(\d+)\.mlp\.c_fc\.bias": lambda i: [Piece(f"blocks.{i}.mlp.fc_in.bias")],
            r"h\.(\d+)\.mlp\.c_proj\.weight": lambda i: [Piece(f"blocks.{i}.mlp.fc_out.weight", None, _transpose)],
            r"h\.(\d+)\.mlp\.c_proj\.bias": lambda i: [Piece(f"blocks.{i}.mlp.fc_out.bias")],
        }
        return self._match(table, key)

    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        cfg, s = model.cfg, _state(model)
        d, M, w = cfg.d_model, cfg.mlp_dim, s["embed.weight"]
        out = {"transformer.wte.weight": w, "transformer.wpe.weight": s["pos_embed.weight"],
               "transformer.ln_f.weight": s["ln_final.w"], "transformer.ln_f.bias": _bias(s, "ln_final.b", d, w)}
        for i in range(cfg.n_layers):
            ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
            for n in (1, 2):
                out[theirs + f"ln_{n}.weight"] = s[ours + f"ln{n}.w"]
                out[theirs + f"ln_{n}.bias"] = _bias(s, ours + f"ln{n}.b", d, w)
            # Conv1D weights are [in, out]
            for ours_name, theirs_name, width in (("attn.qkv", "attn.c_attn", 3 * d), ("attn.out", "attn.c_proj", d),
                                                  ("mlp.fc_in", "mlp.c_fc", M), ("mlp.fc_out", "mlp.c_proj", d)):
                out[theirs + theirs_name + ".weight"] = s[ours + ours_name + ".weight"].t()
                out[theirs + theirs_name + ".bias"] = _bias(s, ours + ours_name + ".bias", width, w)
        if not cfg.tied_embeddings:
            out["lm_head.weight"] = s["unembed.weight"]
        return out

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        return [r"unembed\.bias"]

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        found = _classic_problems(cfg) + _sequential(cfg) + _plain_attention_layernorm(cfg)
        if cfg.positional != "learned":  # GPT-2 can leave the scores unscaled (scale_attn_weights=False)
            found.append(f"positional={cfg.positional!r} (needs learned)")
        return found

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", **common,
                "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.mlp_dim,
                "n_positions": cfg.n_ctx, "activation_function": EXPORT_ACTIVATION[cfg.mlp],
                "layer_norm_epsilon": cfg.norm_eps, "scale_attn_weights": cfg.scale_scores,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


register_family(GPT2(), order=10, export_order=20)
