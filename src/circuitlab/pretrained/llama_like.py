"""The newer LLaMA-like decoders: Gemma-2, Gemma-3 (text), Qwen3, OLMo-2 and Phi-3, in and out.

Each differs from LLaMA by a few switches of ModelConfig (see docs/pretrained.md):

- Gemma-2: embeddings × √d_model (embed_scale), RMSNorm gains stored as 1 + w, four norms per block
  (block_norms="sandwich": ln1, ln1_post, ln2, ln2_post), GeGLU (tanh GELU), attention and final-logit
  soft-caps, a sliding window on alternating layers, scores scaled by query_pre_attn_scalar^-1/2;
- Gemma-3: Gemma-2 plus per-head q/k RMSNorm (qk_norm="head") and a local/global layer pattern whose
  sliding layers have their own rope base (local_rotary_base);
- Qwen3: per-head q/k RMSNorm before rotary, no qkv bias;
- OLMo-2: only post-norms (block_norms="post"), q/k RMSNorm over the whole projection (qk_norm="full");
- Phi-3: fused qkv_proj and gate_up_proj (split into our rows on import, fused on export).

Gemma's RMSNorm multiplies by (1 + w): we store the gain 1 + w (what TransformerLens stores too), so
every analysis reads an ordinary norm gain; export writes gain - 1, which gives back the same gain
exactly in float32.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.family_base import (Family, Piece, _get, _n_ctx, _rope, _rotary_dim, _rows, _state,
                                               model_type)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def _plus_one(t: torch.Tensor) -> torch.Tensor:
    """Gemma's stored norm weight w -> our gain 1 + w (in float32 at least, as Gemma computes it)."""
    return t.to(torch.promote_types(t.dtype, torch.float32)) + 1


def _windows(hf: dict, default_sliding: Callable[[int], bool] | None) -> tuple[int | None, list | None]:
    """(sliding_window, sliding_layers) from config.json's layer_types (or the family's default pattern)."""
    window = hf.get("sliding_window")
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is not None:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise CircuitlabError(f"this checkpoint has layers of type {', '.join(unknown)}, which circuitlab's "
                                  "Transformer does not implement (it has full_attention and sliding_attention)")
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    elif default_sliding is not None:
        sliding = [i for i in range(n) if default_sliding(i)]
    else:
        sliding = list(range(n))
    if window is None or not sliding:
        return None, None
    return int(window), (None if len(sliding) == n else sliding)


def _hf_layer_types(cfg: ModelConfig) -> list[str]:
    return ["sliding_attention" if cfg.is_sliding(i) else "full_attention" for i in range(cfg.n_layers)]


