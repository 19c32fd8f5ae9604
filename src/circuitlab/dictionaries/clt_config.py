"""CLTConfig: what a cross-layer transcoder is (architecture, sizes, hooks, base model); see clt.py."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from circuitlab.dictionaries.arch import Architecture, architecture_names, get_architecture
from circuitlab.dictionaries.config import DICTIONARY_DTYPE
from circuitlab.errors import ConfigError, refuse_unknown

# the built-ins a CLT trains with (SAEs and transcoders take every one; Matryoshka's nested prefixes are theirs alone)
CLT_ARCHITECTURES = tuple(n for n in architecture_names() if get_architecture(n).trains_clt)
CLT_FORMAT = "circuitlab-clt-1"
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")


@dataclass
class CLTConfig:
    """A cross-layer transcoder: architecture, sizes, hooks, base model.

    architecture: "jumprelu" (tanh sparsity penalty in training), "topk" / "batchtopk" (k per layer;
        BatchTopK is saved as JumpReLU), "relu" (loading circuit-tracer's ReLU CLTs; trains like JumpReLU
        without a threshold), or one registered with dictionaries.arch.register_architecture.
    n_layers: L, the number of MLP layers it reads and writes (all of the model's, from layer 0).
    d_sae: latents per layer (L · d_sae in all).
    tied: one decoder per source layer, shared by every later layer, instead of one per (source, target).
    skip: a linear skip W_skip^l [d_model, d_model] from each layer's input to its own output.
    input_hook / output_hook: hook name templates with {layer}.
    """

    architecture: str = "jumprelu"
    n_layers: int = 0
    d_model: int = 0
    d_sae: int = 0
    k: int | None = None
    tied: bool = False
    skip: bool = False
    input_hook: str = "blocks.{layer}.ln2.hook_normalized"
    output_hook: str = "blocks.{layer}.hook_mlp_out"
    base_model: dict[str, Any] = field(default_factory=dict)
    normalisation: dict[str, Any] = field(default_factory=lambda: {"method": "none"})
    dtype: str = DICTIONARY_DTYPE
    metadata: dict[str, Any] = field(default_factory=dict)

    kind = "clt"  # what a YAML entry names to get one (`kind: clt`)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def is_int(x: Any) -> TypeGuard[int]:
            return isinstance(x, int) and not isinstance(x, bool)

        arch = get_architecture(self.architecture, "CLT")  # an unknown name: one error naming the closest
        if not arch.trains_clt:
            raise ConfigError(f"a CLT cannot be a {self.architecture} dictionary (it trains SAEs and transcoders); "
                              f"use one of {', '.join(CLT_ARCHITECTURES)}")
        for name in ("n_layers", "d_model", "d_sae"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ConfigError(f"CLTConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if arch.uses_k:
            if not is_int(self.k) or self.k < 1:
                raise ConfigError(f"CLTConfig.k must be a positive int for architecture {self.architecture!r}, got {self.k!r}")
            if self.k > self.d_sae:
                raise ConfigError(f"k={self.k} is larger than d_sae={self.d_sae}; a TopK CLT cannot keep more latents "
                                  "per layer than it has")
        for name in ("input_hook", "output_hook"):
            if not isinstance(getattr(self, name), str) or "{layer}" not in getattr(self, name):
                raise ConfigError(f"CLTConfig.{name} must be a hook name template with {{layer}}, got {getattr(self, name)!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"CLTConfig.dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if not isinstance(self.normalisation, dict) or "method" not in self.normalisation:
            raise ConfigError('CLTConfig.normalisation must be a mapping with a "method"')

    # the fields the trainer and metrics share with DictionaryConfig
    @property
    def n_latents(self) -> int:
        return self.n_layers * self.d_sae

    @property
    def is_transcoder(self) -> bool:
        return True

    @property
    def arch(self) -> Architecture:
        """The architecture (dictionaries/arch/) named by `architecture`."""
        return get_architecture(self.architecture)

    @property
    def hook_name(self) -> str:
        return self.input_hook

    @property
    def out_hook_name(self) -> str:
        return self.output_hook

    def in_hook(self, layer: int) -> str:
        return self.input_hook.format(layer=layer)

    def out_hook(self, layer: int) -> str:
        return self.output_hook.format(layer=layer)

    def hooks(self) -> list[str]:
        """Every hook a CLT reads or writes, layer by layer."""
        return [h for layer in range(self.n_layers) for h in (self.in_hook(layer), self.out_hook(layer))]

    def n_targets(self, source: int) -> int:
        """How many decoder blocks layer `source` has: L - source, or 1 when tied."""
        return 1 if self.tied else self.n_layers - source

    def to_dict(self) -> dict[str, Any]:
        return {"format": CLT_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CLTConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"a CLT config must be a mapping, got {type(data).__name__}")
        data = {k: v for k, v in data.items() if k not in ("format", "kind")}
        refuse_unknown(data, [f.name for f in dataclasses.fields(cls)], "CLT config field(s)")
        return cls(**data)

    def replace(self, **changes: Any) -> "CLTConfig":
        return dataclasses.replace(self, **changes)
