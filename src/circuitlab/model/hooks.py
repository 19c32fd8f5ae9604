"""Hook points, the hooks() context, and ActivationCache.

A HookPoint is an identity module placed on every activation worth reading. Hook functions
have the signature ``fn(tensor, hook) -> tensor | None``; returning a tensor replaces the
activation (that is how patching works). Backward hooks get the gradient of the activation.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, ItemsView, Iterator, KeysView, Sequence, ValuesView
from typing import Any, Union

import torch
from torch import nn

from circuitlab.errors import CircuitlabError, did_you_mean

HookFn = Callable[[torch.Tensor, "HookPoint"], Union[torch.Tensor, None]]
NameOrFilter = Union[str, Callable[[str], bool]]


class HookError(CircuitlabError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class HookPoint(nn.Module):
    """Identity on a tensor, unless hooks are attached. ``name`` is the full dotted name."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""
        self.fwd_fns: list[HookFn] = []
        self.bwd_fns: list[HookFn] = []

    @property
    def active(self) -> bool:
        return bool(self.fwd_fns or self.bwd_fns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self.fwd_fns:
            out = fn(x, self)
            if out is not None:
                if out.shape != x.shape:
                    raise CircuitlabError(
                        f"hook on {self.name} returned shape {tuple(out.shape)}, expected {tuple(x.shape)}"
                    )
                x = out
        if self.bwd_fns and x.requires_grad:
            fns = list(self.bwd_fns)

            def on_grad(grad: torch.Tensor) -> torch.Tensor:
                for fn in fns:
                    out = fn(grad, self)
                    if out is not None:
                        grad = out
                return grad

            x.register_hook(on_grad)
        return x

    def extra_repr(self) -> str:
        return self.name


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """All hook points of a model by full name, in forward order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}


def name_hook_points(model: nn.Module) -> None:
    for name, hp in hook_points(model).items():
        hp.name = name


def resolve(points: dict[str, HookPoint], name_or_filter: NameOrFilter) -> list[HookPoint]:
    """The hook points a name or a filter refers to; an unknown name lists the closest ones."""
    if callable(name_or_filter):
        return [hp for name, hp in points.items() if name_or_filter(name)]
    if name_or_filter in points:
        return [points[name_or_filter]]
    hint = did_you_mean(name_or_filter, points, n=3, cutoff=0.4)
    raise HookError(f"unknown hook name {name_or_filter!r}{hint} (model.hook_names() lists all)")


@contextlib.contextmanager
def attach(
    model: nn.Module,
    fwd_hooks: Sequence[tuple[NameOrFilter, HookFn]] = (),
    bwd_hooks: Sequence[tuple[NameOrFilter, HookFn]] = (),
) -> Iterator[nn.Module]:
    """Attach hooks for the duration of the block; they are removed even when the body raises."""
    points = hook_points(model)
    added: list[tuple[list[HookFn], HookFn]] = []
    try:
        for hooks, kind in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
            for target, fn in hooks:
                for hp in resolve(points, target):
                    fns = hp.fwd_fns if kind == "fwd" else hp.bwd_fns
                    fns.append(fn)
                    added.append((fns, fn))
        yield model
    finally:
        for fns, fn in reversed(added):
            fns.remove(fn)


# ---------------------------------------------------------------------------- cache

# Short names usable as cache["pattern", 0]; the value is the full-name template.
_SHORT = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "resid_mid": "blocks.{l}.hook_resid_mid",
    "resid_post": "blocks.{l}.hook_resid_post",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "q": "blocks.{l}.attn.hook_q",
    "k": "blocks.{l}.attn.hook_k",
    "v": "blocks.{l}.attn.hook_v",
    "rot_q": "blocks.{l}.attn.hook_rot_q",
    "rot_k": "blocks.{l}.attn.hook_rot_k",
    "z": "blocks.{l}.attn.hook_z",
    "result": "blocks.{l}.attn.hook_result",
    "attn_scores": "blocks.{l}.attn.hook_attn_scores",
    "scores": "blocks.{l}.attn.hook_attn_scores",
    "pattern": "blocks.{l}.attn.hook_pattern",
    "attn": "blocks.{l}.attn.hook_pattern",
    "pre": "blocks.{l}.mlp.hook_pre",
    "pre_linear": "blocks.{l}.mlp.hook_pre_linear",
    "post": "blocks.{l}.mlp.hook_post",
}


def act_name(name: str, layer: int | None = None, sub: str | None = None) -> str:
    """Full hook name from a short one: act_name("pattern", 0) == "blocks.0.attn.hook_pattern".

    Norm hooks: act_name("scale", 0, "ln1"), act_name("normalized", None, "ln_final").
    A full name is returned unchanged.
    """
    if "." in name or (name.startswith("hook_") and layer is None):
        return name
    if name in ("scale", "normalized"):
        if sub is None:
            sub = "ln_final" if layer is None else "ln1"
        prefix = f"blocks.{layer}.{sub}" if layer is not None else sub
        return f"{prefix}.hook_{name}"
    if name not in _SHORT:
        hint = did_you_mean(name, _SHORT, n=3)
        raise HookError(f"unknown activation short name {name!r}{hint}")
    template = _SHORT[name]
    if "{l}" in template:
        if layer is None:
            raise HookError(f"activation {name!r} needs a layer index, e.g. cache[{name!r}, 0]")
        return template.format(l=layer)
    return template


class ActivationCache:
    """Activations from one forward pass, by full hook name (dict-like).

    ``cache["blocks.0.attn.hook_pattern"]`` or the shorthand ``cache["pattern", 0]``
    (``cache["scale", 1, "ln2"]`` for norms). Gradients, when cached, live in ``cache.grads``.
    """

    def __init__(self, acts: dict[str, torch.Tensor], grads: dict[str, torch.Tensor] | None = None,
                 model: nn.Module | None = None) -> None:
        self.acts = acts
        self.grads = grads or {}
        self.model = model

    def _key(self, key: Any) -> str:
        if isinstance(key, tuple):
            name = act_name(*key)
        else:
            name = act_name(key)
        if name not in self.acts:
            hint = did_you_mean(name, self.acts, n=3, cutoff=0.4)
            raise HookError(f"{name!r} is not in the cache{hint}")
        return name

    def __getitem__(self, key: Any) -> torch.Tensor:
        return self.acts[self._key(key)]

    def __contains__(self, key: Any) -> bool:
        try:
            self._key(key)
        except HookError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.acts)

    def __len__(self) -> int:
        return len(self.acts)

    def keys(self) -> KeysView[str]:
        return self.acts.keys()

    def values(self) -> ValuesView[torch.Tensor]:
        return self.acts.values()

    def items(self) -> ItemsView[str, torch.Tensor]:
        return self.acts.items()

    def to(self, device: str | torch.device) -> "ActivationCache":
        return ActivationCache({k: v.to(device) for k, v in self.acts.items()},
                               {k: v.to(device) for k, v in self.grads.items()}, self.model)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self.acts)} activations, {len(self.grads)} gradients)"
