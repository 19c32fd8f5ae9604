"""The local replacement model of a prompt: MLPs replaced by transcoders, attention and norms frozen.

    rm = ReplacementModel(model, transcoders, tokens)         # tokens [pos]; one reference run
    out = rm.run()                                            # logits equal the model's (error terms)
    out.acts[1]                                               # [1, pos, d_sae] feature activations
    out = rm.run([Intervention(layer=0, feature=7, value=0.0, pos=3)])             # set a feature
    out = rm.run(interventions, mode="model", freeze_attention=False)             # the real model, edited
    text_ids = rm.generate(tokens, 10, [Intervention(0, 7, scale=4.0)])            # steered generation

In the replacement model every MLP output is rebuilt as decode(features) + skip(input) + error, the
error being what the transcoder missed on the reference run (a constant), so with no intervention the
replacement model computes exactly what the model computed. Attention patterns and every norm's
scale are the reference run's, detached: what remains is linear in the residual stream apart from the
features' own activation functions. With features="frozen" those are fixed too (the reference
activations), and the whole model is the linear system an attribution graph describes.

Hooks follow the model's names; `rm.hooks()` attaches the replacement to the model (user hooks added
after it see the replaced values), so run_with_hooks / run_with_cache work on the replacement model.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from circuitlab.errors import InputError
from circuitlab.graphs.options import DEFAULTS
from circuitlab.graphs.transcoders import Transcoders
from circuitlab.model.hooks import ActivationCache, HookPoint
from circuitlab.model.tokens import check_tokens

if TYPE_CHECKING:
    from circuitlab.model import Transformer

MODES = ("replacement", "model")


class _Stop(Exception):
    """Raised in a hook to end a forward pass once everything a linear pass needs is computed."""


class _MLPStandIn(torch.nn.Module):
    """Takes an MLP's place during a linear pass: its output is replaced at the transcoders' output hook anyway
    (by the skip path plus a constant), so running the real MLP would be wasted work. It passes its zeros through
    the MLP's own hook_out (when the block has one), where a transcoder may write."""

    def __init__(self, d_model: int, hook_out: HookPoint | None) -> None:
        super().__init__()
        self.d_model = d_model
        self.hook_out = hook_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(*x.shape[:-1], self.d_model)
        return self.hook_out(out) if self.hook_out is not None else out


@contextlib.contextmanager
def _mlps_stood_in(model: Transformer) -> Iterator[None]:
    """Swap every block's MLP for an _MLPStandIn for the block; restored on exit, even on error."""
    saved = [(block, block.mlp) for block in model.blocks if getattr(block, "mlp", None) is not None]
    try:
        for block, mlp in saved:
            block._modules["mlp"] = _MLPStandIn(model.cfg.d_model, getattr(mlp, "hook_out", None))
        yield
    finally:
        for block, mlp in saved:
            block._modules["mlp"] = mlp


@dataclass
class LinearPass:
    """One forward of the prompt's first n_pos positions through the frozen linear system (attention
    patterns, norm scales and feature activations the reference's; every MLP output = skip(input) + a
    constant), kept for backward. Causal: targets at positions < n_pos see only those positions.

    x[l]: each layer's transcoder input [1, n_pos, d_in] (a feature's pre-activation reads it);
    out[l]: each layer's MLP output [1, n_pos, d_model] (a leaf of the linear system where features and
    errors add); embed: the embedding [1, n_pos, d_model] (a leaf: token sources); logits: the last
    position's [1, d_vocab] before any logit soft-cap (None unless asked for)."""

    n_pos: int
    x: dict[int, torch.Tensor] = field(default_factory=dict)
    out: dict[int, torch.Tensor] = field(default_factory=dict)
    embed: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@dataclass(frozen=True)
class Intervention:
    """Set (value) or scale (scale) one feature of one layer, at some positions (None: every position,
    generated ones included). A cross-layer feature is edited once; its decoders carry the edit into
    every layer it writes."""

    layer: int
    feature: int
    value: float | None = None
    scale: float | None = None
    pos: int | Sequence[int] | None = None

    def __post_init__(self) -> None:
        if (self.value is None) == (self.scale is None):
            raise InputError("an intervention sets a feature (value=...) or scales it (scale=...), one of the two")

    def positions(self, n_pos: int) -> list[int] | slice:
        if self.pos is None:
            return slice(None)
        pos = [self.pos] if isinstance(self.pos, int) else list(self.pos)
        bad = [p for p in pos if not -n_pos <= p < n_pos]
        if bad:
            raise InputError(f"intervention position(s) {bad} outside the prompt's {n_pos} positions")
        return [p % n_pos for p in pos]


