"""ModelConfig: one dataclass whose switches cover attention-only, GPT-2 and LLaMA-style models.

    from circuitlab import ModelConfig
    cfg = ModelConfig.from_preset("attn-only-2l", d_vocab=1000)
    cfg = ModelConfig.load("config.json")   # or .yaml
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from circuitlab.atomic import json_text
from circuitlab.errors import ConfigError, did_you_mean, refuse_unknown
from circuitlab.textfile import read_text

NORMS = ("layernorm", "rmsnorm", "none")
POSITIONALS = ("learned", "rotary", "none")
MLPS = ("gelu", "gelu_new", "relu", "swiglu", "geglu")
BLOCK_NORMS = ("pre", "sandwich", "post")
QK_NORMS = ("none", "head", "full")


@dataclass
class ModelConfig:
    """Architecture of a Transformer. Every switch is a plain field; see presets() for named setups.

    d_head defaults to d_model // n_heads (then d_model must be divisible by n_heads);
    n_kv_heads defaults to n_heads (plain multi-head attention; fewer = grouped-query attention);
    d_mlp defaults to 4 * d_model (ignored when attn_only).
    """

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_vocab: int = 512
    n_ctx: int = 128
    d_head: int | None = None
    n_kv_heads: int | None = None
    d_mlp: int | None = None
    attn_only: bool = False
    norm: str = "layernorm"          # layernorm | rmsnorm | none
    norm_eps: float = 1e-5
    positional: str = "learned"      # learned | rotary | none
    rotary_base: float = 10000.0
    rotary_dim: int | None = None    # rotate only the first rotary_dim dims of each head (None = all)
    # Rotary frequency scaling as in HF configs: {"type": "linear", "factor": f} or {"type": "llama3",
    # "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}; None = plain.
    rope_scaling: dict | None = None
    mlp: str = "gelu"                # gelu | gelu_new (tanh approx., GPT-2) | relu | swiglu | geglu (tanh GELU gate)
    bias: bool = True
    tied_embeddings: bool = False
    use_attn_out: bool = True        # False: "V-only" heads, z written straight into the residual (d_head == d_model)
    scale_scores: bool = True        # divide attention scores by sqrt(d_head); hand-built models turn it off
    parallel_attn_mlp: bool = False  # GPT-NeoX style: attn and MLP both read resid_pre
    # The switches of the newer families (Gemma-2/3, Qwen3, OLMo-2, Phi-3, GPT-J); defaults = off.
    block_norms: str = "pre"         # pre (ln1, ln2) | sandwich (also ln1_post, ln2_post on each sublayer's
                                     # output, Gemma) | post (ln1_post, ln2_post only, OLMo-2)
    qk_norm: str = "none"            # none | head (RMSNorm over d_head, Qwen3/Gemma-3) | full (over all heads, OLMo-2)
    embed_scale: float = 1.0         # token embeddings times this (Gemma: sqrt(d_model))
    attn_scale: float | None = None  # scores divided by this (None: sqrt(d_head); Gemma: sqrt(query_pre_attn_scalar))
    attn_softcap: float | None = None   # scores -> c * tanh(scores / c) before the mask (Gemma-2)
    logit_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma-2)
    sliding_window: int | None = None   # a query attends only its last `sliding_window` keys (itself included) ...
    sliding_layers: list | None = None  # ... in these layers (None: every layer)
    local_rotary_base: float | None = None  # rotary base of the sliding layers, unscaled (Gemma-3); None: rotary_base
    rotary_interleaved: bool = False    # rotate adjacent pairs (GPT-J) instead of the two halves (NeoX/LLaMA)
    init_std: float = 0.02
    scale_out_init: bool = False     # scale output projections' init by 1/sqrt(2 * n_layers)
    name: str = ""

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def mlp_dim(self) -> int:
        return self.d_mlp if self.d_mlp is not None else 4 * self.d_model

    @property
    def rot_dim(self) -> int:
        return self.rotary_dim if self.rotary_dim is not None else self.head_dim

    @property
    def has_mlp(self) -> bool:
        return not self.attn_only

    def mlp_input_hook(self, layer: int | str) -> str:
        """The hook holding what layer's MLP reads (a transcoder's default input): its pre-norm's output
        (ln2.hook_normalized, before the norm's gain); with no norm before the MLP (OLMo-2's post-norms, or no norms) the stream it reads,
        hook_resid_mid, or hook_resid_pre where attention and MLP run in parallel. `layer` may be "{layer}"."""
        if self.block_norms != "post" and self.norm != "none":
            return f"blocks.{layer}.ln2.hook_normalized"
        return f"blocks.{layer}.hook_resid_pre" if self.parallel_attn_mlp else f"blocks.{layer}.hook_resid_mid"

    # ------------------------------------------------------------------ what analyses assume (model/assumptions.py)
    # A new switch that breaks one of these must turn it off here; analyses relying on it then refuse the model.
    @property
    def is_pre_norm(self) -> bool:
        """Every norm reads a block's input (ln1, ln2) or the final stream (ln_final): none after
        attention or the MLP (block_norms "sandwich" / "post" add them)."""
        return self.block_norms == "pre"

    @property
    def additive_heads(self) -> bool:
        """Each head's output z @ W_O adds straight into the residual stream: the heads' sum + b_O is attn_out
        and resid_mid = resid_pre + attn_out."""
        return self.is_pre_norm

    @property
    def linear_readout(self) -> bool:
        """The logits are the final norm then W_U, b_U: nothing after the unembedding (no logit soft-cap)."""
        return self.logit_softcap is None

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ConfigError naming the field and the rule it breaks."""
        for f in fields(self):
            value = getattr(self, f.name)
            expected = _FIELD_TYPES[f.name]
            if value is None and "None" in f.type:
                continue
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, f.name, float(value))
                continue
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ConfigError(
                    f"ModelConfig.{f.name} must be {expected.__name__}, got {type(value).__name__} {value!r}"
                )
        for name in ("d_model", "n_heads", "d_vocab", "n_ctx", "d_head", "n_kv_heads", "d_mlp", "rotary_dim"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"ModelConfig.{name} must be positive, got {value}")
        if self.n_layers < 0:
            raise ConfigError(f"ModelConfig.n_layers must be >= 0, got {self.n_layers}")
        for name, value in (("norm_eps", self.norm_eps), ("rotary_base", self.rotary_base), ("init_std", self.init_std)):
            if value <= 0:
                raise ConfigError(f"ModelConfig.{name} must be positive, got {value}")
        if self.d_head is None and self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                "or set d_head explicitly"
            )
        if self.n_heads % self.kv_heads != 0:
            raise ConfigError(
                f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})"
            )
        _check_choice("norm", self.norm, NORMS)
        _check_choice("positional", self.positional, POSITIONALS)
        _check_choice("mlp", self.mlp, MLPS)
        if self.positional == "rotary" and (self.rot_dim > self.head_dim or self.rot_dim % 2):
            raise ConfigError(
                f"ModelConfig.rotary_dim ({self.rot_dim}) must be even and at most d_head ({self.head_dim})"
            )
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)
            if self.rope_scaling["type"] == "longrope" and any(
                    len(self.rope_scaling[k]) != self.rot_dim // 2 for k in _LIST_KEYS):
                raise ConfigError(f"ModelConfig.rope_scaling longrope factors need one entry per rotated pair "
                                  f"({self.rot_dim // 2})")
        if not self.use_attn_out and self.head_dim != self.d_model:
            raise ConfigError(
                f"ModelConfig.use_attn_out=False (V-only heads) needs d_head == d_model, "
                f"got d_head {self.head_dim}, d_model {self.d_model}"
            )
        if self.parallel_attn_mlp and self.attn_only:
            raise ConfigError("ModelConfig.parallel_attn_mlp needs an MLP; it cannot be set with attn_only=True")
        _check_choice("block_norms", self.block_norms, BLOCK_NORMS)
        _check_choice("qk_norm", self.qk_norm, QK_NORMS)
        if self.norm == "none" and (self.block_norms != "pre" or self.qk_norm != "none"):
            raise ConfigError("ModelConfig.block_norms / qk_norm need a norm kind; they cannot be set with norm='none'")
        if self.parallel_attn_mlp and self.block_norms != "pre":
            raise ConfigError("ModelConfig.parallel_attn_mlp needs block_norms='pre'")
        for name in ("embed_scale", "attn_scale", "attn_softcap", "logit_softcap", "local_rotary_base",
                     "sliding_window"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"ModelConfig.{name} must be positive, got {value}")
        if self.sliding_layers is not None:
            if self.sliding_window is None:
                raise ConfigError("ModelConfig.sliding_layers needs sliding_window")
            bad = [i for i in self.sliding_layers
                   if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers]
            if bad or len(set(self.sliding_layers)) != len(self.sliding_layers):
                raise ConfigError(f"ModelConfig.sliding_layers must list distinct layer indices in "
                                  f"[0, {self.n_layers}), got {self.sliding_layers}")
        if self.local_rotary_base is not None and (self.positional != "rotary" or self.sliding_window is None):
            raise ConfigError("ModelConfig.local_rotary_base needs rotary positions and sliding_window")

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends through the sliding window."""
        return self.sliding_window is not None and (self.sliding_layers is None or layer in self.sliding_layers)

    @property
    def score_scale(self) -> float:
        """What attention scores are multiplied by: 1 / attn_scale, 1 / sqrt(d_head), or 1 (scale_scores=False)."""
        if not self.scale_scores:
            return 1.0
        return 1.0 / (self.attn_scale if self.attn_scale is not None else math.sqrt(self.head_dim))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"a model config must be a mapping of fields, got {type(data).__name__}")
        refuse_unknown(data, _FIELD_TYPES, "ModelConfig field(s)")
        return cls(**data)

    def to_json(self) -> str:
        return json_text(self.to_dict(), indent=2)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        text = self.to_yaml() if path.suffix in (".yaml", ".yml") else self.to_json()
        path.write_text(text)

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"model config file not found: {path}")
        text = read_text(path, "model config file")
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as e:  # noqa: BLE001 - any parse error is the user's file
            raise ConfigError(f"could not parse model config {path}: {e}") from None
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> "ModelConfig":
        return self.from_dict({**self.to_dict(), **changes})

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        table = presets()
        if name not in table:
            hint = did_you_mean(name, table, n=3)
            raise ConfigError(f"unknown model preset {name!r}{hint}; valid presets: {', '.join(table)}")
        return cls.from_dict({**table[name], "name": name, **overrides})


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"ModelConfig.{name} must be one of {', '.join(choices)}; got {value!r}")


ROPE_SCALING_KEYS = {"linear": ("factor",),
                     "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                     # Phi-3's LongRoPE: per-frequency factors, the short ones up to the original context and the long
                     # ones for sequences longer than it; cos and sin times attention_factor
                     "longrope": ("short_factor", "long_factor", "original_max_position_embeddings",
                                  "attention_factor")}
_LIST_KEYS = ("short_factor", "long_factor")


def _check_rope_scaling(scaling: dict) -> None:
    kind = scaling.get("type")
    if kind not in ROPE_SCALING_KEYS:
        raise ConfigError(f"ModelConfig.rope_scaling['type'] must be one of {', '.join(ROPE_SCALING_KEYS)}; "
                          f"got {kind!r}")
    wanted = set(ROPE_SCALING_KEYS[kind])
    if set(scaling) - {"type"} != wanted:
        raise ConfigError(f"ModelConfig.rope_scaling of type {kind!r} needs exactly the keys type, "
                          f"{', '.join(sorted(wanted))}; got {', '.join(sorted(scaling))}")
    for key in wanted:
        value = scaling[key]
        if key in _LIST_KEYS:
            if not isinstance(value, list) or not value or any(
                    isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in value):
                raise ConfigError(f"ModelConfig.rope_scaling[{key!r}] must be a list of positive numbers")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"ModelConfig.rope_scaling[{key!r}] must be a positive number, got {value!r}")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ConfigError("ModelConfig.rope_scaling: high_freq_factor must be above low_freq_factor")


_TYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict, "list": list}
_FIELD_TYPES: dict[str, type] = {f.name: _TYPE_NAMES[f.type.split(" |")[0]] for f in fields(ModelConfig)}


def _attn_only(n_layers: int) -> dict[str, Any]:
    # The Mathematical Framework models: attention only, no MLP, no norm, learned positions.
    return dict(n_layers=n_layers, d_model=128, n_heads=4, n_ctx=128, attn_only=True, norm="none",
                positional="learned", bias=False)


def _llama(n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_mlp: int, n_ctx: int) -> dict[str, Any]:
    return dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_mlp=d_mlp,
                n_ctx=n_ctx, d_vocab=4096, norm="rmsnorm", norm_eps=1e-6, positional="rotary", mlp="swiglu",
                bias=False, tied_embeddings=False, scale_out_init=True)


def presets() -> dict[str, dict[str, Any]]:
    """Named configs. Non-embedding sizes: quick ≈ 4.4M, small ≈ 50M, medium ≈ 126M."""
    table: dict[str, dict[str, Any]] = {f"attn-only-{n}l": _attn_only(n) for n in (0, 1, 2, 3, 8)}
    table["gpt2-tiny"] = dict(n_layers=2, d_model=128, n_heads=4, d_mlp=512, n_ctx=128, norm="layernorm",
                              positional="learned", mlp="gelu_new", bias=True, tied_embeddings=True,
                              scale_out_init=True)
    table["llama-tiny"] = _llama(2, 128, 4, 2, 352, 128) | {"d_vocab": 512}
    table["quick"] = _llama(6, 256, 4, 2, 704, 256)
    table["small"] = _llama(8, 768, 12, 4, 2048, 512)
    table["medium"] = _llama(12, 1024, 16, 4, 2560, 1024)
    return table
