"""Transformer: tokens -> logits, with hook points on every activation.

    model = Transformer(ModelConfig.from_preset("attn-only-2l"))
    logits = model(tokens)                                   # [batch, pos, d_vocab]
    logits, cache = model.run_with_cache(tokens)
    cache["pattern", 1]                                      # [batch, head, query_pos, key_pos]
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", fn)]): ...
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError, InputError
import circuitlab.model.hooks as H
from circuitlab.model.components import Attention, Block, BlockList, LayerKV, Norm, Rotary, make_norm
from circuitlab.model.hooks import ActivationCache, HookPoint
from circuitlab.model.storage import Linear, cast_parameters, compute_of, dtype_name, resolve_dtypes, upcast
from circuitlab.model.tokens import check_tokens
from circuitlab.model.weights import WeightViews



def model_device(model: nn.Module) -> torch.device:
    """The device of a model's parameters (one home for the lookup every analysis needs)."""
    return next(model.parameters()).device


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype a model's activations are computed in: its compute dtype when it has one (a Transformer whose
    weights are stored in half precision), else its parameters' dtype."""
    compute = getattr(model, "compute_dtype", None)
    return compute if isinstance(compute, torch.dtype) else next(model.parameters()).dtype


@contextlib.contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[nn.Module]:
    """Inside: no parameter requires grad, so autograd through the model records nothing for the weights
    (gradients with respect to activations or inputs only, faster); the flags are restored on exit."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def check_device(device: str | torch.device) -> torch.device:
    """A device name ("cpu", "cuda", "cuda:1", "mps") as a torch.device this machine has, or an InputError
    saying what it has instead."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
        raise InputError(f"device {device!r} is not available: this machine has {have}; use cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {device!r} is not available on this machine; use cpu")
    return dev


