"""LLaMA: config and tensor mapping, import and export side by side (the interface: base.py; Mistral and
Qwen2 are LLaMA with another model_type: mistral.py, qwen2.py)."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import (Family, Piece, _classic_problems, _get, _hf_rope_scaling, _n_ctx,
                                                 _rope, _rotary_dim, _rows, _scaled, _sequential, _state,
                                                 register_family)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


class Llama(Family):
    """LLaMA: RMSNorm, rotary, SwiGLU, grouped-query attention with separate q/k/v projections (biased with
    attention_bias, mlp_bias). Mistral and Qwen2 subclass it (mistral.py, qwen2.py)."""

    name = "LLaMA"
    model_types = ("llama",)
    architectures = ("LlamaForCausalLM",)
    ignore = re.compile(r"rotary_emb\.inv_freq$")

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        if _get(hf, "hidden_act", "silu") not in ("silu", "swish"):
            raise CircuitlabError(f"a LLaMA-style MLP with activation {hf['hidden_act']!r} is not supported "
                                  "(circuitlab's gated MLP is SwiGLU)")
        d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = _get(hf, "head_dim", d_model // n_heads)
        theta, partial, scaling = _rope(hf, default_partial=1.0)
        positions = hf["max_position_embeddings"]
        window = self._sliding_window(hf)
        if window is not None and window < positions:
            positions = window  # within the window, sliding-window attention is full causal attention
        return ModelConfig(
            n_layers=hf["num_hidden_layers"], d_model=d_model, n_heads=n_heads,
            n_kv_heads=_get(hf, "num_key_value_heads", n_heads), d_vocab=hf["vocab_size"],
            d_head=None if head_dim * n_heads == d_model else head_dim,
            n_ctx=_n_ctx(positions, n_ctx, learned=False), d_mlp=hf["intermediate_size"], norm="rmsnorm",
            norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)), positional="rotary", rotary_base=theta,
            rotary_dim=_rotary_dim(head_dim, partial), rope_scaling=scaling, mlp="swiglu",
            bias=bool(self._biases(hf)),
            tied_embeddings=bool(_get(hf, "tie_word_embeddings", False)),
        )

    def _sliding_window(self, hf: dict) -> int | None:
        window = hf.get("sliding_window")
        return None if window is None else int(window)

    def _biases(self, hf: dict) -> set[str]:
        """Which of our biased parameters the checkpoint actually has."""
        found = set()
        if hf.get("attention_bias"):
            found |= {"qkv", "out"}
        if hf.get("mlp_bias"):
            found |= {"fc_in", "fc_out"}
        return found

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        key = key.removeprefix("model.")
        rows = _rows(cfg)
        d_mlp = cfg.mlp_dim
        table: dict[str, Callable[..., list[Piece] | None]] = {
            r"embed_tokens\.weight": lambda: [Piece("embed.weight")],
            r"lm_head\.weight": lambda: [] if cfg.tied_embeddings else [Piece("unembed.weight")],
            r"norm\.weight": lambda: [Piece("ln_final.w")],
            r"layers\.(\d+)\.input_layernorm\.weight": lambda i: [Piece(f"blocks.{i}.ln1.w")],
            r"layers\.(\d+)\.post_attention_layernorm\.weight": lambda i: [Piece(f"blocks.{i}.ln2.w")],
            r"layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)":
                lambda i, qkv, p: [Piece(f"blocks.{i}.attn.qkv.{p}", rows[qkv])],
            r"layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.attn.out.{p}")],
            r"layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.mlp.fc_in.{p}", 0)],
            r"layers\.(\d+)\.mlp\.up_proj\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.mlp.fc_in.{p}", d_mlp)],
            r"layers\.(\d+)\.mlp\.down_proj\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.mlp.fc_out.{p}")],
        }
        return self._match(table, key)

    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        cfg, s = model.cfg, _state(model)
        H, K, D, M = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.mlp_dim
        out = {"model.embed_tokens.weight": s["embed.weight"], "model.norm.weight": s["ln_final.w"]}
        for i in range(cfg.n_layers):
            ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
            out[theirs + "input_layernorm.weight"] = s[ours + "ln1.w"]
            out[theirs + "post_attention_layernorm.weight"] = s[ours + "ln2.w"]
            for part in ("weight", "bias") if cfg.bias else ("weight",):
                q, k, v = s[ours + f"attn.qkv.{part}"].split([H * D, K * D, K * D])
                out.update({theirs + f"self_attn.q_proj.{part}": q, theirs + f"self_attn.k_proj.{part}": k,
                            theirs + f"self_attn.v_proj.{part}": v,
                            theirs + f"self_attn.o_proj.{part}": s[ours + f"attn.out.{part}"]})
                gate, up = s[ours + f"mlp.fc_in.{part}"].split(M)
                out.update({theirs + f"mlp.gate_proj.{part}": gate, theirs + f"mlp.up_proj.{part}": up,
                            theirs + f"mlp.down_proj.{part}": s[ours + f"mlp.fc_out.{part}"]})
        if not cfg.tied_embeddings:
            out["lm_head.weight"] = s["unembed.weight"]
        return out

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        present = self._biases(hf)
        return [r"unembed\.bias"] + [rf"blocks\.\d+\.(attn|mlp)\.{name}\.bias"
                                     for name in ("qkv", "out", "fc_in", "fc_out") if name not in present]

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        found = _classic_problems(cfg) + _sequential(cfg) + _scaled(cfg)
        if cfg.norm != "rmsnorm":
            found.append(f"norm={cfg.norm!r} (needs rmsnorm)")
        if cfg.positional != "rotary" or cfg.rot_dim != cfg.head_dim:
            found.append("positions must be rotary over the whole head")
        if cfg.mlp != "swiglu":
            found.append(f"mlp={cfg.mlp!r} (needs swiglu)")
        return found

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
                "max_position_embeddings": cfg.n_ctx, "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu",
                "rope_theta": cfg.rotary_base, "rope_scaling": _hf_rope_scaling(cfg),
                "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rotary_base,
                                    **(_hf_rope_scaling(cfg) or {})},
                "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "attention_dropout": 0.0, "pretraining_tp": 1}


register_family(Llama(), order=30, export_order=10)
