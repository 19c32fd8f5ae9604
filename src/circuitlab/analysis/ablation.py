"""Ablations: remove a component and see what breaks.

A component is named by a short string:

    "L1H3"     attention head 3 of layer 1 (its output, through hook_z)
    "L1.attn"  the whole attention layer 1 (hook_attn_out, biases included)
    "L1.mlp"   MLP layer 1 (hook_mlp_out)
    "L1"       block 1: its attention and its MLP
    "L1N42"    MLP neuron 42 of layer 1 (hook_post[..., 42])

Methods: "zero" sets the activation to 0; "mean" sets it to its mean over a reference dataset
(over sequences and positions, so any prompt length works); "mean_by_pos" to its mean over the reference
sequences at each position (Wang et al.'s mean over a same-template dataset: the reference needs the input's
number of positions); "resample" sets it to its value on
another input: row b of the ablated batch takes row b of the reference batch, which must then have
the same number of positions (shuffle the reference to resample at random).

    logits = run_ablated(model, tokens, ["L1H0", "L1H3"], "mean", reference=ref)
    res = ablate_and_measure(model, tokens, next_token_loss(tokens), "head", "mean", reference=ref)
    res.change()   # [layer, head]: loss with that head ablated minus the loss without ablation

ablate_and_measure puts the ablations in the batch dimension, like activation patching.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.patching import (BaseRun, Metric, Site, as_tokens, check_layers, check_metric,
                                          grid_index, metric_value, rounded, sweep)
from circuitlab.errors import CircuitlabError
from circuitlab.model.hooks import act_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

METHODS = ("zero", "mean", "mean_by_pos", "resample")
KINDS = ("head", "attn", "mlp", "layer", "neuron")
_SPEC = re.compile(r"^L(\d+)(?:H(\d+)|N(\d+)|\.(attn|mlp))?$")


@dataclass(frozen=True)
class Component:
    """One ablatable component: kind in KINDS, its layer, and the head or neuron index (else None)."""

    kind: str
    layer: int
    index: int | None = None

    def __str__(self) -> str:
        suffix = {"head": f"H{self.index}", "neuron": f"N{self.index}", "attn": ".attn", "mlp": ".mlp",
                  "layer": ""}[self.kind]
        return f"L{self.layer}{suffix}"

    def sites(self, has_mlp: bool = True) -> list[tuple[str, int | None]]:
        """(short hook name, head index into z [batch, pos, head, d_head] or neuron index into
        post [batch, pos, d_mlp], or None for the whole activation). A block without an MLP is its attention."""
        whole: list[tuple[str, int | None]] = [("attn_out", None)]
        block = whole + ([("mlp_out", None)] if has_mlp else [])
        parts: dict[str, list[tuple[str, int | None]]] = {"head": [("z", self.index)], "neuron": [("post", self.index)],
                                                          "attn": whole, "mlp": [("mlp_out", None)], "layer": block}
        return parts[self.kind]


def parse_component(model: Transformer, spec: str | Component) -> Component:
    """A Component from "L1H3", "L1.attn", "L1.mlp", "L1" or "L1N42", checked against the model."""
    if isinstance(spec, Component):
        comp = spec
    else:
        m = _SPEC.match(str(spec).strip())
        if not m:
            raise CircuitlabError(f"cannot read component {spec!r}: write L<layer>H<head>, L<layer>.attn, "
                                  "L<layer>.mlp, L<layer> or L<layer>N<neuron>, e.g. L1H3")
        layer, head, neuron, part = m.groups()
        kind = "head" if head else "neuron" if neuron else part or "layer"
        comp = Component(kind, int(layer), int(head or neuron) if (head or neuron) else None)
    cfg = model.cfg
    if not 0 <= comp.layer < cfg.n_layers:
        raise CircuitlabError(f"component {comp}: layer {comp.layer} out of range (the model has {cfg.n_layers})")
    if comp.kind in ("mlp", "neuron") and not cfg.has_mlp:
        raise CircuitlabError(f"component {comp}: this model is attention-only, it has no MLP")
    limit = {"head": cfg.n_heads, "neuron": cfg.mlp_dim}.get(comp.kind)
    if limit is not None and (comp.index is None or not 0 <= comp.index < limit):  # a head or neuron needs one
        raise CircuitlabError(f"component {comp}: index {comp.index} out of range (0..{limit - 1})")
    return comp


def _check_method(method: str, reference) -> None:
    if method not in METHODS:
        raise CircuitlabError(f"ablation method must be one of {', '.join(METHODS)}; got {method!r}")
    if method != "zero" and reference is None:
        raise CircuitlabError(f"{method} ablation needs reference tokens [batch, pos] to take activations from")


def _replacements(model: Transformer, hooks: list[str], method: str, reference, shape: tuple[int, int]
                  ) -> dict[str, torch.Tensor]:
    """What each hook is set to: zeros, the reference mean, or the reference activations, broadcastable
    to the activation [batch, pos, ...]. Zero needs no forward pass."""
    if method == "zero":
        return {h: torch.zeros(()) for h in hooks}
    ref = as_tokens(model, reference, "reference tokens")
    if method == "mean_by_pos" and ref.shape[1] != shape[1]:
        raise CircuitlabError(f"mean_by_pos ablation takes each position's mean over the reference, so the "
                              f"reference needs {shape[1]} positions; got {list(ref.shape)}")
    if method == "resample" and (ref.shape[1] != shape[1] or ref.shape[0] < shape[0]):
        raise CircuitlabError(f"resample ablation takes row b of the reference for row b of the input, so the "
                              f"reference needs {shape[1]} positions and at least {shape[0]} rows; got "
                              f"{list(ref.shape)}")
    _, cache = model.run_with_cache(ref, names_filter=hooks)
    if method == "mean":
        return {h: cache[h].mean(dim=(0, 1)) for h in hooks}  # over sequences and positions
    if method == "mean_by_pos":
        return {h: cache[h].mean(dim=0, keepdim=True) for h in hooks}  # [1, pos, ...]: over sequences
    return {h: cache[h][: shape[0]] for h in hooks}


def ablation_targets(model: Transformer, components: Sequence[str | Component]) -> list[tuple[str, int | None]]:
    """(full hook name, head or neuron index or None) of every site the components are ablated at."""
    comps = [parse_component(model, c) for c in components]
    return [(act_name(name, c.layer), idx) for c in comps for name, idx in c.sites(model.cfg.has_mlp)]


def reference_values(model: Transformer, components: Sequence[str | Component], method: str, reference,
                     shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """What ablation_hooks sets each hook of `components` to, computed once (one reference forward pass) so that
    many ablations of these components (or of subsets of them) can share it: pass it as ablation_hooks(values=)."""
    _check_method(method, reference)
    return _replacements(model, sorted({h for h, _ in ablation_targets(model, components)}), method, reference,
                         shape)


def ablation_hooks(model: Transformer, components: Sequence[str | Component], method: str = "zero", reference=None,
                   shape: tuple[int, int] | None = None, values: dict[str, torch.Tensor] | None = None
                   ) -> list[tuple[str, Any]]:
    """Forward hooks that ablate all `components` together, for model.hooks / run_with_hooks.

    reference: tokens [batch, pos] for mean / resample ablation; shape: (batch, pos) of the input the
    hooks will see (needed for resample and mean_by_pos). values: reference_values(...) of these components
    (or more), computed once, instead of a reference forward pass here. Returns [(hook name, fn)].
    """
    if values is None:
        _check_method(method, reference)
    if method in ("resample", "mean_by_pos") and shape is None:
        raise CircuitlabError(f"{method} ablation hooks need the (batch, pos) shape of the input they will see")
    targets = ablation_targets(model, components)
    needed = sorted({h for h, _ in targets})
    if values is not None and any(h not in values for h in needed):
        raise CircuitlabError("the given reference values do not cover every ablated component; compute them with "
                              "reference_values over these components")
    repl = values if values is not None else _replacements(model, needed, method, reference, shape or (1, 1))

    def make(hook_name: str, idx: int | None):
        def fn(act: torch.Tensor, hook) -> torch.Tensor:
            new = repl[hook_name].to(act.device, act.dtype)
            if idx is None:
                return new.expand_as(act).clone()
            act = act.clone()
            # heads: act [batch, pos, head, d_head]; neurons: act [batch, pos, d_mlp]
            if hook_name.endswith("hook_z"):
                act[:, :, idx] = new[..., idx, :] if new.dim() else new
            else:
                act[..., idx] = new[..., idx] if new.dim() else new
            return act
        return fn

    return [(h, make(h, idx)) for h, idx in targets]


@torch.no_grad()
def run_ablated(model: Transformer, tokens, components: Sequence[str | Component], method: str = "zero",
                reference=None, values: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Logits [batch, pos, d_vocab] of `tokens` [batch, pos] with all `components` ablated together (values:
    reference_values shared by many calls, see ablation_hooks)."""
    tokens = as_tokens(model, tokens)
    hooks = ablation_hooks(model, components, method, reference, tuple(tokens.shape), values)
    return model.run_with_hooks(tokens, fwd_hooks=hooks)


