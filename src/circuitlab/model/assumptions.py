"""What an analysis assumes about the architecture, stated once and refused in one line.

    require(model, "direct logit attribution", "additive_heads", "linear_readout")

Each assumption is a ModelConfig property (config.py), so a family switch that breaks it (a post-norm,
a logit soft-cap, rotary positions) turns it off in one place and every analysis relying on it refuses
such a model with a ConfigError instead of returning numbers that are silently wrong.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from circuitlab.config import ModelConfig
from circuitlab.errors import ConfigError

if TYPE_CHECKING:
    from circuitlab.model.transformer import Transformer

# name -> (holds for a config, what it means, what the model has instead)
ASSUMPTIONS: dict[str, tuple[Callable[[ModelConfig], bool], str, Callable[[ModelConfig], str]]] = {
    "pre_norm": (lambda c: c.is_pre_norm, "pre-norm blocks (each norm reads a block's input)",
                 lambda c: f"{c.block_norms} norms (after attention and the MLP)"),
    "additive_heads": (lambda c: c.additive_heads, "heads whose outputs add straight into the residual stream",
                       lambda c: f"{c.block_norms} norms between the heads and the residual stream"),
    "linear_readout": (lambda c: c.linear_readout, "logits that are the final norm then W_U",
                       lambda c: f"a logit soft-cap ({c.logit_softcap}) after the unembedding"),
    "learned_positions": (lambda c: c.positional == "learned", "learned position embeddings (W_pos)",
                          lambda c: f"{c.positional!r} positions"),
    "norms": (lambda c: c.norm != "none", "normalisation layers", lambda c: "no norms"),
}


def unmet(model_or_cfg: Transformer | ModelConfig, *needs: str) -> list[str]:
    """The assumptions among `needs` (names of ASSUMPTIONS) that this model or config breaks."""
    cfg = model_or_cfg if isinstance(model_or_cfg, ModelConfig) else model_or_cfg.cfg
    unknown = [n for n in needs if n not in ASSUMPTIONS]
    if unknown:
        raise ValueError(f"unknown architecture assumption {unknown[0]!r}; known: {', '.join(ASSUMPTIONS)}")
    return [n for n in needs if not ASSUMPTIONS[n][0](cfg)]


def why_not(model_or_cfg: Transformer | ModelConfig, what: str, *needs: str) -> str | None:
    """The one sentence saying which assumption of `what` this model breaks, or None when it holds them all."""
    broken = unmet(model_or_cfg, *needs)
    if not broken:
        return None
    cfg = model_or_cfg if isinstance(model_or_cfg, ModelConfig) else model_or_cfg.cfg
    name = f" {cfg.name!r}" if cfg.name else ""
    return f"{what} assumes {ASSUMPTIONS[broken[0]][1]}; this model{name} has {ASSUMPTIONS[broken[0]][2](cfg)}"


def require(model_or_cfg: Transformer | ModelConfig, what: str, *needs: str) -> None:
    """Raise a one-line ConfigError when the model (or its config) breaks an assumption `what` relies on."""
    reason = why_not(model_or_cfg, what, *needs)
    if reason:
        raise ConfigError(reason)
