"""What the newer LLaMA-like decoders share (gemma2.py, gemma3.py, qwen3.py, olmo2.py, phi3.py): HF's
model.layers.{i}.self_attn / mlp naming both ways, and the export checks. Not a family itself.

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

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.families.base import Family, Piece, _block_problems, _get, _n_ctx, _rows, _state

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
    found = _block_problems(cfg)
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

def _silu(hf: dict, name: str) -> None:
    if _get(hf, "hidden_act", "silu") not in ("silu", "swish"):
        raise CircuitlabError(f"a {name} MLP with activation {hf['hidden_act']!r} is not supported "
                              "(circuitlab's gated MLP with SiLU is SwiGLU)")
