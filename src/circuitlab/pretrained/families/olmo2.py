"""OLMo-2: post-norms only and q/k RMSNorm over the whole projection, in and out (the shared decoder mapping:
decoder.py)."""
from __future__ import annotations

from circuitlab.config import ModelConfig
from circuitlab.pretrained.families.base import _rope, _rotary_dim, register_family
from circuitlab.pretrained.families.decoder import _Decoder, _head_dim, _rope_export, _silu, _wants


class Olmo2(_Decoder):
    """OLMo-2: norms on each sublayer's output only, q/k RMSNorm over the whole projection."""

    name = "OLMo-2"
    model_types = ("olmo2",)
    architectures = ("Olmo2ForCausalLM",)
    norm_names = {"post_attention_layernorm": "ln1_post", "post_feedforward_layernorm": "ln2_post"}

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        _silu(hf, self.name)
        theta, partial, scaling = _rope(hf, default_partial=1.0)
        return self._common(hf, n_ctx, block_norms="post", qk_norm="full", rotary_base=theta,
                            rotary_dim=_rotary_dim(_head_dim(hf), partial), rope_scaling=scaling)

    def _problems(self, cfg: ModelConfig) -> list[str]:
        return _wants(cfg, mlp="swiglu", block_norms="post", qk_norm="full", embed_scale=1.0, attn_scale=None,
                      attn_softcap=None, logit_softcap=None, sliding_window=None, rotary_dim=None)

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        return {**common, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", **self._hf_common(cfg),
                "hidden_act": "silu", "rope_theta": cfg.rotary_base,
                "rope_parameters": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)}


register_family(Olmo2(), order=70, export_order=70)