def _head_dim(hf: dict) -> int:
    return _get(hf, "head_dim", hf["hidden_size"] // hf["num_attention_heads"])


class _Decoder(Family):
    """Shared by the LLaMA-like families: HF's model.layers.{i}.self_attn / mlp naming."""

    ignore = re.compile(r"rotary_emb\.inv_freq$")
    plus_one = False                   # Gemma: stored norm weights are w with gain 1 + w
    norm_names: dict[str, str] = {}    # HF norm name -> our block norm
    fused = False                      # Phi-3: qkv_proj and gate_up_proj

    # ------------------------------------------------------------ import
    def _common(self, hf: dict, n_ctx: int | None, positions: int | None = None, **fields) -> ModelConfig:
        d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = _head_dim(hf)
        positions = hf["max_position_embeddings"] if positions is None else positions
        base = dict(
            n_layers=hf["num_hidden_layers"], d_model=d_model, n_heads=n_heads,
            n_kv_heads=_get(hf, "num_key_value_heads", n_heads), d_vocab=hf["vocab_size"],
            d_head=None if head_dim * n_heads == d_model else head_dim,
            n_ctx=_n_ctx(positions, n_ctx, learned=False), d_mlp=hf["intermediate_size"], norm="rmsnorm",
            norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)), positional="rotary", mlp="swiglu",
            bias=bool(hf.get("attention_bias")), tied_embeddings=bool(_get(hf, "tie_word_embeddings", False)))
        return ModelConfig(**{**base, **fields})

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        key = key.removeprefix("model.")
        rows, M = _rows(cfg), cfg.mlp_dim
        norm = _plus_one if self.plus_one else None
        table: dict[str, Callable[..., list[Piece] | None]] = {
            r"embed_tokens\.weight": lambda: [Piece("embed.weight")],
            r"lm_head\.weight": lambda: [] if cfg.tied_embeddings else [Piece("unembed.weight")],
            r"norm\.weight": lambda: [Piece("ln_final.w", None, norm)],
            r"layers\.(\d+)\.(\w+_layernorm)\.weight":
                lambda i, n: [Piece(f"blocks.{i}.{self.norm_names[n]}.w", None, norm)] if n in self.norm_names
                else None,
            r"layers\.(\d+)\.self_attn\.([qk])_norm\.weight": lambda i, qk: [Piece(f"blocks.{i}.attn.{qk}_norm.w",
                                                                                   None, norm)],
            r"layers\.(\d+)\.self_attn\.qkv_proj\.weight": lambda i: [Piece(f"blocks.{i}.attn.qkv.weight")],
            r"layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)":
                lambda i, qkv, p: [Piece(f"blocks.{i}.attn.qkv.{p}", rows[qkv])],
            r"layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.attn.out.{p}")],
            r"layers\.(\d+)\.mlp\.gate_up_proj\.weight": lambda i: [Piece(f"blocks.{i}.mlp.fc_in.weight")],
            r"layers\.(\d+)\.mlp\.gate_proj\.weight": lambda i: [Piece(f"blocks.{i}.mlp.fc_in.weight", 0)],
            r"layers\.(\d+)\.mlp\.up_proj\.weight": lambda i: [Piece(f"blocks.{i}.mlp.fc_in.weight", M)],
            r"layers\.(\d+)\.mlp\.down_proj\.weight": lambda i: [Piece(f"blocks.{i}.mlp.fc_out.weight")],
        }
        return self._match(table, key)

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        # attention_bias covers q/k/v and o; the MLP and the unembedding never have one
        zeros = [r"unembed\.bias", r"blocks\.\d+\.mlp\.fc_(in|out)\.bias"]
        return zeros if cfg.bias else zeros + [r"blocks\.\d+\.attn\.(qkv|out)\.bias"]

    # ------------------------------------------------------------ export
    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        cfg, s = model.cfg, _state(model)
        H, K, D, M = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.mlp_dim
        norm = (lambda t: t - 1) if self.plus_one else (lambda t: t)
        out = {"model.embed_tokens.weight": s["embed.weight"], "model.norm.weight": norm(s["ln_final.w"])}
        for i in range(cfg.n_layers):
            ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
            for hf_name, name in self.norm_names.items():
                out[theirs + f"{hf_name}.weight"] = norm(s[ours + f"{name}.w"])
            if cfg.qk_norm != "none":
                for qk in "qk":
                    out[theirs + f"self_attn.{qk}_norm.weight"] = norm(s[ours + f"attn.{qk}_norm.w"])
            qkv = s[ours + "attn.qkv.weight"]
            if self.fused:
                out[theirs + "self_attn.qkv_proj.weight"] = qkv
                out[theirs + "mlp.gate_up_proj.weight"] = s[ours + "mlp.fc_in.weight"]
            else:
                for part in ("weight", "bias") if cfg.bias else ("weight",):
                    q, k, v = s[ours + f"attn.qkv.{part}"].split([H * D, K * D, K * D])
                    out.update({theirs + f"self_attn.q_proj.{part}": q, theirs + f"self_attn.k_proj.{part}": k,
                                theirs + f"self_attn.v_proj.{part}": v})
                if cfg.bias:
                    out[theirs + "self_attn.o_proj.bias"] = s[ours + "attn.out.bias"]
                gate, up = s[ours + "mlp.fc_in.weight"].split(M)
                out.update({theirs + "mlp.gate_proj.weight": gate, theirs + "mlp.up_proj.weight": up})
            out[theirs + "self_attn.o_proj.weight"] = s[ours + "attn.out.weight"]
            out[theirs + "mlp.down_proj.weight"] = s[ours + "mlp.fc_out.weight"]
        if not cfg.tied_embeddings:
            out["lm_head.weight"] = s["unembed.weight"]
        return out

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        """What in cfg this architecture cannot hold (empty: it exports exactly)."""
        found = _common_problems(cfg)
        if self.fused and cfg.bias:
            found.append("bias=True (Phi-3 has no biases)")
        return found + self._problems(cfg)

    def _problems(self, cfg: ModelConfig) -> list[str]:
        return []

    def _hf_common(self, cfg: ModelConfig) -> dict:
        return {"vocab_size": cfg.d_vocab, "tie_word_embeddings": cfg.tied_embeddings, "hidden_size": cfg.d_model,
                "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
                "max_position_embeddings": cfg.n_ctx, "rms_norm_eps": cfg.norm_eps, "attention_bias": cfg.bias,
                "attention_dropout": 0.0, "use_cache": True}


def _common_problems(cfg: ModelConfig) -> list[str]:
    found = []
    if cfg.attn_only:
        found.append("attn_only=True (HF models all have MLPs)")
    if not cfg.use_attn_out:
        found.append("use_attn_out=False (V-only heads)")
    if cfg.parallel_attn_mlp:
        found.append("parallel_attn_mlp=True")
    if not cfg.scale_scores:
        found.append("scale_scores=False")
    if cfg.norm != "rmsnorm":
        found.append(f"norm={cfg.norm!r} (needs rmsnorm)")
    if cfg.positional != "rotary" or cfg.rotary_interleaved:
        found.append("positions must be rotate-half rotary")
    return found


