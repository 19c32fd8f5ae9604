"""Gemma-3 (text): Gemma-2 (gemma2.py) plus per-head q/k norms and local layers with their own rope base."""
from __future__ import annotations

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import _get, _rope, _rotary_dim, register_family
from circuitlab.pretrained.families.decoder import _head_dim, _hf_layer_types, _rope_export, _wants, _windows
from circuitlab.pretrained.families.gemma2 import Gemma2, _float, _query_scalar, _query_scalar_problems


class Gemma3(Gemma2):
    """Gemma-3 text: Gemma-2 plus per-head q/k norms and local layers with their own rope base."""

    name = "Gemma-3"
    model_types = ("gemma3_text",)
    architectures = ("Gemma3ForCausalLM",)
    covers = ("Gemma-3 (text)",)

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        act = _get(hf, "hidden_activation", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise CircuitlabError(f"a {self.name} MLP with activation {act!r} is not supported (circuitlab's GeGLU "
                                  "uses the tanh GELU, gelu_pytorch_tanh)")
        params = hf.get("rope_parameters") or {}
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        if not params:  # the older layout: rope_theta, rope_local_base_freq, rope_scaling
            full = {"rope_theta": _get(hf, "rope_theta", 1e6), **(hf.get("rope_scaling") or {})}
            local = {"rope_theta": _get(hf, "rope_local_base_freq", 1e4)}
        if (local.get("rope_type") or local.get("type") or "default") != "default":
            raise CircuitlabError(f"this {self.name} checkpoint scales the rotary embedding of its sliding layers "
                                  f"({local.get('rope_type') or local.get('type')!r}), which circuitlab's Transformer "
                                  "does not implement (only the global layers' scaling)")
        theta, partial, scaling = _rope({"rope_parameters": full, "rope_theta": full.get("rope_theta", 1e6)},
                                        default_partial=1.0)
        pattern = int(_get(hf, "sliding_window_pattern", 6))
        window, layers = _windows(hf, lambda i: (i + 1) % pattern != 0)
        local_base = float(_get(local, "rope_theta", 1e4)) if window is not None else None
        return self._common(
            hf, n_ctx, mlp="geglu", block_norms="sandwich", qk_norm="head",
            embed_scale=float(hf["hidden_size"] ** 0.5),
            attn_scale=float(_get(hf, "query_pre_attn_scalar", _head_dim(hf))) ** 0.5,
            attn_softcap=_float(hf.get("attn_logit_softcapping")),
            logit_softcap=_float(hf.get("final_logit_softcapping")), sliding_window=window, sliding_layers=layers,
            rotary_base=theta, rotary_dim=_rotary_dim(_head_dim(hf), partial), rope_scaling=scaling,
            local_rotary_base=local_base if local_base != theta else None,
            tied_embeddings=bool(_get(hf, "tie_word_embeddings", True)))

    def _problems(self, cfg: ModelConfig) -> list[str]:
        found = _wants(cfg, mlp="geglu", block_norms="sandwich", qk_norm="head",
                       embed_scale=float(cfg.d_model ** 0.5))
        return found + _query_scalar_problems(cfg)

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        local = cfg.local_rotary_base if cfg.local_rotary_base is not None else cfg.rotary_base
        return {**common, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **self._hf_common(cfg),
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": _query_scalar(cfg),
                "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.logit_softcap,
                "sliding_window": cfg.sliding_window, "layer_types": _hf_layer_types(cfg),
                "rope_parameters": {"full_attention": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling),
                                    "sliding_attention": {"rope_type": "default", "rope_theta": local}}}


register_family(Gemma3(), order=60, export_order=60)
