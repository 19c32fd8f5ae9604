"""GPT-2, GPT-NeoX, LLaMA (and Mistral, Qwen2) and GPT-J: each one's config and tensor mapping, import and export
side by side (the interface: family_base.py; Gemma-2/3, Qwen3, OLMo-2, Phi-3: llama_like.py)."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.family_base import (_NORM, Family, Piece, _activation, _bias, _get, _n_ctx, _rope,
                                               _rotary_dim, _rows, _state, _transpose, model_type)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


class GPT2(Family):
    """GPT-2: Conv1D weights [in, out], fused c_attn (q, k, v blocks), learned positions, tied unembedding."""

    name = "GPT-2"
    model_types = ("gpt2",)
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


class GPTNeoX(Family):
    """GPT-NeoX / Pythia: parallel attention and MLP, partial rotary, and a fused query_key_value
    whose rows are grouped per head: [head 0: q, k, v][head 1: q, k, v]..."""

    name = "GPT-NeoX"
    model_types = ("gpt_neox",)
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


class Llama(Family):
    """LLaMA, Mistral and Qwen2: RMSNorm, rotary, SwiGLU, grouped-query attention with separate
    q/k/v projections; Qwen2 (and LLaMA with attention_bias) have q/k/v biases."""

    name = "LLaMA"
    model_types = ("llama", "mistral", "qwen2")
    covers = ("LLaMA", "Mistral", "Qwen2")
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

    @staticmethod
    def _sliding_window(hf: dict) -> int | None:
        window = hf.get("sliding_window")
        if window is None:
            return None
        if model_type(hf) == "qwen2" and not (hf.get("use_sliding_window")
                                                or "sliding_attention" in (hf.get("layer_types") or [])):
            return None
        return int(window)

    @staticmethod
    def _biases(hf: dict) -> set[str]:
        """Which of our biased parameters the checkpoint actually has."""
        if model_type(hf) == "qwen2":
            return {"qkv"}
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


class GPTJ(Family):
    """GPT-J: parallel attention and MLP reading one shared LayerNorm (ln_1: we give ln1 and ln2 the same
    weights), partial rotary over adjacent pairs, unbiased q/k/v/out, an untied unembedding with a bias."""

    name = "GPT-J"
    model_types = ("gptj",)
    ignore = re.compile(r"(^|\.)attn\.(masked_)?bias$|embed_positions$")

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        d_model, n_heads = hf["n_embd"], hf["n_head"]
        head_dim = d_model // n_heads
        rot = _get(hf, "rotary_dim", head_dim)
        return ModelConfig(
            n_layers=hf["n_layer"], d_model=d_model, n_heads=n_heads, d_vocab=hf["vocab_size"],
            n_ctx=_n_ctx(hf["n_positions"], n_ctx, learned=False), d_mlp=_get(hf, "n_inner", 4 * d_model),
            norm="layernorm", norm_eps=float(_get(hf, "layer_norm_epsilon", 1e-5)), positional="rotary",
            rotary_dim=None if rot == head_dim else rot, rotary_interleaved=True,
            mlp=_activation(_get(hf, "activation_function", "gelu_new")), bias=True,
            tied_embeddings=bool(_get(hf, "tie_word_embeddings", False)), parallel_attn_mlp=True)

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        key = key.removeprefix("transformer.")
        rows = _rows(cfg)
        table: dict[str, Callable[..., list[Piece] | None]] = {
            r"wte\.weight": lambda: [Piece("embed.weight")],
            r"lm_head\.weight": lambda: [] if cfg.tied_embeddings else [Piece("unembed.weight")],
            r"lm_head\.bias": lambda: [Piece("unembed.bias")],
            r"ln_f\.(weight|bias)": lambda p: [Piece(f"ln_final.{_NORM[p]}")],
            # one norm read by both sublayers: the same weights for our ln1 and ln2
            r"h\.(\d+)\.ln_1\.(weight|bias)": lambda i, p: [Piece(f"blocks.{i}.ln1.{_NORM[p]}"),
                                                              Piece(f"blocks.{i}.ln2.{_NORM[p]}")],
            r"h\.(\d+)\.attn\.([qkv])_proj\.weight": lambda i, qkv: [Piece(f"blocks.{i}.attn.qkv.weight", rows[qkv])],
            r"h\.(\d+)\.attn\.out_proj\.weight": lambda i: [Piece(f"blocks.{i}.attn.out.weight")],
            r"h\.(\d+)\.mlp\.fc_(in|out)\.(weight|bias)": lambda i, n, p: [Piece(f"blocks.{i}.mlp.fc_{n}.{p}")],
        }
        return self._match(table, key)

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        return [r"blocks\.\d+\.attn\.(qkv|out)\.bias"]

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        found = []
        if cfg.attn_only or not cfg.use_attn_out or not cfg.scale_scores:
            found.append("attn_only, V-only heads or unscaled scores")
        if not cfg.parallel_attn_mlp:
            found.append("parallel_attn_mlp=False (needs parallel)")
        if cfg.norm != "layernorm" or not cfg.bias:
            found.append("needs norm='layernorm' with bias=True")
        if cfg.positional != "rotary" or not cfg.rotary_interleaved:
            found.append("positions must be interleaved rotary (rotary_interleaved=True)")
        if cfg.kv_heads != cfg.n_heads or cfg.head_dim * cfg.n_heads != cfg.d_model:
            found.append("needs plain multi-head attention with d_head * n_heads == d_model")
        if cfg.mlp not in _EXPORT_ACTIVATION:
            found.append(f"mlp={cfg.mlp!r} (needs gelu_new, gelu or relu)")
        if cfg.rope_scaling is not None or cfg.rotary_base != 10000.0:
            found.append("GPT-J's rotary has base 10000 and no scaling")
        for name in ("embed_scale", "attn_scale", "attn_softcap", "logit_softcap", "sliding_window"):
            if getattr(cfg, name) not in (None, 1.0):
                found.append(f"{name}={getattr(cfg, name)!r}")
        return found

    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        cfg, s = model.cfg, _state(model)
        H, D = cfg.n_heads, cfg.head_dim
        for i in range(cfg.n_layers):
            p = f"blocks.{i}."
            if not (torch.equal(s[p + "ln1.w"], s[p + "ln2.w"]) and torch.equal(s[p + "ln1.b"], s[p + "ln2.b"])):
                raise CircuitlabError(f"GPT-J's blocks have one norm for attention and MLP, but this model's layer {i} "
                                      "has different ln1 and ln2 weights")
            for name in ("attn.qkv.bias", "attn.out.bias"):
                if bool((s[p + name] != 0).any()):
                    raise CircuitlabError(f"GPT-J's attention has no biases, but this model's {p + name} is non-zero")
        out = {"transformer.wte.weight": s["embed.weight"], "transformer.ln_f.weight": s["ln_final.w"],
               "transformer.ln_f.bias": s["ln_final.b"], "lm_head.weight": s["unembed.weight"],
               "lm_head.bias": s["unembed.bias"]}
        for i in range(cfg.n_layers):
            ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
            out[theirs + "ln_1.weight"], out[theirs + "ln_1.bias"] = s[ours + "ln1.w"], s[ours + "ln1.b"]
            q, k, v = s[ours + "attn.qkv.weight"].split(H * D)
            out.update({theirs + "attn.q_proj.weight": q, theirs + "attn.k_proj.weight": k,
                        theirs + "attn.v_proj.weight": v, theirs + "attn.out_proj.weight": s[ours + "attn.out.weight"]})
            for n in ("in", "out"):
                for part in ("weight", "bias"):
                    out[theirs + f"mlp.fc_{n}.{part}"] = s[ours + f"mlp.fc_{n}.{part}"]
        return out

    def hf_config(self, cfg: ModelConfig) -> dict:
        return {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "vocab_size": cfg.d_vocab,
                "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.mlp_dim,
                "n_positions": cfg.n_ctx, "rotary_dim": cfg.rot_dim, "layer_norm_epsilon": cfg.norm_eps,
                "activation_function": _EXPORT_ACTIVATION[cfg.mlp], "tie_word_embeddings": cfg.tied_embeddings,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "use_cache": True}


_EXPORT_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}
