"""How each Hugging Face architecture maps onto circuitlab's Transformer: the Family interface, the registry every
family module adds itself to (register_family), and the helpers every family's mapping uses.

One module of this package per family (gpt2.py, llama.py, gemma2.py, ...), each a Family subclass and one


register_family(...) call; catalog.py finds them all (no list kept by hand). A family answers these questions
about a checkpoint, import and export side by side:

- config(hf):      its config.json (a dict) as a ModelConfig;
- pieces(key):     where the checkpoint tensor `key` goes in our state dict (a list of Piece:
                   target parameter, first row, transform), [] for tensors we skip (causal-mask
                   buffers, rotary tables), or None for a key the family does not know;
- zero_targets():  which of our parameters the architecture does not have (e.g. Qwen2's
                   attention output bias when we keep biases for its q/k/v): they are set to 0;
- export_tensors(model): the reverse of pieces(), our weights under the checkpoint's names and
                   layout (export.py adds the tokenizer);
- export_problems(cfg), hf_config(cfg, common): for a family that exports, what in a ModelConfig it cannot
                   hold, and its config.json.

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


# ---------------------------------------------------------------------------------------- export helpers
EXPORT_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}  # ours -> HF's, for export


def _hf_rope_scaling(cfg: ModelConfig) -> dict | None:
    """ModelConfig.rope_scaling in HF's spelling (rope_type instead of type)."""
    if cfg.rope_scaling is None:
        return None
    return {"rope_type": cfg.rope_scaling["type"], **{k: v for k, v in cfg.rope_scaling.items() if k != "type"}}


def _newer_switches(cfg: ModelConfig) -> list[str]:
    """The newer families' switches that are on: LLaMA, GPT-2 and GPT-NeoX have none of them."""
    defaults = dict(block_norms="pre", qk_norm="none", embed_scale=1.0, attn_scale=None, attn_softcap=None,
                    logit_softcap=None, sliding_window=None, local_rotary_base=None, rotary_interleaved=False)
    return [f"{k}={getattr(cfg, k)!r}" for k, v in defaults.items() if getattr(cfg, k) != v]


def _block_problems(cfg: ModelConfig) -> list[str]:
    """What no Hugging Face family's blocks hold: a block without an MLP, heads without an output projection."""
    found = []
    if cfg.attn_only:
        found.append("attn_only=True (HF models all have MLPs)")
    if not cfg.use_attn_out:
        found.append("use_attn_out=False (V-only heads)")
    return found


def _classic_problems(cfg: ModelConfig) -> list[str]:
    """What LLaMA, GPT-2 and GPT-NeoX all refuse on export."""
    return _block_problems(cfg) + _newer_switches(cfg)


def _sequential(cfg: ModelConfig) -> list[str]:
    return ["parallel_attn_mlp=True"] if cfg.parallel_attn_mlp else []


def _scaled(cfg: ModelConfig) -> list[str]:
    return [] if cfg.scale_scores else ["scale_scores=False"]


def _plain_attention_layernorm(cfg: ModelConfig) -> list[str]:
    """GPT-2's and GPT-NeoX's: multi-head attention with d_head * n_heads == d_model, a plain MLP, layernorm."""
    mha = [] if cfg.kv_heads == cfg.n_heads else [f"n_kv_heads={cfg.kv_heads} (grouped-query attention)"]
    square = [] if cfg.head_dim * cfg.n_heads == cfg.d_model else ["d_head * n_heads != d_model"]
    activation = [] if cfg.mlp in EXPORT_ACTIVATION else [f"mlp={cfg.mlp!r} (needs gelu_new, gelu or relu)"]
    layernorm = [] if cfg.norm == "layernorm" else [f"norm={cfg.norm!r} (needs layernorm)"]
    return mha + square + activation + layernorm


# ---------------------------------------------------------------------------------------- the interface
class Family(ABC):
    name = ""
    model_types: tuple[str, ...] = ()    # config.json's model_type values it reads; the first is its export style
    architectures: tuple[str, ...] = ()  # config.json's architectures that imply it when model_type is absent
    covers: tuple[str, ...] = ()   # the model families it reads, as users name them (default: its name)
    ignore = re.compile(r"$^")  # checkpoint keys that hold buffers, not weights
    unembed_bias = False        # export: the architecture has an unembedding bias (GPT-J)

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

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        """What in cfg this architecture cannot hold (empty: it exports exactly). Only families registered with
        an export_order are asked."""
        raise NotImplementedError(f"{self.name} does not export")

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        """The config.json of an export of cfg; common: the fields every export writes (vocab, dtype, special
        token ids), which the family places (key order is the file's)."""
        raise NotImplementedError(f"{self.name} does not export")

    def _match(self, table: dict[str, Callable[..., list[Piece] | None]], key: str) -> list[Piece] | None:
        if self.ignore.search(key):
            return []
        for pattern, make in table.items():
            m = re.fullmatch(pattern, key)
            if m:
                return make(*m.groups())
        return None


# ---------------------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Registered:
    """A family in the registry. order: its place in the catalogue (the names of `circuitlab import --help`);
    export_order: its place among the export styles (the first that holds a model is the default), None when
    it does not export (export_hf(style=model_types[0]))."""

    family: Family
    order: float
    export_order: float | None = None


_REGISTRY: dict[str, Registered] = {}  # family name -> its entry


def register_family(family: Family, *, order: float, export_order: float | None = None) -> Family:
    """Add `family` to the registry that import (Hugging Face and GGUF) and export read; returns it.

    Each module of circuitlab.pretrained.families calls it once; catalog.py imports every such module. A family
    of one's own (a test's, a plugin's) registers the same way, from anywhere, before the import that reads it.
    """
    if not family.name or not family.model_types:
        raise CircuitlabError(f"a family needs a name and at least one model_type (got {type(family).__name__})")
    taken = {t: r.family.name for r in _REGISTRY.values() if r.family.name != family.name for t in r.family.model_types}
    clash = sorted(set(family.model_types) & set(taken))
    if clash:
        raise CircuitlabError(f"model_type {clash[0]!r} of {family.name} is already read by {taken[clash[0]]}")
    _REGISTRY[family.name] = Registered(family, order, export_order)
    return family


def unregister_family(name: str) -> None:
    """Take the family `name` out of the registry (a test's own family, once the test is done)."""
    _REGISTRY.pop(name, None)


def registered() -> list[Registered]:
    """Every registered family, in catalogue order (what catalog.py reads, after importing every family module)."""
    return sorted(_REGISTRY.values(), key=lambda r: r.order)
