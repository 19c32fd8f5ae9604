"""DictionaryConfig: what a sparse dictionary (SAE or transcoder) is, and what it was trained on.

    cfg = DictionaryConfig("topk", d_in=128, d_sae=1024, k=32, hook_name="blocks.0.hook_resid_post")
    tc  = DictionaryConfig("relu", d_in=128, d_sae=1024, hook_name="blocks.0.ln2.hook_normalized",
                           out_hook_name="blocks.0.hook_mlp_out", skip=True)     # a transcoder
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeGuard

from circuitlab.dictionaries.arch import Architecture, architecture_names, get_architecture
from circuitlab.errors import ConfigError, refuse_unknown

DICTIONARY_DTYPE = "float32"   # a dictionary's weights, unless its config says otherwise

# The built-in architectures (dictionaries/arch/; more may be registered: arch.architecture_names()).
# "batchtopk" trains with a batch-level top-k and is saved for inference as "jumprelu" with its threshold.
ARCHITECTURES = architecture_names()
FORMAT = "circuitlab-dictionary-1"


@dataclass
class DictionaryConfig:
    """A sparse dictionary: architecture, sizes, the hooks it reads and writes, its base model.

    architecture: "relu" (ReLU + decoder-norm-weighted L1), "topk", "batchtopk", "jumprelu", or one registered
        with dictionaries.arch.register_architecture (`arch` is its Architecture object).
    d_in / d_out: input and output widths (d_out defaults to d_in; differs for some transcoders).
    hook_name: the hook it reads (activations flattened to [..., d_in], e.g. hook_z's heads joined).
    out_hook_name: None for an SAE (it reconstructs hook_name); the hook a transcoder predicts.
    k: active latents per token for the TopK family (BatchTopK: the batch average).
    matryoshka_widths: matryoshka_batchtopk's nested prefixes, strictly increasing widths m_1 < ... < d_sae (d_sae
        is appended when the last is smaller, as SAELens does); None for every other architecture.
    skip: a transcoder's linear skip connection W_skip [d_in, d_out].
    base_model: what identifies the model it was trained on (see dictionaries.base_model_id).
    normalisation: how inputs were scaled in training ({"method": "none"} or
        {"method": "expected_norm", "in_scale": s, "out_scale": s_out, "folded": True}); a saved
        dictionary has the scale folded into its weights, so it takes raw activations.
    apply_b_dec_to_input: whether the encoder reads x − b_dec (SAELens's SAEs) or x (Gemma Scope, Llama
        Scope); default True for an SAE, False for a transcoder (whose b_dec lives in its output space).
    """

    architecture: str = "relu"
    d_in: int = 0
    d_sae: int = 0
    hook_name: str = ""
    out_hook_name: str | None = None
    d_out: int | None = None
    k: int | None = None
    matryoshka_widths: list[int] | None = None
    skip: bool = False
    base_model: dict[str, Any] = field(default_factory=dict)
    normalisation: dict[str, Any] = field(default_factory=lambda: {"method": "none"})
    dtype: str = DICTIONARY_DTYPE
    metadata: dict[str, Any] = field(default_factory=dict)  # free-form: training summary, source...
    apply_b_dec_to_input: bool | None = None

    def __post_init__(self) -> None:
        if self.d_out is None:
            self.d_out = self.d_in
        if self.apply_b_dec_to_input is None:  # SAELens's convention for an SAE; a transcoder's b_dec is an output
            self.apply_b_dec_to_input = not self.is_transcoder
        self.validate()

    @property
    def n_latents(self) -> int:
        """Latents in all (a CLT has d_sae per layer)."""
        return self.d_sae

    @property
    def is_transcoder(self) -> bool:
        return self.out_hook_name is not None

    @property
    def arch(self) -> Architecture:
        """The architecture (dictionaries/arch/) named by `architecture`."""
        return get_architecture(self.architecture)

    def validate(self) -> None:
        def bad(name: str, want: str) -> NoReturn:
            raise ConfigError(f"DictionaryConfig.{name} must be {want}, got {getattr(self, name)!r}")

        def is_int(x: Any) -> TypeGuard[int]:
            return isinstance(x, int) and not isinstance(x, bool)

        arch = get_architecture(self.architecture)  # an unknown name: one error naming the closest
        for name in ("d_in", "d_sae", "d_out"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad(name, "a positive int")
        if arch.uses_k:
            if not is_int(self.k) or self.k < 1:
                bad("k", f"a positive int for architecture {self.architecture!r}")
            if self.k > self.d_sae:
                raise ConfigError(f"k={self.k} is larger than d_sae={self.d_sae}; "
                                  "a TopK dictionary cannot keep more latents than it has")
        self._check_widths(arch)
        if not isinstance(self.hook_name, str):
            bad("hook_name", "a hook name string")
        if self.skip and not self.is_transcoder:
            raise ConfigError("skip=True needs a transcoder (set out_hook_name); an SAE has no skip connection")
        if self.apply_b_dec_to_input not in (True, False):
            bad("apply_b_dec_to_input", "true or false")
        if self.apply_b_dec_to_input and self.is_transcoder:
            raise ConfigError("apply_b_dec_to_input=True needs an SAE: a transcoder's b_dec lives in its output space")
        if self.d_out != self.d_in and not self.is_transcoder:
            raise ConfigError(f"an SAE reconstructs its input: d_out ({self.d_out}) must equal d_in ({self.d_in})")
        if self.dtype not in ("float32", "float64", "bfloat16", "float16"):
            bad("dtype", '"float32", "float64", "bfloat16" or "float16"')
        if not isinstance(self.normalisation, dict) or "method" not in self.normalisation:
            bad("normalisation", 'a mapping with a "method"')

    def _check_widths(self, arch: Architecture) -> None:
        """matryoshka_widths: given exactly when the architecture trains nested prefixes, strictly increasing
        positive ints up to d_sae (d_sae appended when the last is smaller)."""
        widths = self.matryoshka_widths
        if not arch.uses_widths:
            if widths is not None:
                raise ConfigError(f"DictionaryConfig.matryoshka_widths is for an architecture that trains nested "
                                  f"prefixes (matryoshka_batchtopk); {self.architecture!r} has none: drop it")
            return
        example = [max(self.d_sae // 16, 1), max(self.d_sae // 4, 1), self.d_sae] if isinstance(self.d_sae, int) else []
        if (not isinstance(widths, (list, tuple)) or not widths
                or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths)):
            raise ConfigError(f"DictionaryConfig.matryoshka_widths must be a list of positive ints for architecture "
                              f"{self.architecture!r} (its nested prefixes, e.g. {example}), got {widths!r}")
        widths = [int(w) for w in widths]
        if any(b <= a for a, b in zip(widths, widths[1:])):
            raise ConfigError(f"DictionaryConfig.matryoshka_widths must be strictly increasing, got {widths}")
        if widths[-1] > self.d_sae:
            raise ConfigError(f"DictionaryConfig.matryoshka_widths ends at {widths[-1]}, more than d_sae={self.d_sae}")
        self.matryoshka_widths = widths if widths[-1] == self.d_sae else [*widths, self.d_sae]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DictionaryConfig":
        """Build from a dict (JSON or a YAML section); unknown keys raise ConfigError with a hint."""
        if not isinstance(data, dict):
            raise ConfigError(f"a dictionary config must be a mapping, got {type(data).__name__}")
        data = {k: v for k, v in data.items() if k != "format"}
        refuse_unknown(data, [f.name for f in dataclasses.fields(cls)], "dictionary config field(s)")
        return cls(**data)

    def replace(self, **changes: Any) -> "DictionaryConfig":
        return dataclasses.replace(self, **changes)
