"""GPT-NeoX / Pythia: config and tensor mapping, import and export side by side (the interface: base.py)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.pretrained.families.base import (_NORM, EXPORT_ACTIVATION, Family, Piece, _activation, _bias,
                                                 _classic_problems, _get, _hf_rope_scaling, _n_ctx,
                                                 _plain_attention_layernorm, _rope, _rotary_dim, _scaled, _state,
                                                 register_family)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


class GPTNeoX(Family):
    """GPT-NeoX / Pythia: parallel attention and MLP, partial rotary, and a fused query_key_value
    whose rows are grouped per head: [head 0: q, k, v][head 1: q, k, v]..."""

    name = "GPT-NeoX"
    model_types = ("gpt_neox",)
    architectures = ("GPTNeoXForCausalLM",)
    covers = ("GPT-NeoX/Pythia",)
    ignore = re.compile(r"(^|\.)attention\.(masked_)?bias$|rotary_emb\.inv_freq$")

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = d_model // n_heads
        theta, partial, scaling = _rope(hf, default_partial=0.25)
        return ModelConfig(
            n_layers=hf["num_hidden_layers"], d_model=d_model, n_heads=n_heads, d_vocab=hf["vocab_size"],
            n_ctx=_n_ctx(hf["max_position_embeddings"], n_ctx, learned=False), d_mlp=hf["intermediate_size"],
            norm="layernorm", norm_eps=float(_get(hf, "layer_norm_eps", 1e-5)), positional="rotary",
            rotary_base=theta, rotary_dim=_rotary_dim(head_dim, partial), rope_scaling=scaling,
            mlp=_activation(_get(hf, "hidden_act", "gelu")),
            bias=True, tied_embeddings=bool(_get(hf, "tie_word_embeddings", False)),
            parallel_attn_mlp=bool(_get(hf, "use_parallel_residual", True)),
        )

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        key = key.removeprefix("gpt_neox.")
        H, D = cfg.n_heads, cfg.head_dim

        def per_head_to_blocks(t: torch.Tensor) -> torch.Tensor:
            # rows [head, (q|k|v), d_head] -> [(q|k|v), head, d_head]; works for weights and biases
            return t.unflatten(0, (H, 3, D)).transpose(0, 1).flatten(0, 2)

        table: dict[str, Callable[..., list[Piece] | None]] = {
            r"embed_in\.weight": lambda: [Piece("embed.weight")],
            # embed_out in checkpoints; transformers 5 names the module lm_head
            r"(embed_out|lm_head)\.weight": lambda _: [] if cfg.tied_embeddings else [Piece("unembed.weight")],
            r"final_layer_norm\.weight": lambda: [Piece("ln_final.w")],
            r"final_layer_norm\.bias": lambda: [Piece("ln_final.b")],
            r"layers\.(\d+)\.input_layernorm\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.ln1.{_NORM[p]}")],
            r"layers\.(\d+)\.post_attention_layernorm\.(weight|bias)":
                lambda i, p: [Piece(f"blocks.{i}.ln2.{_NORM[p]}")],
            r"layers\.(\d+)\.attention\.query_key_value\.(weight|bias)":
                lambda i, p: [Piece(f"blocks.{i}.attn.qkv.{p}", None, per_head_to_blocks)],
            r"layers\.(\d+)\.attention\.dense\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.attn.out.{p}")],
            r"layers\.(\d+)\.mlp\.dense_h_to_4h\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.mlp.fc_in.{p}")],
            r"layers\.(\d+)\.mlp\.dense_4h_to_h\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.mlp.fc_out.{p}")],
        }
        return self._match(table, key)

    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        cfg, s = model.cfg, _state(model)
        d, M, H, D, w = cfg.d_model, cfg.mlp_dim, cfg.n_heads, cfg.head_dim, s["embed.weight"]
        out = {"gpt_neox.embed_in.weight": w, "gpt_neox.final_layer_norm.weight": s["ln_final.w"],
               "gpt_neox.final_layer_norm.bias": _bias(s, "ln_final.b", d, w)}
        for i in range(cfg.n_layers):
            ours, theirs = f"blocks.{i}.", f"gpt_neox.layers.{i}."
            for n, name in ((1, "input_layernorm"), (2, "post_attention_layernorm")):
                out[theirs + f"{name}.weight"] = s[ours + f"ln{n}.w"]
                out[theirs + f"{name}.bias"] = _bias(s, ours + f"ln{n}.b", d, w)
            # ours: rows [(q|k|v), head, d_head]; NeoX: [head, (q|k|v), d_head]
            qkv_w = s[ours + "attn.qkv.weight"]
            qkv_b = _bias(s, ours + "attn.qkv.bias", 3 * d, w)
            out[theirs + "attention.query_key_value.weight"] = qkv_w.unflatten(0, (3, H, D)).transpose(0, 1).flatten(0, 2)
            out[theirs + "attention.query_key_value.bias"] = qkv_b.unflatten(0, (3, H, D)).transpose(0, 1).flatten(0, 2)
            for ours_name, theirs_name, width in (("attn.out", "attention.dense", d), ("mlp.fc_in", "mlp.dense_h_to_4h", M),
                                                  ("mlp.fc_out", "mlp.dense_4h_to_h", d)):
                out[theirs + theirs_name + ".weight"] = s[ours + ours_name + ".weight"]
                out[theirs + theirs_name + ".bias"] = _bias(s, ours + ours_name + ".bias", width, w)
        if not cfg.tied_embeddings:
            out["embed_out.weight"] = s["unembed.weight"]
        return out

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        zeros = [r"unembed\.bias"]
        if not _get(hf, "attention_bias", True):
            zeros.append(r"blocks\.\d+\.attn\.(qkv|out)\.bias")
        return zeros

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        # GPT-NeoX blocks may be parallel or sequential
        found = _classic_problems(cfg) + _scaled(cfg) + _plain_attention_layernorm(cfg)
        if cfg.positional != "rotary":
            found.append(f"positional={cfg.positional!r} (needs rotary)")
        return found

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        partial = cfg.rot_dim / cfg.head_dim
        if int(cfg.head_dim * partial) != cfg.rot_dim:  # transformers rounds head_dim * partial down
            partial = math.nextafter(partial, 1.0)
        return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", **common,
                "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads, "max_position_embeddings": cfg.n_ctx,
                "layer_norm_eps": cfg.norm_eps, "hidden_act": EXPORT_ACTIVATION[cfg.mlp],
                "use_parallel_residual": cfg.parallel_attn_mlp, "rotary_pct": partial,
                "rotary_emb_base": cfg.rotary_base, "rope_scaling": _hf_rope_scaling(cfg),
                "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base,
                                    "partial_rotary_factor": partial, **(_hf_rope_scaling(cfg) or {})},
                "attention_bias": True, "attention_dropout": 0.0, "hidden_dropout": 0.0}


register_family(GPTNeoX(), order=20, export_order=30)
