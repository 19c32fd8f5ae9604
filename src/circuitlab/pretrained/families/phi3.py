"""Phi-3: LLaMA with fused qkv_proj and gate_up_proj, in and out (the shared decoder mapping: decoder.py).
Last of the export styles: a model that fits it also fits LLaMA unless it has a sliding window; ask for it with
export_hf(..., style="phi3")."""
from __future__ import annotations

from circuitlab.config import ModelConfig
from circuitlab.pretrained.families.base import _rope, _rotary_dim, register_family
from circuitlab.pretrained.families.decoder import _Decoder, _head_dim, _rope_export, _silu, _wants


class Phi3(_Decoder):
    """Phi-3: LLaMA with fused qkv_proj (q, k, v rows, as ours) and gate_up_proj (gate rows, then up)."""

    name = "Phi-3"
    model_types = ("phi3",)
    architectures = ("Phi3ForCausalLM",)
    fused = True
    norm_names = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        _silu(hf, self.name)
        theta, partial, scaling = _rope(hf, default_partial=1.0)
        window = hf.get("sliding_window")
        return self._common(hf, n_ctx, rotary_base=theta, rotary_dim=_rotary_dim(_head_dim(hf), partial),
                            rope_scaling=scaling, sliding_window=None if window is None else int(window),
                            bias=False)

    def _problems(self, cfg: ModelConfig) -> list[str]:
        found = _wants(cfg, mlp="swiglu", block_norms="pre", qk_norm="none", embed_scale=1.0, attn_scale=None,
                       attn_softcap=None, logit_softcap=None, local_rotary_base=None, sliding_layers=None)
        return found

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        partial = cfg.rot_dim / cfg.head_dim
        rope = _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)
        if partial != 1.0:
            rope["partial_rotary_factor"] = partial
        return {**common, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **self._hf_common(cfg),
                "hidden_act": "silu", "sliding_window": cfg.sliding_window, "rope_theta": cfg.rotary_base,
                "partial_rotary_factor": partial, "rope_parameters": rope, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "pad_token_id": None,
                "original_max_position_embeddings": (cfg.rope_scaling or {}).get("original_max_position_embeddings",
                                                                                cfg.n_ctx)}


register_family(Phi3(), order=80, export_order=90)