def _wants(cfg: ModelConfig, **fields) -> list[str]:
    """The fields of cfg that differ from what an architecture fixes."""
    return [f"{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in fields.items() if getattr(cfg, k) != v]


def _rope_export(cfg: ModelConfig, base: float, scaling: dict | None) -> dict:
    params = {"rope_type": "default", "rope_theta": base}
    if scaling is not None:
        params = {"rope_type": scaling["type"], "rope_theta": base,
                  **{k: v for k, v in scaling.items() if k != "type"}}
    return params


# ---------------------------------------------------------------------------------------- Gemma-2
class Gemma2(_Decoder):
    """Gemma-2: sandwich norms with 1 + w gains, GeGLU, soft-caps, alternating sliding window."""

    name = "Gemma-2"
    model_types = ("gemma2",)
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

    def hf_config(self, cfg: ModelConfig) -> dict:
        return {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **self._hf_common(cfg),
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


# ---------------------------------------------------------------------------------------- Gemma-3
class Gemma3(Gemma2):
    """Gemma-3 text: Gemma-2 plus per-head q/k norms and local layers with their own rope base."""

    name = "Gemma-3"
    model_types = ("gemma3_text",)
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

    def hf_config(self, cfg: ModelConfig) -> dict:
        local = cfg.local_rotary_base if cfg.local_rotary_base is not None else cfg.rotary_base
        return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **self._hf_common(cfg),
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": _query_scalar(cfg),
                "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.logit_softcap,
                "sliding_window": cfg.sliding_window, "layer_types": _hf_layer_types(cfg),
                "rope_parameters": {"full_attention": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling),
                                    "sliding_attention": {"rope_type": "default", "rope_theta": local}}}


# ---------------------------------------------------------------------------------------- Qwen3
class Qwen3(_Decoder):
    """Qwen3: LLaMA with per-head q/k RMSNorm before rotary (and no qkv bias by default)."""

    name = "Qwen3"
    model_types = ("qwen3",)
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

    def hf_config(self, cfg: ModelConfig) -> dict:
        window = {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
                  "layer_types": _hf_layer_types(cfg)}
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **self._hf_common(cfg),
                "hidden_act": "silu", **window, "rope_theta": cfg.rotary_base,
                "rope_parameters": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)}


def _silu(hf: dict, name: str) -> None:
    if _get(hf, "hidden_act", "silu") not in ("silu", "swish"):
        raise CircuitlabError(f"a {name} MLP with activation {hf['hidden_act']!r} is not supported "
                              "(circuitlab's gated MLP with SiLU is SwiGLU)")


# ---------------------------------------------------------------------------------------- OLMo-2
class Olmo2(_Decoder):
    """OLMo-2: norms on each sublayer's output only, q/k RMSNorm over the whole projection."""

    name = "OLMo-2"
    model_types = ("olmo2",)
    norm_names = {"post_attention_layernorm": "ln1_post", "post_feedforward_layernorm": "ln2_post"}

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        _silu(hf, self.name)
        theta, partial, scaling = _rope(hf, default_partial=1.0)
        return self._common(hf, n_ctx, block_norms="post", qk_norm="full", rotary_base=theta,
                            rotary_dim=_rotary_dim(_head_dim(hf), partial), rope_scaling=scaling)

    def _problems(self, cfg: ModelConfig) -> list[str]:
        return _wants(cfg, mlp="swiglu", block_norms="post", qk_norm="full", embed_scale=1.0, attn_scale=None,
                      attn_softcap=None, logit_softcap=None, sliding_window=None, rotary_dim=None)

    def hf_config(self, cfg: ModelConfig) -> dict:
        return {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", **self._hf_common(cfg),
                "hidden_act": "silu", "rope_theta": cfg.rotary_base,
                "rope_parameters": _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)}


# ---------------------------------------------------------------------------------------- Phi-3
class Phi3(_Decoder):
    """Phi-3: LLaMA with fused qkv_proj (q, k, v rows, as ours) and gate_up_proj (gate rows, then up)."""

    name = "Phi-3"
    model_types = ("phi3",)
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

    def hf_config(self, cfg: ModelConfig) -> dict:
        partial = cfg.rot_dim / cfg.head_dim
        rope = _rope_export(cfg, cfg.rotary_base, cfg.rope_scaling)
        if partial != 1.0:
            rope["partial_rotary_factor"] = partial
        return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **self._hf_common(cfg),
                "hidden_act": "silu", "sliding_window": cfg.sliding_window, "rope_theta": cfg.rotary_base,
                "partial_rotary_factor": partial, "rope_parameters": rope, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "pad_token_id": None,
                "original_max_position_embeddings": (cfg.rope_scaling or {}).get("original_max_position_embeddings",
                                                                                cfg.n_ctx)}


def is_gemma3_multimodal(hf: dict) -> bool:
    return model_type(hf) == "gemma3"
