"""How each Hugging Face architecture maps onto circuitlab's Transformer: the Family interface and the helpers
every family's mapping uses (families.py, llama_like.py: one Family subclass per architecture).

A family answers these questions about a checkpoint, import and export side by side:

- config(hf):      its config.json (a dict) as a ModelConfig;
- pieces(key):     where the checkpoint tensor `key` goes in our state dict (a list of Piece:
                   target parameter, first row, transform), [] for tensors we skip (causal-mask
                   buffers, rotary tables), or None for a key the family does not know;
- zero_targets():  which of our parameters the architecture does not have (e.g. Qwen2's
                   attention output bias when we keep biases for its q/k/v): they are set to 0;
- export_tensors(model): the reverse of pieces(), our weights under the checkpoint's names and
                   layout (export.py adds the config.json and the tokenizer).

Our fused layout: attn.qkv.weight [(n_heads + 2 n_kv_heads) d_head, d_model] is q heads then
k heads then v heads; mlp.fc_in.weight is [d_mlp, d_model] (SwiGLU: gate rows then up rows);
Linear weights are [out, in].
"""
from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from circuitlab.config import ROPE_SCALING_KEYS, ModelConfig
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

Transform = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Piece:
    """Checkpoint tensor -> rows [start, start + len(transform(t))) of our parameter `target`.

    start None means the whole parameter; transform None means the tensor as it is.
    """

    target: str
    start: int | None = None
    transform: Transform | None = None


def _transpose(t: torch.Tensor) -> torch.Tensor:
    """GPT-2's Conv1D stores weights [in, out]; ours are [out, in]."""
    return t.t()


# ---------------------------------------------------------------------------------------- helpers
def _get(hf: dict, key: str, default=None):
    value = hf.get(key)
    return default if value is None else value


def _rope(hf: dict, default_partial: float) -> tuple[float, float, dict | None]:
    """(theta, partial rotary factor, scaling for ModelConfig.rope_scaling) from either transformers 5's
    rope_parameters or the older rope_theta / rotary_emb_base / rotary_pct / rope_scaling keys."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    if any(k in params for k in ("full_attention", "sliding_attention")):
        raise CircuitlabError("this checkpoint uses different rotary settings per layer type, which circuitlab's "
                              "Transformer cannot express")
    kind = params.get("rope_type") or params.get("type") or scaling.get("rope_type") or scaling.get("type") \
        or "default"
    kind = "longrope" if kind == "su" else kind  # Phi-3's first name for LongRoPE
    if kind not in ("default", *ROPE_SCALING_KEYS):
        raise CircuitlabError(f"this checkpoint uses {kind!r} rotary scaling, which circuitlab's Transformer does "
                              f"not implement (supported: default, {', '.join(ROPE_SCALING_KEYS)})")
    theta = params.get("rope_theta") or hf.get("rope_theta") or hf.get("rotary_emb_base") or 10000.0
    partial = params.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or hf.get("rotary_pct") \
        or default_partial
    ours = None
    if kind == "longrope":
        source = {**scaling, **params}
        original = source.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
        if original is None or source.get("short_factor") is None or source.get("long_factor") is None:
            raise CircuitlabError("the checkpoint's 'longrope' rotary scaling lacks short_factor, long_factor or "
                                  "original_max_position_embeddings")
        factor = source.get("factor") or hf["max_position_embeddings"] / original
        attention = source.get("attention_factor")
        if attention is None:  # as transformers derives it
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        ours = {"type": "longrope", "short_factor": [float(v) for v in source["short_factor"]],
                "long_factor": [float(v) for v in source["long_factor"]],
                "original_max_position_embeddings": int(original), "attention_factor": float(attention)}
    elif kind != "default":
        source = {**scaling, **params}
        missing = [k for k in ROPE_SCALING_KEYS[kind] if source.get(k) is None]
        if missing:
            raise CircuitlabError(f"the checkpoint's {kind!r} rotary scaling lacks {', '.join(missing)}")
        ours = {"type": kind, **{k: source[k] for k in ROPE_SCALING_KEYS[kind]}}
    return float(theta), float(partial), ours


def _rotary_dim(head_dim: int, partial: float) -> int | None:
    """Rotated dims per head, as transformers computes them; None when the whole head rotates."""
    dim = int(head_dim * partial)
    if dim == head_dim:
        return None
    if dim <= 0 or dim % 2:
        raise CircuitlabError(f"rotary embedding over {dim} of {head_dim} head dims: circuitlab needs an even, "
                              "positive number of rotated dims")
    return dim


_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new",
                "relu": "relu"}


def _activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise CircuitlabError(f"MLP activation {name!r} is not supported (circuitlab has "
                              f"{', '.join(sorted(_ACTIVATIONS))} and SwiGLU)")
    return _ACTIVATIONS[name]


def _n_ctx(hf_positions: int, n_ctx: int | None, learned: bool) -> int:
    """The context to build: the checkpoint's, or a requested one (no longer than learned positions)."""
    if n_ctx is None:
        return hf_positions
    if n_ctx <= 0:
        raise CircuitlabError(f"n_ctx must be positive, got {n_ctx}")
    if learned and n_ctx > hf_positions:
        raise CircuitlabError(f"n_ctx={n_ctx} is too long: this checkpoint has learned positions for "
                              f"{hf_positions} tokens")
    return n_ctx


_NORM = {"weight": "w", "bias": "b"}  # our Norm's parameter names


def _rows(cfg: ModelConfig) -> dict[str, int]:
    """Where q, k and v start in our fused qkv rows."""
    H, K, D = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    return {"q": 0, "k": H * D, "v": (H + K) * D}


def _state(model: Transformer) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def _bias(state: dict[str, torch.Tensor], name: str, size: int, like: torch.Tensor) -> torch.Tensor:
    """Our bias, or zeros when the config has none (export: the HF layout always has one)."""
    return state[name] if name in state else torch.zeros(size, dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------------------------------- the interface
class Family(ABC):
    name = ""
    model_types: tuple[str, ...] = ()
    covers: tuple[str, ...] = ()   # the model families it reads, as users name them (default: its name)
    ignore = re.compile(r"$^")  # checkpoint keys that hold buffers, not weights

    @abstractmethod
    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        """config.json as a ModelConfig (n_ctx: a shorter context, see model_config_from_hf)."""

    @abstractmethod
    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        """Where checkpoint tensor `key` goes; [] to skip it; None if the key is unknown."""

    @abstractmethod
    def export_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        """The reverse of pieces(): model's weights under this architecture's checkpoint names and layout."""

    def zero_targets(self, hf: dict, cfg: ModelConfig) -> list[str]:
        """Regexes of our parameter names that this architecture lacks (filled with zeros)."""
        return []

    def _match(self, table: dict[str, Callable[..., list[Piece] | None]], key: str) -> list[Piece] | None:
        if self.ignore.search(key):
            return []
        for pattern, make in table.items():
            m = re.fullmatch(pattern, key)
            if m:
                return make(*m.groups())
        return None


_BY_ARCHITECTURE = {"GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox", "LlamaForCausalLM": "llama",
                    "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text", "Olmo2ForCausalLM": "olmo2",
                    "Phi3ForCausalLM": "phi3", "GPTJForCausalLM": "gptj"}


def model_type(hf: dict) -> str | None:
    """config.json's model_type, or the one its architectures list implies."""
    if hf.get("model_type"):
        return hf["model_type"]
    for arch in hf.get("architectures") or []:
        if arch in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[arch]
    return None
