"""Qwen3: LLaMA with per-head q/k RMSNorm before rotary, in and out (the shared decoder mapping: decoder.py)."""
from __future__ import annotations

from circuitlab.config import ModelConfig
from circuitlab.pretrained.families.base import _rope, _rotary_dim, register_family
from circuitlab.pretrained.families.decoder import (_Decoder, _head_dim, _hf_layer_types, _rope_export, _silu, _wants,
                                                    _windows)


class Qwen3(_Decoder):
    """Qwen3: LLaMA with per-head q/k RMSNorm before rotary (and no qkv bias by default)."""

    name = "Qwen3"
    model_types = ("qwen3",)
    architectures = ("Qwen3ForCausalLM",)
    norm_names = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        _silu(hf, self.name)
        theta, partial, scaling = _rope(hf, default_partial=1.0)
        max_window = hf.get("max_window_layers", hf["num_hidden_layers"])
        window, layers = (None, None)
        if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or []):
            window, layers = _windows(hf, lambda i: i >= max_window)
        return self._common(hf, n_ctx, qk_norm="head", rotary_base=theta, sliding_window=window,
                            sliding_layers=layers, rotary_dim=_rotary_dim(_head_dim(hf), partial),
                            rope_scaling=scaling)

    def _problems(self, cfg: ModelConfig) -> list[str]:
        return _wants(cfg, mlp="swiglu", block_norms="pre", qk_norm="head", embed_scale=1.0, attn_scale=None,
                      attn_softcap=None, logit_softcap=None, local_rotary_base=None, rotary_dim=None)

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        window = {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
                  "layer_types": _hf_layer_types(cfg)}
        return {**common, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **self._hf_common(cfg),
                "hidden_act": "silu", **window, "rope_theta": cfg.rotary_base,
                "rope_parameters": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)}


register_family(Qwen3(), order=40, export_order=40)