class Transformer(WeightViews, nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.positional == "learned":
            self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model)
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        # One cos/sin table for all layers (and one for the sliding layers when they have their own base).
        rotary = Rotary(cfg) if cfg.positional == "rotary" else None
        local = Rotary(cfg, local=True) if rotary is not None and cfg.local_rotary_base is not None else None
        self.blocks = BlockList(Block(cfg, local if local is not None and cfg.is_sliding(i) else rotary, i)
                                 for i in range(cfg.n_layers))
        self.ln_final = make_norm(cfg)
        self.unembed = Linear(cfg.d_model, cfg.d_vocab, bias=cfg.bias)
        if cfg.tied_embeddings:
            self.unembed.weight = self.embed.weight
        # The dtype activations are computed in; None: the parameters' own (set_dtypes stores them apart).
        self._compute_dtype: torch.dtype | None = None
        self.reset_parameters()
        H.name_hook_points(self)

    # ------------------------------------------------------------------ dtypes
    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype the weight matrices are held in."""
        return self.embed.weight.dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype every activation is computed in: the embeddings are cast to it and each stored weight is
        upcast to it per use (storage.stored_linear), one layer at a time."""
        return compute_of(self.storage_dtype, self._compute_dtype)

    def set_dtypes(self, storage: str | torch.dtype | None = None, compute: str | torch.dtype | None = None
                   ) -> "Transformer":
        """Hold the weights in `storage` (default: as they are) and compute in `compute` (default: float32 on a
        CPU for half-precision storage, the storage dtype on a GPU). Casts the parameters in place: matrices to
        `storage`, vectors (biases, norm gains) to `compute` (the computed rotary tables stay float32). An
        unknown dtype or one the device cannot compute in is one InputError, raised before anything changes.
        Returns the model."""
        device = self.embed.weight.device
        storage_dtype, compute_dtype = resolve_dtypes(storage if storage is not None else self.storage_dtype,
                                                      compute, device)
        cast_parameters(self, storage_dtype, compute_dtype)
        self._compute_dtype = None if compute_dtype == storage_dtype else compute_dtype
        return self

    def dtype_summary(self) -> str:
        """'float32', or 'bfloat16 storage, float32 compute'."""
        s, c = self.storage_dtype, self.compute_dtype
        return dtype_name(s) if s == c else f"{dtype_name(s)} storage, {dtype_name(c)} compute"

    # ------------------------------------------------------------------ init
    def reset_parameters(self, seed: int | None = None) -> None:
        """Normal(0, init_std) weights, zero biases, unit norm gains; output projections scaled
        by 1/sqrt(2 * n_layers) when cfg.scale_out_init (GPT-2 / LLaMA practice)."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * max(self.cfg.n_layers, 1)) if self.cfg.scale_out_init else std
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".b") or name.endswith(".bias"):
                    p.zero_()
                elif name.endswith(".w"):
                    p.fill_(1.0)
                else:
                    is_out = name.endswith("attn.out.weight") or name.endswith("mlp.fc_out.weight")
                    p.copy_(torch.randn(p.shape, generator=gen) * (out_std if is_out else std))

    # ------------------------------------------------------------------ forward
    def forward(self, tokens: torch.Tensor, kv_cache: "KVCache | None" = None) -> torch.Tensor:
        """tokens [batch, pos] (int) -> logits [batch, pos, d_vocab]."""
        offset = kv_cache.length if kv_cache is not None else 0
        x = self.embed_tokens(tokens, offset)
        for i, block in enumerate(self.blocks):
            x = block(x, kv_cache.layers[i] if kv_cache is not None else None)
        if kv_cache is not None:
            kv_cache.length += x.shape[1]
        return self.readout(x)

    # The model's own arithmetic, once: analyses call these instead of re-deriving embedding or read-out.
    def token_embeddings(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [...] (valid ids) -> their embeddings [..., d_model]: the rows of W_E times cfg.embed_scale.
        This is what hook_embed carries (input attribution's 'embeddings')."""
        x = self.embed(tokens)
        if x.dtype != self.compute_dtype:  # the rows of a half-precision W_E, upcast (never the whole table)
            x = x.to(self.compute_dtype)
        if self.cfg.embed_scale != 1.0:  # Gemma: times sqrt(d_model), rounded to the dtype computed in, as HF does
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        return x

    def resid_from_embeds(self, token_embeds: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """The residual stream entering block 0 from token embeddings [batch, pos, d_model]: through
        hook_embed, plus learned positions offset .. offset + pos - 1 through hook_pos_embed (rotary
        positions act inside attention instead). Returns [batch, pos, d_model]."""
        x = self.hook_embed(token_embeds)
        if self.cfg.positional == "learned":
            pos = torch.arange(offset, offset + x.shape[-2], device=x.device)
            x = x + self.hook_pos_embed(upcast(self.pos_embed(pos), x).expand_as(x))
        return x

    def embed_tokens(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """tokens [batch, pos] or [pos] -> the residual stream entering block 0 [batch, pos, d_model]
        (blocks.0.hook_resid_pre): token embeddings and positions, as forward computes them."""
        tokens = check_tokens(tokens, self.cfg, offset=offset, allow_empty=True)
        return self.resid_from_embeds(self.token_embeddings(tokens), offset)

    def readout(self, resid: torch.Tensor, soft_cap: bool = True) -> torch.Tensor:
        """A final residual stream [..., d_model] -> logits [..., d_vocab]: the final norm (ln_final),
        the unembedding (W_U, b_U), then any logit soft-cap, as forward ends. In frozen mode the final
        norm's scale is the reference's, so resid must then be [..., batch, pos, d_model] of the
        reference's batch and positions (or stacked copies of them). soft_cap=False: the logits before
        cfg.logit_softcap (what direct logit attribution explains)."""
        logits = self.unembed(self.ln_final(resid))
        return self.soft_cap_logits(logits) if soft_cap else logits

    def soft_cap_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """cfg.logit_softcap applied to unembedded logits [..., d_vocab]: c * tanh(logits / c) (Gemma-2);
        the logits themselves when the model has no cap."""
        cap = self.cfg.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # ------------------------------------------------------------------ frozen mode
    def frozen_hook_names(self) -> list[str]:
        """The hooks a reference run must cache for frozen(): every norm's hook_scale (whatever its place:
        ln1, ln2, post-norms, q/k norms, ln_final) and every attention's hook_pattern."""
        return [name for name, _, _ in self._freezable()]

    def _freezable(self) -> list[tuple[str, nn.Module, str]]:
        out: list[tuple[str, nn.Module, str]] = []
        for name, m in self.named_modules():
            if isinstance(m, Norm):
                out.append((f"{name}.hook_scale", m, "frozen_scale"))
            elif isinstance(m, Attention):
                out.append((f"{name}.hook_pattern", m, "frozen_pattern"))
        return out

    @property
    def is_frozen(self) -> bool:
        return any(getattr(m, attr) is not None for _, m, attr in self._freezable())

    @contextlib.contextmanager
    def frozen(self, reference: torch.Tensor | ActivationCache) -> Iterator["Transformer"]:
        """Inside: every attention pattern and every norm's scale is the reference run's, detached, so the
        model is affine in its residual stream from any point on, except through the MLPs (hook their
        outputs to replace them, e.g. with a transcoder's output plus a frozen error) and a logit soft-cap
        (cfg.linear_readout False).

        reference: tokens [batch, pos] (run once here), or an ActivationCache of such a run holding
        frozen_hook_names(). Runs inside may use the reference's batch (or stacked copies of it:
        batch k * batch) and its first positions; each attention projects values only (no queries or keys:
        hook_q / hook_k do not fire; no scores, q/k norms or rotary), its pattern passes through hook_pattern; hooks work as usual. Run on the
        reference's own tokens, the logits equal the normal forward's. Restored on exit, even on error.

            with model.frozen(tokens):
                logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", add)])
        """
        if self.is_frozen:
            raise CircuitlabError("the model is already in frozen mode; leave it before freezing it again")
        parts = self._freezable()
        names = [name for name, _, _ in parts]
        if isinstance(reference, ActivationCache):
            acts = reference.acts
            missing = [n for n in names if n not in acts]
            if missing:
                raise InputError(f"frozen mode: the reference cache lacks {missing[0]} (and {len(missing) - 1} "
                                 "more); cache model.frozen_hook_names() in the reference run")
        else:
            _, cache = self.run_with_cache(reference, names_filter=names)
            acts = cache.acts
        try:
            for name, m, attr in parts:
                setattr(m, attr, acts[name].detach())
            yield self
        finally:
            for _, m, attr in parts:
                setattr(m, attr, None)

    def loss(self, tokens: torch.Tensor, loss_mask: torch.Tensor | None = None,
             per_token: bool = False) -> torch.Tensor:
        """Next-token cross-entropy. tokens [batch, pos+1]: inputs tokens[:, :-1], targets tokens[:, 1:].

        loss_mask [batch, pos] (bool) keeps only the marked targets. Returns a scalar mean,
        or [batch, pos] when per_token.
        """
        tokens = torch.as_tensor(tokens)
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise InputError(f"the loss needs tokens [batch, pos+1] with at least 2 tokens per row (inputs and "
                             f"their next tokens), got shape {tuple(tokens.shape)}")
        check_tokens(tokens[:, 1:], self.cfg, "the loss's target tokens")  # the inputs are checked by forward
        logits = self(tokens[:, :-1])
        return lm_loss(logits, tokens[:, 1:], loss_mask, per_token)

    # ------------------------------------------------------------------ hooks
    def hook_points(self) -> dict[str, HookPoint]:
        return H.hook_points(self)

    def hook_names(self) -> list[str]:
        """Every hook name, in forward order."""
        return list(H.hook_points(self))

    def hooks(self, fwd_hooks: Sequence[tuple[H.NameOrFilter, H.HookFn]] = (),
              bwd_hooks: Sequence[tuple[H.NameOrFilter, H.HookFn]] = ()
              ) -> contextlib.AbstractContextManager[nn.Module]:
        """Context manager attaching hooks by name or filter; removed on exit, even on error."""
        return H.attach(self, fwd_hooks, bwd_hooks)

    def run_with_hooks(self, tokens: torch.Tensor, fwd_hooks: Sequence = (), bwd_hooks: Sequence = (),
                       **kwargs: Any) -> torch.Tensor:
        """Forward with hooks attached for this call only; returns logits [batch, pos, d_vocab]."""
        with self.hooks(fwd_hooks, bwd_hooks):
            return self(tokens, **kwargs)

    def run_with_cache(self, tokens: torch.Tensor, names_filter: H.NameOrFilter | Sequence[str] | None = None,
                       device: str | torch.device | None = None, incl_bwd: bool = False,
                       loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
                       ) -> tuple[torch.Tensor, ActivationCache]:
        """Forward, caching the activations named by names_filter (default: all).

        names_filter: None, a name, a list of names, or a callable name -> bool.
        incl_bwd: also cache d loss_fn(logits) / d activation in cache.grads (default loss: the mean
        next-token loss of tokens). The gradients come from torch.autograd.grad on the activations,
        with the embeddings' outputs made leaves, so no parameter's .grad is touched and frozen
        weights (requires_grad False) work.
        Returns (logits [batch, pos, d_vocab], ActivationCache). The cache is always detached.
        """
        points = self.hook_points()
        if names_filter is None:
            names = list(points)
        elif isinstance(names_filter, str) or callable(names_filter):
            names = [hp.name for hp in H.resolve(points, names_filter)]
        else:
            names = [hp.name for n in names_filter for hp in H.resolve(points, n)]
        acts: dict[str, torch.Tensor] = {}
        grads: dict[str, torch.Tensor] = {}

        def save(t: torch.Tensor, hook: HookPoint) -> None:
            t = t if incl_bwd else t.detach()
            acts[hook.name] = t.to(device) if device is not None and not incl_bwd else t

        if not incl_bwd:
            with self.hooks([(n, save) for n in names]), torch.no_grad():
                logits = self(tokens)
            return logits, ActivationCache(acts, grads, self)

        def leaf(t: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            return t.detach().requires_grad_(True)

        # Every path from the tokens starts at an embedding output: as leaves, they make every later
        # activation differentiable whatever the parameters' requires_grad.
        roots = [(n, leaf) for n in ("hook_embed", "hook_pos_embed") if n in points]
        with torch.enable_grad(), self.hooks(roots + [(n, save) for n in names]):
            logits = self(tokens)
            metric = loss_fn(logits) if loss_fn is not None else lm_loss(logits[:, :-1], tokens[:, 1:])
            if not isinstance(metric, torch.Tensor) or not metric.requires_grad or metric.numel() != 1:
                raise CircuitlabError("incl_bwd needs loss_fn(logits) to return one number computed from the "
                                      "logits with torch operations (so it has a gradient)")
            found = torch.autograd.grad(metric, list(acts.values()), allow_unused=True)
        for (name, act), g in zip(acts.items(), found):
            g = torch.zeros_like(act) if g is None else g.detach()
            grads[name] = g.to(device) if device is not None else g
        acts = {k: (v.detach().to(device) if device is not None else v.detach()) for k, v in acts.items()}
        logits = logits.detach()
        return logits, ActivationCache(acts, grads, self)

    # ------------------------------------------------------------------ sizes and generation
    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count; without embeddings it excludes W_E, W_pos and an untied W_U (and b_U)."""
        seen: set[int] = set()
        total = 0
        for name, p in self.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if not include_embeddings and name.split(".")[0] in ("embed", "pos_embed", "unembed"):
                continue
            total += p.numel()
        return total

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
                 use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample continuations. tokens [batch, pos] -> [batch, pos + new] (stops early at eos_id when
        every row has produced it). temperature 0 is greedy. Past n_ctx the context is cropped to
        the last n_ctx tokens and decoding continues without the cache."""
        from circuitlab.model.sampling import check_sampling, sample_next

        check_sampling(temperature, top_k, top_p)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
        tokens = check_tokens(tokens, self.cfg, "the prompt tokens")
        out = tokens
        cache = KVCache(self.cfg.n_layers) if use_cache else None
        next_input = tokens
        done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        for _ in range(max_new_tokens):
            if cache is not None and cache.length + next_input.shape[1] > self.cfg.n_ctx:
                cache = None  # out of context: fall back to the cropped, uncached path
            if cache is None:
                logits = self(out[:, -self.cfg.n_ctx:])[:, -1]
            else:
                logits = self(next_input, kv_cache=cache)[:, -1]
            nxt = sample_next(logits, temperature, top_k, top_p, generator)
            out = torch.cat([out, nxt[:, None]], dim=1)
            next_input = nxt[:, None]
            if eos_id is not None:
                done |= nxt == eos_id
                if bool(done.all()):
                    break
        return out


class KVCache:
    """Keys and values of every layer, for incremental decoding."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerKV() for _ in range(n_layers)]
        self.length = 0


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None,
            per_token: bool = False) -> torch.Tensor:
    """Cross-entropy of logits [batch, pos, d_vocab] against targets [batch, pos]."""
    losses = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    losses = losses.view(targets.shape)
    if per_token:
        return losses
    if loss_mask is not None:
        return (losses * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    return losses.mean()


@torch.no_grad()
def cache_estimate(model: Transformer, batch: int, n_pos: int, names_filter: H.NameOrFilter | Sequence[str] | None = None
                   ) -> Any:
    """What model.run_with_cache(tokens [batch, n_pos], names_filter) holds (circuitlab.memory.Estimate): every
    cached activation and the logits. Each hook's shape comes from the model itself, in two forward passes of 2
    and 3 tokens (the axes that grow with the prompt are its positions: [pos] or [pos, pos] for patterns). A logit
    soft-cap (Gemma-2) holds two more logit-sized tensors while it is applied (measured: 274 MiB against 266
    estimated on Gemma-2-2B's shape at 4 layers and 64 tokens)."""
    import circuitlab.memory as memory
    from circuitlab.perf import transformer_step_flops

    device = next(model.parameters()).device
    shapes = []
    for t in (2, 3):
        _, cache = model.run_with_cache(torch.zeros(1, t, dtype=torch.long, device=device), names_filter=names_filter)
        shapes.append({k: (tuple(v.shape), v.element_size()) for k, v in cache.items()})
    floats = 0
    size = 4
    for name, (two, size) in shapes[0].items():
        three = shapes[1][name][0]
        n = batch
        for a, b in zip(two[1:], three[1:]):
            n *= n_pos if b == a + 1 else a
        floats += n * size
    cfg = model.cfg
    logits = batch * n_pos * cfg.d_vocab * size
    parts: dict[str, float] = {"cache": floats, "logits": logits}
    if getattr(cfg, "logit_softcap", None) is not None:
        parts["the soft-cap's copies of the logits"] = 2 * logits
    return memory.Estimate(f"run_with_cache ({len(shapes[0])} hooks, {batch} x {n_pos} tokens)", parts,
                           held=memory.tensor_bytes(model),
                           flops=transformer_step_flops(cfg, batch * n_pos, n_pos, backward=False), efficiency=0.5)