@dataclass
class ReplacementRun:
    """What one run of the replacement (or edited real) model computed.

    logits [batch, pos, d_vocab]; acts / pre_acts {layer: [batch, pos, d_sae]} (after the interventions)."""

    logits: torch.Tensor
    acts: dict[int, torch.Tensor] = field(default_factory=dict)
    pre_acts: dict[int, torch.Tensor] = field(default_factory=dict)


class ReplacementModel:
    """A model, its transcoders and a reference run on one prompt (tokens [pos]).

    bos: treat position 0 as an attention sink, as circuit-tracer does: no features there, its MLP output
    kept whole in the error term (and, in a graph, not a node). lean: keep only what an attribution graph
    reads: the active features and their activations (active_features, active_values), not each layer's
    [pos, d_sae] activations (acts is then empty: runs need lean=False), and the last position's logits
    (logits [1, d_vocab]): on a 1,024-token GPT-2-small prompt the activations alone are 1.2 GB."""

    def __init__(self, model: Transformer, transcoders: Transcoders, tokens: torch.Tensor, bos: bool = False,
                 lean: bool = False) -> None:
        transcoders.check_model(model)
        self.model, self.tc, self.bos, self.lean = model, transcoders, bos, lean
        tokens = torch.as_tensor(tokens)
        if tokens.dim() != 1:
            raise InputError(f"a replacement model is built on one prompt: tokens [pos], got shape "
                             f"{tuple(tokens.shape)}")
        self.tokens = check_tokens(tokens[None], model.cfg, "the prompt")[0]
        if len(self.tokens) > model.cfg.n_ctx:
            raise InputError(f"the prompt has {len(self.tokens)} tokens but the model's context is "
                             f"{model.cfg.n_ctx}; shorten it")
        self.n_pos = len(self.tokens)
        self._reference()

    # ------------------------------------------------------------------ the reference run
    @torch.no_grad()
    def _reference(self) -> None:
        points = self.model.hook_points()
        frozen_names = self.model.frozen_hook_names()
        ins = [self.tc.input_hook(layer) for layer in self.tc.layers]
        outs = [self.tc.output_hook(layer) for layer in range(self.tc.n_layers)]
        embeds: list[str] = [n for n in ("hook_embed", "hook_pos_embed") if n in points]
        logits, cache = self.model.run_with_cache(self.tokens[None], names_filter=frozen_names + ins + outs + embeds)
        self.logits = logits[0, -1:].clone() if self.lean else logits[0]           # [pos (lean: 1), d_vocab]
        del logits
        # What the model's frozen mode reads: every attention pattern and norm scale of this run.
        self.frozen = ActivationCache({n: cache[n] for n in frozen_names}, {}, self.model)
        self.inputs = {layer: cache[self.tc.input_hook(layer)][0] for layer in self.tc.layers}   # [pos, d_in]
        self.mlp_out = {layer: cache[outs[layer]][0] for layer in range(self.tc.n_layers)}       # [pos, d_model]
        self.embeddings = cast(torch.Tensor, sum(cache[n][0] for n in embeds))  # [pos, d_model]: token nodes
        self.token_embeddings = cache["hook_embed"][0]                                  # [pos, d_model]: W_E[token]
        self.acts = {}                                                              # [pos, d_sae]
        self._sparse: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}   # lean: (pos, feat, value)
        self.errors = {}                                                            # [pos, d_model]
        for layer in range(self.tc.n_layers):     # each layer encoded, then its error (its sources are encoded)
            if self.tc.has(layer):
                a = self.tc.encode(layer, self.inputs[layer])
                if self.bos:
                    a[0] = 0
                self.acts[layer] = a
            if not self.tc.has(layer):
                self.errors[layer] = self.mlp_out[layer].clone()
            else:
                self.errors[layer] = self.mlp_out[layer] - self._rebuild(layer, self.acts, self.inputs[layer])
            if self.lean:   # a source no later layer reads from: its activations as (pos, feat, value)
                for src in [s_ for s_ in self.acts if max(self.tc.writes(s_)) <= layer]:
                    a = self.acts.pop(src)
                    pos, feat = a.nonzero(as_tuple=True)
                    self._sparse[src] = (pos, feat, a[pos, feat])
        if self.lean:
            for src in list(self.acts):
                a = self.acts.pop(src)
                pos, feat = a.nonzero(as_tuple=True)
                self._sparse[src] = (pos, feat, a[pos, feat])

    def token_vectors(self, token_nodes: str = DEFAULTS.token_nodes) -> torch.Tensor:
        """What each token node adds to the residual stream [pos, d_model]: the whole embedding ("embedding":
        W_E[token] times any embedding scale, plus W_pos[pos] on learned-position models, so that every input
        of the graph is a node) or the token's row alone ("W_E": circuit-tracer's token nodes; W_pos is then
        in no node). The two are equal on models without learned positions."""
        return self.embeddings if token_nodes == "embedding" else self.token_embeddings

    def _rebuild(self, layer: int, acts: dict[int, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """decode + skip of `layer` from source activations and its input (no error)."""
        y = self.tc.decode(layer, acts)
        skip = self.tc.skip(layer, x)
        return y if skip is None else y + skip

    def _nonzero(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pos [n], feature [n], activation [n]) of layer's active features, row-major."""
        if layer in self._sparse:
            return self._sparse[layer]
        a = self.acts[layer]
        pos, feat = a.nonzero(as_tuple=True)
        return pos, feat, a[pos, feat]

    @property
    def active_features(self) -> torch.Tensor:
        """[n, 3] (layer, pos, feature) of every active feature, sorted; with active_values() [n]."""
        rows = []
        for layer in self.tc.layers:
            pos, feat, _ = self._nonzero(layer)
            rows.append(torch.stack([torch.full_like(pos, layer), pos, feat], 1))
        return torch.cat(rows) if rows else torch.zeros(0, 3, dtype=torch.long)

    def active_values(self) -> torch.Tensor:
        """The activation of each active feature [n], in active_features' order."""
        vals = [self._nonzero(layer)[2] for layer in self.tc.layers]
        return torch.cat(vals) if vals else torch.zeros(0)

    # ------------------------------------------------------------------ the linear system
    def linear_pass(self, n_pos: int | None = None, logits: bool = True) -> LinearPass:
        """The frozen linear system over the first n_pos positions (default: all), run once with autograd
        on (see LinearPass). Its gradients are the graph's edges: differentiate a target (a feature's
        pre-activation at x, a logit) with respect to out and embed."""
        model, tc = self.model, self.tc
        lp = LinearPass(n_pos or self.n_pos)
        P = lp.n_pos

        def embed(t: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            lp.embed = t.detach().requires_grad_(True)
            return lp.embed

        def read(x: torch.Tensor, hook: HookPoint) -> None:
            lp.x[int(hook.name.split(".")[1])] = x

        def write(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            layer = int(hook.name.split(".")[1])
            const = self.mlp_out[layer][:P]
            skip = tc.skip(layer, lp.x[layer]) if tc.has(layer) else None
            if skip is None:
                out = const.to(y.dtype).expand_as(y).clone().requires_grad_(True)
            else:  # the skip path stays linear in the input; the rest of the output is constant
                ref = tc.skip(layer, self.inputs[layer][:P])
                assert ref is not None  # the same transcoder's skip path
                out = skip.to(y.dtype) + (const - ref).to(y.dtype)
            lp.out[layer] = out
            return out

        resid: list[torch.Tensor] = []

        def stop(x: torch.Tensor, hook: HookPoint) -> None:
            resid.append(x)
            raise _Stop

        fns: list[tuple[str, Any]] = [("hook_embed", embed)]
        if "hook_pos_embed" in model.hook_points():
            fns.append(("hook_pos_embed", lambda t, hook: t.detach()))
        fns += [(tc.input_hook(layer), read) for layer in tc.layers]
        fns += [(tc.output_hook(layer), write) for layer in range(tc.n_layers)]
        fns.append((f"blocks.{tc.n_layers - 1}.hook_resid_post", stop))
        with torch.enable_grad(), model.frozen(self.frozen), model.hooks(fns), _mlps_stood_in(model):
            try:
                model(self.tokens[None, :P])
            except _Stop:
                pass
            if logits:  # the model's read-out (its final norm's scale frozen), at the last position, before any
                # logit soft-cap (circuit-tracer's convention: the cap is monotone per token, the rest is linear)
                lp.logits = model.readout(resid[0], soft_cap=False)[:, -1]         # [1, d_vocab]
        return lp

    # ------------------------------------------------------------------ runs
    @contextlib.contextmanager
    def hooks(self, interventions: Sequence[Intervention] = (), mode: str = "replacement",
              features: str = "live", freeze_attention: bool = True,
              record: ReplacementRun | None = None) -> Iterator[Any]:
        """Attach the replacement (or, mode="model", edits of the real model) to the model for the block.

        features: "live" (encoded from the current input) or "frozen" (the reference activations; with
        them the model is linear). freeze_attention: attention patterns and norm scales are the reference
        run's (the model's frozen mode; always in the replacement model). record: filled with each layer's
        acts and pre-acts."""
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
        if features not in ("live", "frozen"):
            raise InputError(f"features must be 'live' or 'frozen', got {features!r}")
        if mode == "replacement" and not freeze_attention:
            raise InputError("the replacement model freezes attention and norms; to let them move, run the real "
                             "model (mode='model')")
        by_layer: dict[int, list[Intervention]] = {}
        for iv in interventions:
            if not self.tc.has(iv.layer):
                raise InputError(f"no transcoder at layer {iv.layer} to intervene on")
            if not 0 <= iv.feature < self.tc.d_sae(iv.layer):
                raise InputError(f"feature {iv.feature} is outside layer {iv.layer}'s {self.tc.d_sae(iv.layer)}")
            by_layer.setdefault(iv.layer, []).append(iv)
        fns: list[tuple[str, Any]] = []
        inputs: dict[int, torch.Tensor] = {}
        acts: dict[int, torch.Tensor] = {}        # this pass's activations, by source layer
        deltas: dict[int, torch.Tensor] = {}      # real model: decoder image of the edits, by target layer

        def read(x: torch.Tensor, hook: HookPoint) -> None:
            layer = int(hook.name.split(".")[1])
            inputs[layer] = x
            pre = self.tc.pre_acts(layer, x)
            if features == "frozen" and mode == "replacement":
                now = self.acts[layer].to(x.dtype).expand(x.shape[0], *self.acts[layer].shape).clone()
            else:
                now = self.tc.encode(layer, x)
                if self.bos:
                    now = now.clone()
                    now[:, 0] = 0
            edited = self._edit(now, by_layer.get(layer, ()), now.shape[1])
            acts[layer] = edited
            if record is not None:
                record.acts[layer] = edited.detach()
                record.pre_acts[layer] = pre.detach()
            if mode == "model" and edited is not now:
                change = self.tc.decoder_vectors(layer, torch.arange(self.tc.d_sae(layer)))  # [d_sae, w, d]
                diff = (edited - now).to(change.dtype)
                for i, target in enumerate(self.tc.writes(layer)):
                    d = diff @ change[:, i]
                    deltas[target] = deltas[target] + d if target in deltas else d

        def write(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            layer = int(hook.name.split(".")[1])
            if mode == "model":
                return y + deltas.pop(layer).to(y.dtype) if layer in deltas else y
            err = self.errors[layer].to(y.dtype)
            if not self.tc.has(layer):
                return err.expand_as(y)
            return (self._rebuild(layer, acts, inputs[layer]).to(y.dtype) + err).expand_as(y)

        for layer in self.tc.layers:
            fns.append((self.tc.input_hook(layer), read))
        if mode == "replacement":
            fns += [(self.tc.output_hook(layer), write) for layer in range(self.tc.n_layers)]
        else:
            fns += [(self.tc.output_hook(layer), write) for layer in range(self.tc.n_layers)
                    if any(layer in self.tc.writes(src) for src in by_layer)]
        freeze = self.model.frozen(self.frozen) if freeze_attention else contextlib.nullcontext()
        with freeze, self.model.hooks(fns):
            yield self.model

    def _edit(self, acts: torch.Tensor, edits: Sequence[Intervention], n_pos: int) -> torch.Tensor:
        if not edits:
            return acts
        acts = acts.clone()
        for iv in edits:
            where = iv.positions(n_pos)
            if iv.value is not None:
                acts[:, where, iv.feature] = iv.value
            elif iv.scale is not None:  # exactly one of value and scale is set (__post_init__)
                acts[:, where, iv.feature] = acts[:, where, iv.feature] * iv.scale
        return acts

    @torch.no_grad()
    def run(self, interventions: Sequence[Intervention] = (), mode: str = "replacement", features: str = "live",
            freeze_attention: bool = True, fwd_hooks: Sequence[tuple[str, Any]] = ()) -> ReplacementRun:
        """Run the prompt through the replacement model (or the real model, mode="model") with the
        interventions; user fwd_hooks run after the replacement's own. Returns logits and features."""
        out = ReplacementRun(logits=torch.empty(0))
        with self.hooks(interventions, mode, features, freeze_attention, record=out):
            with self.model.hooks(fwd_hooks):
                out.logits = self.model(self.tokens[None])
        return out

    @torch.no_grad()
    def generate(self, max_new_tokens: int, interventions: Sequence[Intervention] = (), temperature: float = 0.0,
                 seed: int | None = None) -> torch.Tensor:
        """Continue the prompt with the real model (attention free: new positions have no reference), the
        interventions applied at their positions (pos=None: every position, new ones included).
        Returns tokens [pos + new]."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with self.hooks(interventions, mode="model", freeze_attention=False):
            return self.model.generate(self.tokens[None], max_new_tokens, temperature=temperature,
                                       use_cache=False, generator=gen)[0]
