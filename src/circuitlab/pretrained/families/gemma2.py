"""Gemma-2: sandwich norms with 1 + w gains, GeGLU, soft-caps, an alternating sliding window, in and out
(the shared decoder mapping: decoder.py)."""
from __future__ import annotations

import math

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import _get, _rope, _rotary_dim, register_family
from circuitlab.pretrained.families.decoder import _Decoder, _head_dim, _hf_layer_types, _rope_export, _wants, _windows


class Gemma2(_Decoder):
    """Gemma-2: sandwich norms with 1 + w gains, GeGLU, soft-caps, alternating sliding window."""

    name = "Gemma-2"
    model_types = ("gemma2",)
    architectures = ("Gemma2ForCausalLM",)
    plus_one = True
    norm_names = {"input_layernorm": "ln1", "post_attention_layernorm": "ln1_post",
                  "pre_feedforward_layernorm": "ln2", "post_feedforward_layernorm": "ln2_post"}

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        act = _get(hf, "hidden_activation", _get(hf, "hidden_act", "gelu_pytorch_tanh"))
        if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
            raise CircuitlabError(f"a {self.name} MLP with activation {act!r} is not supported (circuitlab's GeGLU "
                                  "uses the tanh GELU, gelu_pytorch_tanh)")
        theta, partial, scaling = _rope(hf, default_partial=1.0)
        window, layers = _windows(hf, lambda i: (i + 1) % 2 == 1)
        return self._common(
            hf, n_ctx, mlp="geglu", block_norms="sandwich", embed_scale=float(hf["hidden_size"] ** 0.5),
            attn_scale=float(_get(hf, "query_pre_attn_scalar", _head_dim(hf))) ** 0.5,
            attn_softcap=_float(hf.get("attn_logit_softcapping")),
            logit_softcap=_float(hf.get("final_logit_softcapping")), sliding_window=window, sliding_layers=layers,
            rotary_base=theta, rotary_dim=_rotary_dim(_head_dim(hf), partial), rope_scaling=scaling,
            tied_embeddings=bool(_get(hf, "tie_word_embeddings", True)), **self._extra(hf))

    def _extra(self, hf: dict) -> dict:
        return {}

    def _problems(self, cfg: ModelConfig) -> list[str]:
        found = _wants(cfg, mlp="geglu", block_norms="sandwich", qk_norm="none", local_rotary_base=None,
                       embed_scale=float(cfg.d_model ** 0.5))
        return found + _query_scalar_problems(cfg)

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        return {**common, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **self._hf_common(cfg),
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": _query_scalar(cfg),
                "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.logit_softcap,
                "sliding_window": cfg.sliding_window, "layer_types": _hf_layer_types(cfg),
                "rope_theta": cfg.rotary_base, "rope_parameters": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)}


def _float(value) -> float | None:
    return None if value is None else float(value)


def _query_scalar(cfg: ModelConfig) -> float:
    """query_pre_attn_scalar: scores are scaled by its inverse square root."""
    scale = cfg.attn_scale if cfg.attn_scale is not None else math.sqrt(cfg.head_dim)
    value = scale ** 2
    return int(round(value)) if abs(value - round(value)) < 1e-9 else value


def _query_scalar_problems(cfg: ModelConfig) -> list[str]:
    if cfg.attn_scale is None:
        return []
    if abs(_query_scalar(cfg) ** -0.5 - cfg.score_scale) > 1e-12 * cfg.score_scale:
        return [f"attn_scale={cfg.attn_scale} (not the square root of a query_pre_attn_scalar)"]
    return []


register_family(Gemma2(), order=50, export_order=50)
