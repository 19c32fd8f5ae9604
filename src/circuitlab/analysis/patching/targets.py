"""Patching targets: which hook a sweep patches, per layer, and which axes it sweeps (TARGETS)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuitlab.errors import CircuitlabError, did_you_mean
from circuitlab.model.hooks import act_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass(frozen=True)
class Target:
    """What a patching sweep patches: the hook (short name, per layer), the axes swept after `layer`,
    and the activation dim (batch excluded) each axis indexes."""

    name: str
    hook: str
    axes: tuple[str, ...]
    dims: tuple[int, ...]

    @property
    def pos_dim(self) -> int:
        """The activation dim (batch excluded) holding the (query) position."""
        return 1 if self.hook == "pattern" else 0

    @property
    def pos_axis(self) -> int | None:
        """Which of `axes` is a position, if any: such sweeps run each patch from its position on."""
        return next((i for i, a in enumerate(self.axes) if a in ("pos", "dest_pos")), None)

    @property
    def local(self) -> bool:
        """Whether a patch at position p changes its block's output at p only: true of activations computed
        per position once attention has mixed positions (not of resid_pre, k or v, which later queries read)."""
        return self.pos_axis is not None and self.hook in ("resid_mid", "resid_post", "attn_out", "mlp_out", "z",
                                                           "q", "pattern")


def _targets() -> dict[str, Target]:
    table = {n: Target(n, n, ("pos",), (0,)) for n in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")}
    table["head_out"] = Target("head_out", "z", ("head",), (1,))
    table["head_out_by_pos"] = Target("head_out_by_pos", "z", ("pos", "head"), (0, 1))
    for x in ("q", "k", "v"):
        table[x] = Target(x, x, ("head",), (1,))
        table[f"{x}_by_pos"] = Target(f"{x}_by_pos", x, ("pos", "head"), (0, 1))
    table["pattern"] = Target("pattern", "pattern", ("head",), (0,))
    table["pattern_by_pos"] = Target("pattern_by_pos", "pattern", ("head", "dest_pos"), (0, 1))
    return table


TARGETS = _targets()
DEFAULT_TARGETS = ("resid_pre", "attn_out", "mlp_out", "head_out", "head_out_by_pos")


def get_target(model: Transformer, name: str) -> Target:
    """The Target called `name`, checked against the model's hooks (an attention-only model has no mlp_out)."""
    if name not in TARGETS:
        hint = did_you_mean(name, TARGETS, n=3)
        raise CircuitlabError(f"unknown patching target {name!r}{hint}; valid targets: {', '.join(TARGETS)}")
    target = TARGETS[name]
    if model.cfg.n_layers == 0:
        raise CircuitlabError("this model has no layers, so there is nothing to patch")
    hook = act_name(target.hook, 0)
    if hook not in model.hook_points():
        why = "it is attention-only" if model.cfg.attn_only else "its attention and MLP run in parallel"
        raise CircuitlabError(f"target {name!r} patches {hook.replace('.0.', '.{l}.')}, which this model "
                              f"does not have ({why}); available targets: {', '.join(available_targets(model))}")
    return target


def default_targets(model: Transformer) -> list[str]:
    """DEFAULT_TARGETS that the model has hooks for."""
    return [t for t in DEFAULT_TARGETS if t in available_targets(model)]


def available_targets(model: Transformer) -> list[str]:
    """Names of the targets this model has hooks for."""
    points = model.hook_points()
    return [n for n, t in TARGETS.items() if model.cfg.n_layers and act_name(t.hook, 0) in points]