@dataclass
class AblationResult:
    """The metric with each component ablated on its own.

    values [layer] (attn, mlp, layer), [layer, head] or [layer, neuron]; baseline: the metric
    without ablation.
    """

    kind: str
    method: str
    layers: list[int]
    values: torch.Tensor
    baseline: float
    metric: str = "metric"

    def change(self) -> torch.Tensor:
        """values - baseline, same shape as values."""
        return self.values - self.baseline

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The k components whose ablation moved the metric most: (name, change)."""
        ch = self.change()
        order = ch.abs().flatten().argsort(descending=True)[:k].tolist()
        out = []
        for i in order:
            if ch.dim() == 1:
                comp = Component(self.kind, self.layers[i])
            else:
                comp = Component(self.kind, self.layers[i // ch.shape[1]], i % ch.shape[1])
            out.append((str(comp), float(ch.flatten()[i])))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "method": self.method, "layers": self.layers, "values": rounded(self.values),
                "baseline": round(self.baseline, 6), "metric": self.metric,
                "top": [{"component": c, "change": round(v, 6)} for c, v in self.top()]}


def ablate_and_measure(model: Transformer, tokens, metric: Metric, kind: str = "head", method: str = "zero",
                       reference=None,
                       *, layers: Sequence[int] | None = None, batch_size: int | None = None,
                       progress: bool = True) -> AblationResult:
    """Ablate each component of one kind on its own (batched) and record the metric.

    tokens [batch, pos]; metric: fn(logits [batch, pos, d_vocab]) -> scalar (e.g. next_token_loss(tokens));
    kind: "head", "attn", "mlp", "layer" or "neuron"; method: "zero", "mean" or "resample" (reference
    tokens [batch, pos] for the last two). Returns AblationResult with values [layer] or
    [layer, head] or [layer, neuron].
    """
    if kind not in KINDS:
        raise CircuitlabError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    _check_method(method, reference)
    tokens = as_tokens(model, tokens)
    check_metric(model, metric, tuple(tokens.shape))
    layers = check_layers(model, layers)
    probe = Component(kind, 0, 0 if kind in ("head", "neuron") else None)
    parse_component(model, probe)  # the model has this kind of component (no MLP in attention-only models)
    hooks = [name for name, _ in probe.sites(model.cfg.has_mlp)]  # short names, e.g. ["attn_out", "mlp_out"]
    repl = _replacements(model, [act_name(n, l) for l in layers for n in hooks], method, reference,
                         tuple(tokens.shape))

    base, _ = BaseRun.of(model, tokens)
    baseline = metric_value(metric, base.logits)
    count = {"head": model.cfg.n_heads, "neuron": model.cfg.mlp_dim}.get(kind)
    per_layer = []
    for l in layers:
        names = [act_name(n, l) for n in hooks]
        if count is None:  # one patch: the whole activation(s) of this layer
            sites = [Site(h, repl[h], (), torch.zeros(1, 0, dtype=torch.long)) for h in names]
        else:  # dim 1 (batch excluded) is the head of z [pos, head, d_head] and the neuron of post [pos, d_mlp]
            sites = [Site(names[0], repl[names[0]], (1,), grid_index([count]))]
        per_layer.append(sweep(model, base, l, sites, metric, batch_size, progress,
                               desc=f"ablating {kind}s L{l}"))
    values = torch.stack(per_layer)
    return AblationResult(kind, method, layers, values[:, 0] if count is None else values, baseline,
                          getattr(metric, "__name__", "metric"))
