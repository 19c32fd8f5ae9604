"""Architecture: what one dictionary architecture is, for an SAE, a transcoder and a cross-layer transcoder
alike, and the registry that finds one by the name configs and files use ("relu", "topk", ...).

An architecture says how pre-activations become latents (at inference and in training), which (row, latent)
pairs a training step keeps, its sparsity penalty, the form it is saved and used in (BatchTopK: as the
JumpReLU it is), and how the published layouts name it. The modules, the training step and the file
readers and writers ask it instead of testing its name; one file per architecture (relu.py, topk.py, ...)
subclasses it and calls register_architecture.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from circuitlab.errors import ConfigError, did_you_mean


@dataclass
class Coefficients:
    """What a training step's penalties and estimators are scaled by (the trainer sets them each step)."""

    sparsity: float        # l1_coeff (relu) or l0_coeff (jumprelu), after warm-up; unused by the TopK family
    aux: float             # AuxK coefficient
    bandwidth: float       # JumpReLU straight-through kernel width
    threshold_decay: float = 0.99  # BatchTopK: running average of the batch threshold (0 on the first step)


class Architecture:
    """One architecture; subclass it, set `name`, override what differs, register_architecture(cls).

    Shapes: pre [..., d_sae] pre-activations of one layer; threshold [d_sae] (that layer's, when the
    architecture has one) or None; in a training step pre_kept is pre at the kept pairs ([rows, d_sae] with
    the others zeroed, or [nnz] on the sparse path) and threshold / norms are indexed alike.
    """

    name: ClassVar[str] = ""
    uses_k: ClassVar[bool] = False           # keeps k latents per row (the TopK family): its config needs k
    uses_widths: ClassVar[bool] = False      # trains nested prefixes (Matryoshka): its config needs matryoshka_widths
    trains_clt: ClassVar[bool] = True        # a CLT can be trained with it (its step calls no reconstruction_terms)
    has_threshold: ClassVar[bool] = False    # a `threshold` [d_sae] parameter (per layer in a CLT)
    learns_threshold: ClassVar[bool] = False  # the threshold is trained by gradient (else estimated, no gradient)
    coefficient: ClassVar[str] = "l0_coeff"  # the train setting its sparsity coefficient is (DictTrainConfig)
    steers_l0: ClassVar[bool] = False        # its L0 follows that coefficient, so target_l0 can steer it
    saved_as: ClassVar[str | None] = None    # the architecture it is saved and used as at inference (None: itself)
    # How published layouts name it: layout -> its name there (a tuple: every name read, the first written).
    # Layouts: saelens, saelens-transcoder, saelens-skip-transcoder, circuit-tracer (per-layer sets),
    # circuit-tracer-clt, sparsify, gemma-scope, gemma-scope-2, llama-scope.
    formats: ClassVar[dict[str, str | tuple[str, ...]]] = {}
    # Whether the training penalty weights each activation by its decoder's norm (an SAE's; a CLT's): then the
    # decoder's scale is part of what is trained; otherwise decoder rows are held at unit norm after each step
    # and dead latents get AuxK.
    penalty_uses_norms: ClassVar[bool] = False
    clt_penalty_uses_norms: ClassVar[bool] = False

    # ------------------------------------------------------------------ inference
    def activate(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None) -> torch.Tensor:
        """Latents [..., d_sae] of pre-activations [..., d_sae] as the dictionary is used."""
        raise NotImplementedError(f"architecture {self.name!r} defines no activation")

    def jumprelu_threshold(self, threshold: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        """The threshold [d_sae] of the JumpReLU that computes the same latents (the form Gemma Scope and Llama
        Scope files hold), or None when there is none. like: b_enc [d_sae]."""
        return None

    # ------------------------------------------------------------------ training
    def keep(self, pre: torch.Tensor, k: int | None, threshold: torch.Tensor | None, coef: Coefficients,
             replicas: Any = None) -> tuple[Any, torch.Tensor | None]:
        """The (row, latent) pairs of pre [rows, d_sae] (detached) a training step keeps: (Kept, None) or
        (None, a [rows, d_sae] bool mask); the others get no gradient. Default: those above 0."""
        return None, pre > 0

    def train_activate(self, pre_kept: torch.Tensor, threshold: torch.Tensor | None, coef: Coefficients) -> torch.Tensor:
        """Training-time latents of the kept pre-activations (default ReLU; JumpReLU: its straight-through form)."""
        return pre_kept.relu()

    def penalty(self, acts: torch.Tensor, pre_kept: torch.Tensor, threshold: torch.Tensor | None,
                norms: torch.Tensor | None, coef: Coefficients, rows: int) -> torch.Tensor | None:
        """An SAE's or transcoder's sparsity term (a scalar), or None for none. norms: decoder row norms at the
        kept latents (given when penalty_uses_norms)."""
        return None

    def clt_penalty(self, acts: torch.Tensor, pre: torch.Tensor, threshold: torch.Tensor | None,
                    norm: torch.Tensor, layer_norms: torch.Tensor, coef_l: float, coef: Any, rows: int
                    ) -> list[torch.Tensor]:
        """A CLT layer's sparsity terms, added in order: acts and norm at the kept pairs, pre [rows, d_sae] the
        layer's dense pre-activations, threshold and layer_norms [d_sae] the whole layer's, coef_l the layer's
        coefficient, coef the CLTCoefficients (tanh_scale, preact)."""
        return []

    def reconstruction_terms(self, partial: Callable[[int, int], torch.Tensor], base: torch.Tensor, y: torch.Tensor,
                             widths: list[int] | None) -> list[torch.Tensor]:
        """An SAE's or transcoder's loss terms beyond the full reconstruction's MSE (default none; Matryoshka:
        each nested prefix's MSE). partial(lo, hi): the output [rows, d_out] of latents lo..hi-1 alone (the
        training activations through W_dec, with gradients); base [rows, d_out]: the output without latents
        (b_dec, and the skip connection's); y [rows, d_out] the target; widths: the config's matryoshka_widths."""
        return []

    def unit_decoder(self, clt: bool) -> bool:
        """Whether decoder rows are put back to unit norm after each step and dead latents get AuxK."""
        return not (self.clt_penalty_uses_norms if clt else self.penalty_uses_norms)

    def format_name(self, layout: str) -> str | None:
        """Its name in a published layout (written), or None when the layout has no such dictionary."""
        names = self.formats.get(layout)
        return names[0] if isinstance(names, tuple) else names

    def __repr__(self) -> str:
        return f"<architecture {self.name}>"


_REGISTRY: dict[str, Architecture] = {}


def register_architecture(cls: type[Architecture]) -> type[Architecture]:
    """Make cls findable by cls.name (usable as a class decorator); a name registered twice is an error."""
    if not (isinstance(cls, type) and issubclass(cls, Architecture)) or not cls.name:
        raise ConfigError(f"register_architecture takes an Architecture subclass with a name, got {cls!r}")
    if cls.name in _REGISTRY and type(_REGISTRY[cls.name]) is not cls:
        raise ConfigError(f"a dictionary architecture named {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls()
    return cls


def unregister_architecture(name: str) -> None:
    """Forget an architecture registered by a user (a test's toy, say); unknown names pass."""
    _REGISTRY.pop(name, None)


def architecture_names() -> tuple[str, ...]:
    """Every registered architecture's name, in the order registered."""
    return tuple(_REGISTRY)


def find_architecture(name: str) -> Architecture | None:
    """The architecture registered as `name`, or None."""
    return _REGISTRY.get(name) if isinstance(name, str) else None


def get_architecture(name: str, what: str = "dictionary") -> Architecture:
    """The architecture registered as `name`, or one ConfigError naming the closest ones."""
    found = find_architecture(name)
    if found is None:
        raise ConfigError(f"unknown {what} architecture {name!r}{did_you_mean(str(name), _REGISTRY)}; "
                          f"use one of {', '.join(_REGISTRY)}")
    return found


def architecture_in(layout: str, name: str | None) -> Architecture | None:
    """The architecture a published layout calls `name` (any name it reads), or None."""
    for arch in _REGISTRY.values():
        names = arch.formats.get(layout)
        if name is not None and name in (names if isinstance(names, tuple) else (names,)):
            return arch
    return None


def format_names(layout: str) -> list[str]:
    """Every name a published layout has for the registered architectures (for messages)."""
    out: list[str] = []
    for arch in _REGISTRY.values():
        names = arch.formats.get(layout)
        out += list(names) if isinstance(names, tuple) else [names] if names else []
    return out
