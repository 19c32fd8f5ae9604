"""Splice sparse dictionaries into a model: their features become hook points.

    with splice(model, sae) as spliced:                       # sae.cfg.hook_name == "blocks.1.hook_resid_pre"
        logits, cache = model.run_with_cache(tokens)          # logits equal the unspliced model's
        acts = cache["blocks.1.hook_resid_pre.hook_sae_acts_post"]          # [batch, pos, d_sae]
        ablated = model.run_with_hooks(tokens, fwd_hooks=[(spliced.name(sae, "acts_post"), zero_feature_7)])
    with splice(model, sae, error_term=False):
        recon_loss = model.loss(tokens)                       # the model run on the reconstruction

Names follow SAELens, under the hook the dictionary reads (for a transcoder too, although its output
replaces the MLP output at cfg.out_hook_name):

    {hook}.hook_sae_input      [..., d_in]   the activation the dictionary reads (trailing dims joined)
    {hook}.hook_sae_acts_post  [..., d_sae]  feature activations
    {hook}.hook_sae_recons     [..., d_out]  the reconstruction decoded from the (hooked) features
    {hook}.hook_sae_error      [..., d_out]  target - reconstruction (of the unhooked features)
    {hook}.hook_sae_output     [..., d_out]  what the model goes on with

With the error term, output = reconstruction + error, so the model computes exactly what it computed
before (bit for bit while no feature is hooked), and an edit of the features changes the output by
exactly the decoder's image of the edit. Gradients are exact too: the gradient reaching the features is
W_dec · (gradient at the output), and the gradient reaching the activations upstream is the unspliced
model's (the path through the encoder is cancelled by a second, hook-free encoding; see _splice_output).

A cross-layer transcoder splices in like a set of transcoders, one per layer: layer l's hook points hang
under cfg.in_hook(l) (acts_post [..., d_sae] there), and the output at layer l's MLP is what layers 0..l's
features write into it (plus its error term). Splice.name(clt, part, layer=l) names them.

Nothing changes in an unspliced model: splicing adds one hook function to the dictionary's hook and
child hook points under it, and removes both on exit (even when the body raises).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.dictionaries.clt import CrossLayerTranscoder, check_clt_fits
from circuitlab.dictionaries.sae import check_base_model
from circuitlab.errors import CircuitlabError
from circuitlab.model import hooks as H
from circuitlab.model.hooks import HookFn, HookPoint
from circuitlab.model.storage import stored_matmul

if TYPE_CHECKING:
    from circuitlab.model import Transformer

PARTS = ("input", "acts_post", "recons", "error", "output")


def sae_hook_name(dictionary: Any, part: str) -> str:
    """The spliced hook name of one part: sae_hook_name(sae, "acts_post") ->
    "blocks.1.hook_resid_pre.hook_sae_acts_post"."""
    if part not in PARTS:
        raise CircuitlabError(f"unknown spliced hook part {part!r}; use one of {', '.join(PARTS)}")
    return f"{dictionary.cfg.hook_name}.hook_sae_{part}"


def flatten_trailing(x: torch.Tensor, width: int, hook: str) -> torch.Tensor:
    """x [batch, pos, *rest] -> [batch, pos, width], joining the trailing dims whose product is width
    (hook_z's [head, d_head] become one axis, as the dictionary was trained)."""
    for n in range(1, x.dim() + 1):
        size = math.prod(x.shape[x.dim() - n:])
        if size == width:
            return x.reshape(*x.shape[:x.dim() - n], width)
        if size > width:
            break
    raise CircuitlabError(f"the dictionary expects width {width} at {hook}, but the model's activation there "
                          f"has shape {tuple(x.shape)}: was it trained on another model?")


@dataclass
class _Attached:
    """One dictionary's hook points and what its input hook saw in the current forward pass."""

    dictionary: Any
    points: dict[str, HookPoint]
    error_term: bool
    pending: list[torch.Tensor] = field(default_factory=list)  # transcoders: input seen, output not yet


class Splice:
    """The dictionaries spliced into a model (what `splice` yields)."""

    def __init__(self, model: Transformer, attached: list[_Attached | _AttachedCLT]) -> None:
        self.model = model
        self._attached = attached

    @property
    def dictionaries(self) -> list[Any]:
        return [a.dictionary for a in self._attached]

    def name(self, dictionary: Any | int, part: str = "acts_post", layer: int | None = None) -> str:
        """The hook name of one part ("input", "acts_post", "recons", "error", "output") of a spliced
        dictionary, given as the object or its index in the order spliced; a CLT's at `layer`."""
        if isinstance(dictionary, int):
            dictionary = self._attached[dictionary].dictionary
        if not any(a.dictionary is dictionary for a in self._attached):
            raise CircuitlabError("that dictionary is not spliced into this model")
        if isinstance(dictionary, CrossLayerTranscoder):
            if layer is None or not 0 <= layer < dictionary.cfg.n_layers:
                raise CircuitlabError(f"a CLT's hook points are per layer: name(clt, {part!r}, layer=0..{dictionary.cfg.n_layers - 1})")
            if part not in PARTS:
                raise CircuitlabError(f"unknown spliced hook part {part!r}; use one of {', '.join(PARTS)}")
            return f"{dictionary.cfg.in_hook(layer)}.hook_sae_{part}"
        return sae_hook_name(dictionary, part)

    def hook_names(self) -> list[str]:
        """Every spliced hook name, dictionary by dictionary."""
        return [hp.name for a in self._attached for hp in (a.points.values() if isinstance(a, _Attached) else a.all_points())]

    def __repr__(self) -> str:
        return f"Splice({', '.join(a.dictionary.cfg.hook_name for a in self._attached)})"


@dataclass
class _AttachedCLT:
    """A CLT's hook points, layer by layer, and what its input hooks saw in the current forward pass."""

    dictionary: Any
    points: list[dict[str, HookPoint]]
    error_term: bool
    seen: dict[int, tuple] = field(default_factory=dict)  # layer -> (x_in, acts, acts_hooked, parts, edit, again)

    def all_points(self) -> list[HookPoint]:
        return [hp for layer in self.points for hp in layer.values()]


@contextlib.contextmanager
def splice(model: Transformer, dictionaries: Any | Sequence[Any], error_term: bool = True) -> Iterator[Splice]:
    """Attach dictionaries (one, or a list) to the model for the duration of the block.

    error_term: True keeps the model's output exact (output = reconstruction + error); False runs the
    model on the reconstruction alone (the forward pass behind CE-loss recovered).
    Hooks added inside the block on a dictionary's own hook run after the dictionary, on its output.
    """
    if not isinstance(dictionaries, (list, tuple)):
        dictionaries = [dictionaries]
    points = H.hook_points(model)
    attached: list[_Attached | _AttachedCLT] = []
    added: list[tuple[HookPoint, Any]] = []
    children: list[tuple[HookPoint, str]] = []
    try:
        for d in dictionaries:
            if isinstance(d, CrossLayerTranscoder):
                attached.append(_attach_clt(model, points, d, error_term, added, children))
                continue
            cfg = d.cfg
            out_name = getattr(cfg, "out_hook_name", None)
            check_base_model(d, model, f"the dictionary for {cfg.hook_name}")
            target_in = H.resolve(points, cfg.hook_name)[0]
            target_out = H.resolve(points, out_name)[0] if out_name else target_in
            for hp in (target_in, target_out):
                if any(getattr(fn, "_splice", False) for fn in hp.fwd_fns):
                    raise CircuitlabError(f"a dictionary is already spliced at {hp.name}; splice one per hook")
            att = _Attached(d, {}, error_term)
            for part in PARTS:
                hp = HookPoint()
                hp.name = f"{target_in.name}.hook_sae_{part}"
                target_in.add_module(f"hook_sae_{part}", hp)  # so model.hook_points() lists it
                children.append((target_in, f"hook_sae_{part}"))
                att.points[part] = hp
            if target_out is target_in:
                fns = [(target_in, _sae_fn(att))]
            else:
                fns = [(target_in, _transcoder_in_fn(att)), (target_out, _transcoder_out_fn(att))]
            for hp, fn in fns:
                setattr(fn, "_splice", True)  # read back with getattr: a spliced dictionary's hook
                hp.fwd_fns.insert(0, fn)  # before any hook added earlier: the dictionary reads the raw activation
                added.append((hp, fn))
            attached.append(att)
        yield Splice(model, attached)
    finally:
        for hp, fn in added:
            hp.fwd_fns.remove(fn)
        for hp, name in children:
            del hp._modules[name]


# ---------------------------------------------------------------------------- the hook functions


def _sae_fn(att: _Attached) -> HookFn:
    def fn(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        d = att.dictionary
        x_in = att.points["input"](flatten_trailing(x, d.cfg.d_in, hook.name))
        return _splice_output(att, x_in, x_in).reshape(x.shape)

    return fn


def _transcoder_in_fn(att: _Attached) -> HookFn:
    def fn(x: torch.Tensor, hook: HookPoint) -> None:
        att.pending.append(att.points["input"](flatten_trailing(x, att.dictionary.cfg.d_in, hook.name)))

    return fn


def _transcoder_out_fn(att: _Attached) -> HookFn:
    def fn(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if not att.pending:
            raise CircuitlabError(f"the transcoder at {hook.name} ran before its input hook "
                                  f"{att.dictionary.cfg.hook_name}")
        x_in = att.pending.pop()
        y_flat = flatten_trailing(y, att.dictionary.cfg.d_out, hook.name)
        return _splice_output(att, x_in, y_flat).reshape(y.shape)

    return fn


def _splice_output(att: _Attached, x_in: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The spliced replacement of y [..., d_out] (y is x_in for an SAE), read from x_in [..., d_in].

    Written so that, while no spliced hook edits anything, the value is y itself (x + 0, bit for bit)
    and its gradient with respect to x_in and y is the unspliced one: the features' path to the
    output (gradient J) is cancelled by the same path computed a second time without hooks (-J).
    """
    d, p = att.dictionary, att.points
    recons_clean, acts = d(x_in)  # [..., d_out], [..., d_sae]
    acts_h = p["acts_post"](acts)
    # A hooked edit of the features moves the reconstruction by exactly the decoder's image of the edit.
    recons = recons_clean if acts_h is acts else recons_clean + stored_matmul(acts_h - acts, d.W_dec)

    def again() -> torch.Tensor | None:
        return d(x_in)[0] if torch.is_grad_enabled() and x_in.requires_grad else None

    return _output_with_error(p, y, recons_clean, recons, att.error_term, again)


def _output_with_error(p: dict[str, HookPoint], y: torch.Tensor, recons_clean: torch.Tensor, recons: torch.Tensor,
                       error_term: bool, again: Callable[[], torch.Tensor | None]) -> torch.Tensor:
    """What a spliced output hook returns [..., d_out], shared by transcoders, SAEs and each CLT layer.

    y is the model's value, recons_clean the reconstruction without hooked edits, recons with them; again()
    recomputes the features' path to the output without hooks (None when no gradient flows), so that
    subtracting its non-detached part cancels that path's gradient and the unspliced gradient remains.
    """
    recons = p["recons"](recons)
    fixed = recons_clean.detach()
    error_clean = y - fixed
    error = p["error"](error_clean)
    if not error_term:
        out = recons
    elif error is not error_clean:
        out = recons + error  # the error term was edited (ablated, patched)
    else:
        out = y + (recons - fixed)
        path = again()
        if path is not None:
            out = out - (path - path.detach())
    return p["output"](out.to(y.dtype))


# ---------------------------------------------------------------------------- cross-layer transcoders


def _attach_clt(model: Transformer, points: dict[str, HookPoint], clt: CrossLayerTranscoder, error_term: bool,
                added: list, children: list) -> _AttachedCLT:
    check_clt_fits(clt, model, "the CLT")
    cfg = clt.cfg
    att = _AttachedCLT(clt, [], error_term)
    for layer in range(cfg.n_layers):
        target_in, target_out = H.resolve(points, cfg.in_hook(layer))[0], H.resolve(points, cfg.out_hook(layer))[0]
        for hp in (target_in, target_out):
            if any(getattr(fn, "_splice", False) for fn in hp.fwd_fns):
                raise CircuitlabError(f"a dictionary is already spliced at {hp.name}; splice one per hook")
        mine: dict[str, HookPoint] = {}
        for part in PARTS:
            hp = HookPoint()
            hp.name = f"{target_in.name}.hook_sae_{part}"
            target_in.add_module(f"hook_sae_{part}", hp)
            children.append((target_in, f"hook_sae_{part}"))
            mine[part] = hp
        att.points.append(mine)
        for hp, fn in ((target_in, _clt_in_fn(att, layer)), (target_out, _clt_out_fn(att, layer))):
            setattr(fn, "_splice", True)
            hp.fwd_fns.insert(0, fn)
            added.append((hp, fn))
    return att


def _clt_in_fn(att: _AttachedCLT, layer: int) -> HookFn:
    def fn(x: torch.Tensor, hook: HookPoint) -> None:
        clt, p = att.dictionary, att.points[layer]
        if layer == 0:
            att.seen.clear()  # a new forward pass
        x_in = p["input"](flatten_trailing(x, clt.cfg.d_model, hook.name))
        acts = clt.encode_layer(x_in, layer)                                   # [..., d_sae]
        acts_h = p["acts_post"](acts)
        parts = clt.decode_layer(acts, layer)                                  # [..., L - layer, d_model]
        edit = None if acts_h is acts else clt.decode_layer(acts_h - acts, layer)
        again = None
        if att.error_term and torch.is_grad_enabled() and x_in.requires_grad:  # the hook-free path, to cancel
            again = clt.decode_layer(clt.encode_layer(x_in, layer), layer)
        att.seen[layer] = (x_in, parts, edit, again)

    return fn


def _clt_out_fn(att: _AttachedCLT, layer: int) -> HookFn:
    def fn(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        clt, p = att.dictionary, att.points[layer]
        if any(s not in att.seen for s in range(layer + 1)):
            raise CircuitlabError(f"the CLT's output at {hook.name} ran before its input hooks of layers 0..{layer}")
        y_flat = flatten_trailing(y, clt.cfg.d_model, hook.name)
        x_in = att.seen[layer][0]
        recons_clean = clt.b_dec[layer] + sum(att.seen[s][1][..., layer - s, :] for s in range(layer + 1))
        if clt.cfg.skip:
            recons_clean = recons_clean + stored_matmul(x_in.to(clt.dtype), clt.W_skip[layer])
        edits = [att.seen[s][2][..., layer - s, :] for s in range(layer + 1) if att.seen[s][2] is not None]
        recons = recons_clean + sum(edits) if edits else recons_clean

        def again() -> torch.Tensor | None:
            paths = [att.seen[s][3][..., layer - s, :] for s in range(layer + 1) if att.seen[s][3] is not None]
            if clt.cfg.skip and torch.is_grad_enabled() and x_in.requires_grad:
                paths.append(stored_matmul(x_in.to(clt.dtype), clt.W_skip[layer]))
            return sum(paths) if paths else None

        return _output_with_error(p, y_flat, recons_clean, recons, att.error_term, again).reshape(y.shape)

    return fn
