"""Activation patching: run the model on one prompt with an activation taken from another.

    clean, corrupt = tokens_a, tokens_b                     # [batch, pos], same shape
    metric = logit_diff(answer=12, wrong=7)                 # any fn(logits [batch, pos, d_vocab]) -> scalar
    res = activation_patching(model, clean, corrupt, metric, "head_out_by_pos")
    res.values        # [layer, pos, head]: the metric of the corrupted run with that one piece clean
    res.recovery()    # (patched - corrupted) / (clean - corrupted)

Directions: "denoise" (default) runs the corrupted prompt and patches in clean activations, so a
high value means "this piece is enough to restore the answer"; "noise" runs the clean prompt with
corrupted activations, so a low value means "the answer needs this piece".

Speed. Patches go in the batch dimension: a chunk of C patches is one forward pass over C copies
of the batch, each copy with its own patch (a boolean mask picks the source values), in chunks
sized to bound memory. Work whose result is known is skipped: a patch at layer l starts from the
cached residual stream entering layer l; a patch at position p recomputes positions >= p only
(attention is causal), reading earlier keys and values from the base run as in incremental
decoding; a patch of an activation computed per position after attention (z, attn_out, mlp_out,
...) changes its block's output at p only; and when the metric declares the positions it reads
(`metric.positions`, set by logit_diff, logprob and kl_to_clean), only those are unembedded.
Results equal patching one at a time with plain hooks (tested), up to float rounding.

Targets (TARGETS) say which hook is patched and which axes are swept, after `layer`:
resid_pre / resid_mid / resid_post / attn_out / mlp_out by pos; head_out (all positions) by head,
head_out_by_pos by (pos, head); q, k, v by head and q_by_pos, k_by_pos, v_by_pos by (pos, head)
(k and v have n_kv_heads heads under grouped-query attention); pattern by head and pattern_by_pos
by (head, dest_pos). A head's output is patched through its z ([batch, pos, head, d_head]): its
result is z @ W_O of that head alone, so patching one patches the other.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from circuitlab.display import Displayed
from circuitlab.analysis._json import rounded  # noqa: F401 (also imported from here)
from circuitlab.errors import CircuitlabError, did_you_mean
from circuitlab.model.components import LayerKV
from circuitlab.model.hooks import act_name

Metric = Callable[[torch.Tensor], torch.Tensor | float]
DIRECTIONS = ("denoise", "noise")
# Float elements one chunk may hold in its largest activations (about 256 MB in fp32).
CHUNK_BUDGET = 2 ** 26


# ---------------------------------------------------------------------------- metrics


def _named(fn: Callable, name: str, positions=None) -> Callable:
    """Name a metric; `positions` (int, list or [batch] tensor) declares the only logit positions it reads."""
    fn.__name__ = name
    if positions is not None:
        fn.positions = positions
    return fn


def read_positions(metric: Metric, n_pos: int) -> list[int] | None:
    """The sorted positions a metric declares it reads (metric.positions), or None for all of them.

    Patched runs then compute logits at these positions only; the others are NaN, so a metric that
    reads more than it declares gives NaN rather than a wrong number.
    """
    pos = getattr(metric, "positions", None)
    if pos is None:
        return None
    return sorted({int(p) % n_pos for p in torch.as_tensor(pos).flatten().tolist()})


def _index(value: int | Sequence[int] | torch.Tensor) -> int | torch.Tensor:
    """An int stays an int (plain indexing is cheapest); anything else becomes a LongTensor [batch]."""
    if isinstance(value, int):
        return value
    t = torch.as_tensor(value).long()
    return int(t) if t.dim() == 0 else t


def _pick(x: torch.Tensor, index: int | torch.Tensor) -> torch.Tensor:
    """x [batch, n, ...] -> [batch, ...]: entry `index` of dim 1 in every row, or index[b] in row b."""
    if isinstance(index, int):
        return x[:, index]
    return x[torch.arange(x.shape[0], device=x.device), index.to(x.device)]


def logit_diff(answer: int | Sequence[int] | torch.Tensor, wrong: int | Sequence[int] | torch.Tensor,
               pos: int | Sequence[int] | torch.Tensor = -1) -> Metric:
    """Metric: logit[answer] - logit[wrong] at `pos`, averaged over the batch.

    answer, wrong, pos: an int for every row, or one per row ([batch]).
    """
    answer, wrong, pos = _index(answer), _index(wrong), _index(pos)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        at = _pick(logits, pos)  # [batch, d_vocab]
        return (_pick(at, answer) - _pick(at, wrong)).mean()
    return _named(metric, "logit_diff", pos)


def logprob(answer: int | Sequence[int] | torch.Tensor, pos: int | Sequence[int] | torch.Tensor = -1) -> Metric:
    """Metric: log-probability of `answer` at `pos`, averaged over the batch."""
    answer, pos = _index(answer), _index(pos)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return _pick(_pick(logits, pos).float().log_softmax(-1), answer).mean()
    return _named(metric, "logprob", pos)


def kl_to_clean(clean_logits: torch.Tensor, pos: int | Sequence[int] | torch.Tensor = -1) -> Metric:
    """Metric: KL(clean || patched) of the next-token distributions at `pos`, averaged over the batch.

    clean_logits [batch, pos, d_vocab] from the clean run. 0 means the clean distribution is back.
    """
    pos = _index(pos)
    clean = _pick(clean_logits, pos).detach().float().log_softmax(-1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        patched = _pick(logits, pos).float().log_softmax(-1)
        return F.kl_div(patched, clean.to(patched.device), log_target=True, reduction="batchmean")
    return _named(metric, "kl_to_clean", pos)


def next_token_loss(tokens: torch.Tensor, mask: torch.Tensor | None = None) -> Metric:
    """Metric: mean next-token cross-entropy of `tokens` [batch, pos] (the run's own input).

    mask [batch, pos] (bool) keeps the predictions made at the marked positions (the last position
    has no target and is always left out).
    """
    targets = tokens[:, 1:]
    keep = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask[:, :-1].bool()

    def metric(logits: torch.Tensor) -> torch.Tensor:
        losses = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten().to(logits.device),
                                 reduction="none").view(targets.shape)
        k = keep.to(logits.device)
        return (losses * k).sum() / k.sum().clamp(min=1)
    return _named(metric, "next_token_loss")


def normalized(metric: Metric, clean_value: float, corrupt_value: float) -> Metric:
    """Metric: normalised recovery (metric - corrupt_value) / (clean_value - corrupt_value).

    1 = as on the clean prompt, 0 = as on the corrupted one.
    """
    if clean_value == corrupt_value:
        raise CircuitlabError("normalized(): the metric is the same on the clean and corrupted prompts "
                              f"({clean_value}), so there is nothing to recover; choose prompts it tells apart")

    def norm(logits: torch.Tensor) -> torch.Tensor:
        return (metric(logits) - corrupt_value) / (clean_value - corrupt_value)
    return _named(norm, f"normalized_{getattr(metric, '__name__', 'metric')}", getattr(metric, "positions", None))


# ---------------------------------------------------------------------------- targets


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


def get_target(model, name: str) -> Target:
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


def default_targets(model) -> list[str]:
    """DEFAULT_TARGETS that the model has hooks for."""
    return [t for t in DEFAULT_TARGETS if t in available_targets(model)]


def available_targets(model) -> list[str]:
    """Names of the targets this model has hooks for."""
    points = model.hook_points()
    return [n for n, t in TARGETS.items() if model.cfg.n_layers and act_name(t.hook, 0) in points]


# ---------------------------------------------------------------------------- input checks


def as_tokens(model, tokens: torch.Tensor | Sequence, what: str = "tokens") -> torch.Tensor:
    """tokens [batch, pos] or [pos] -> LongTensor [batch, pos] on the model's device, checked."""
    t = torch.as_tensor(tokens)
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2 or t.shape[1] == 0 or t.shape[0] == 0:
        raise CircuitlabError(f"{what} must be token ids shaped [batch, pos] or [pos], got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise CircuitlabError(f"{what} must be integer token ids, got {t.dtype}")
    if int(t.min()) < 0 or int(t.max()) >= model.cfg.d_vocab:
        raise CircuitlabError(f"{what} hold ids outside the vocabulary [0, {model.cfg.d_vocab}): "
                              f"min {int(t.min())}, max {int(t.max())}")
    if t.shape[1] > model.cfg.n_ctx:
        raise CircuitlabError(f"{what} have {t.shape[1]} positions, more than the model's context n_ctx="
                              f"{model.cfg.n_ctx}")
    return t.long().to(model_device(model))


def check_pair(model, clean, corrupt) -> tuple[torch.Tensor, torch.Tensor]:
    """Both prompts as token tensors [batch, pos] of the same shape, or a CircuitlabError."""
    clean, corrupt = as_tokens(model, clean, "clean tokens"), as_tokens(model, corrupt, "corrupted tokens")
    if clean.shape != corrupt.shape:
        raise CircuitlabError(
            f"clean and corrupted prompts must have the same shape [batch, pos] so that positions line up; got "
            f"clean {list(clean.shape)} and corrupted {list(corrupt.shape)} tokens (reword one prompt to match)")
    return clean, corrupt


def check_metric(model, metric: Metric, shape: tuple[int, int]) -> None:
    """Call the metric on zero logits [batch, pos, d_vocab]: it must return one number. Costs no forward pass."""
    if not callable(metric):
        raise CircuitlabError(f"the metric must be a function of the logits, got {type(metric).__name__}")
    param = next(model.parameters())
    dummy = torch.zeros(*shape, model.cfg.d_vocab, device=param.device, dtype=param.dtype)
    try:
        out = metric(dummy)
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure here is in the user's metric
        raise CircuitlabError(f"the metric failed on logits of shape {list(dummy.shape)}: "
                              f"{type(e).__name__}: {e}") from None
    numel = out.numel() if isinstance(out, torch.Tensor) else (1 if isinstance(out, (int, float)) else 0)
    if numel != 1:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CircuitlabError(f"the metric must return a scalar (one number) but returned {got} for logits "
                              f"{list(dummy.shape)}; reduce it, e.g. with .mean()")


def check_layers(model, layers: Sequence[int] | None) -> list[int]:
    n = model.cfg.n_layers
    if layers is None:
        return list(range(n))
    layers = [int(l) for l in layers]
    bad = [l for l in layers if not 0 <= l < n]
    if bad:
        raise CircuitlabError(f"layer(s) {bad} out of range: the model has {n} layers (0..{n - 1})")
    return layers


def check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise CircuitlabError(f"direction must be 'denoise' (clean into the corrupted run) or 'noise' "
                              f"(corrupted into the clean run), got {direction!r}")


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def metric_value(metric: Metric, logits: torch.Tensor) -> float:
    out = metric(logits)
    return float(out.item() if isinstance(out, torch.Tensor) else out)


# ---------------------------------------------------------------------------- the batched engine


@dataclass
class BaseRun:
    """What patched runs reuse from the unpatched run they modify.

    resid[l]: the residual stream entering layer l [batch, pos, d_model]; keys[l], values[l]: layer l's
    keys and values as the KV cache holds them (after rotary) [batch, pos, kv_head, d_head];
    logits [batch, pos, d_vocab].
    """

    resid: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor

    @classmethod
    def of(cls, model, tokens: torch.Tensor, names: Sequence[str] = ()):
        """Run `tokens` [batch, pos] once; returns (BaseRun, ActivationCache of the extra hook `names`)."""
        L = range(model.cfg.n_layers)
        k = "rot_k" if model.cfg.positional == "rotary" else "k"
        own = [act_name(n, l) for n in ("resid_pre", k, "v") for l in L]
        logits, cache = model.run_with_cache(tokens, names_filter=sorted(set(own) | set(names)))
        base = cls([cache["resid_pre", l] for l in L], [cache[k, l] for l in L], [cache["v", l] for l in L], logits)
        return base, cache


@dataclass
class Site:
    """One hook of a batched sweep: patch n sets act[:, index[n]] (over `dims`) to the source.

    source: [batch, ...] shared by all patches, or [n_patch, batch, ...] when per_patch (each
    broadcastable to the activation); dims: the activation dims (batch excluded) the columns of
    index [n_patch, len(dims)] address; empty dims patch the whole activation. pos_dim: the
    activation dim (batch excluded) holding the (query) position, needed to run from a later position.
    """

    hook: str
    source: torch.Tensor
    dims: tuple[int, ...]
    index: torch.Tensor
    per_patch: bool = False
    pos_dim: int | None = None

    def apply(self, act: torch.Tensor, rows: slice, start: int = 0) -> torch.Tensor:
        """act [chunk * batch, ...] with patch c of the chunk applied to rows c*batch .. c*batch + batch - 1.

        start: the first position the run computes (act holds positions start.. only).
        """
        idx = self.index[rows]
        src = self.source[rows] if self.per_patch else self.source
        if self.pos_dim is not None:  # the run may compute only some positions: take the same ones
            lead = 2 if self.per_patch else 1
            src = src.narrow(lead + self.pos_dim, start, act.shape[1 + self.pos_dim])
            if self.hook.endswith(("hook_pattern", "hook_attn_scores")):  # and only the keys it has
                src = src[..., : act.shape[-1]]
            if start and self.pos_dim in self.dims:
                idx = idx.clone()
                idx[:, self.dims.index(self.pos_dim)] -= start
        C = len(idx)
        grouped = act.view(C, -1, *act.shape[1:])  # [chunk, batch, ...]
        shape = [act.shape[1 + d] if d in self.dims else 1 for d in range(act.dim() - 1)]
        mask = torch.zeros(C, *shape, dtype=torch.bool, device=act.device)
        where = [torch.arange(C)]
        for d in range(act.dim() - 1):
            where.append(idx[:, self.dims.index(d)] if d in self.dims else torch.zeros(C, dtype=torch.long))
        mask[tuple(w.to(act.device) for w in where)] = True
        return torch.where(mask[:, None], src.to(act.device, act.dtype), grouped).view_as(act)


def chunk_size(model, batch: int, pos: int, eager: bool = False) -> int:
    """Patches per forward pass so that a chunk's largest activations stay within CHUNK_BUDGET floats."""
    cfg = model.cfg
    per_row = pos * (4 * cfg.d_model + cfg.d_vocab + (0 if cfg.attn_only else 2 * cfg.mlp_dim))
    if eager:  # scores and pattern are materialised
        per_row += 2 * cfg.n_heads * pos * pos
    return max(1, CHUNK_BUDGET // (per_row * batch))


def patched_run(model, base: BaseRun, layer: int, sites: Sequence[Site], rows: slice, start: int = 0,
                width: int | None = None, reads: Sequence[int] | None = None, stop: int | None = None,
                extra_hooks: Sequence = ()) -> tuple[torch.Tensor, list[int]]:
    """One chunk of patches in one forward pass, from the base run's residual stream entering `layer`.

    rows: which patches (of every site's index) form the chunk. The shortcuts skip work whose
    result is the base run's, or that nothing reads:
    start: patches at position >= start change nothing before it (attention is causal), so those
        positions are not recomputed; their keys and values come from the base run, as in
        incremental decoding.
    width: patches of activations computed per position after attention has mixed positions (z,
        attn_out, mlp_out, ...) change block `layer`'s output only at their own position, so that
        block runs on positions start .. start + width - 1 only, and the next block takes the base
        run's residual stream beyond them.
    reads: the only positions whose final output is used (the metric's, see read_positions). If
        the last block's input changed on that window only, it runs there (for the window's new
        keys and values) and at each read position after it, not at every position.
    Returns the residual stream leaving block stop - 1 (default: the last block) at the positions
    computed, [chunk, batch, n, d_model], and those n positions.
    """
    B, T = base.logits.shape[:2]
    C = rows.stop - rows.start
    end = model.cfg.n_layers if stop is None else stop
    hooks = [(s.hook, lambda act, hook, s=s: s.apply(act, rows, start)) for s in sites] + list(extra_hooks)
    x = base.resid[layer][:, start:T if width is None else start + width].repeat(C, 1, 1)
    positions = list(range(start, start + x.shape[1]))
    with model.hooks(fwd_hooks=hooks):
        for l in range(layer, end):
            kv = LayerKV()
            if start:
                kv.append(base.keys[l][:, :start].repeat(C, 1, 1, 1), base.values[l][:, :start].repeat(C, 1, 1, 1))
            done = start + x.shape[1]
            if l > layer and done < T and l == end - 1 and reads is not None and stop is None:
                outputs = [model.blocks[l](x, kv)]
                for r in (p for p in reads if p >= done):  # unchanged keys and values up to r, then r itself
                    gap = slice(kv.length, r)
                    kv.append(base.keys[l][:, gap].repeat(C, 1, 1, 1), base.values[l][:, gap].repeat(C, 1, 1, 1))
                    outputs.append(model.blocks[l](base.resid[l][:, r:r + 1].repeat(C, 1, 1), kv))
                    positions.append(r)
                x = torch.cat(outputs, dim=1)
                break
            if l > layer and done < T:  # beyond the window the previous block's output is the base run's
                x = torch.cat([x, base.resid[l][:, done:].repeat(C, 1, 1)], dim=1)
                positions = list(range(start, T))
            x = model.blocks[l](x, kv)
    return x.view(C, B, *x.shape[1:]), positions


def patched_logits(model, base: BaseRun, resid: torch.Tensor, positions: Sequence[int],
                   reads: Sequence[int] | None = None, buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [chunk, batch, pos, d_vocab] of a chunk, for the metric.

    resid [chunk, batch, n, d_model]: the final residual stream at `positions` (from patched_run);
    every other position is the base run's. reads: the only positions the metric reads
    (read_positions); then only those are filled, in `buffer` [>= chunk, batch, pos, d_vocab],
    which must hold NaN elsewhere (so a metric reading more than it declares gives NaN), and a view
    of it is returned.
    """
    C = resid.shape[0]
    base_logits = base.logits[None].expand(C, -1, -1, -1)
    if reads is None:  # positions are then one run, start .. done - 1
        start, done = positions[0], positions[-1] + 1
        logits = model.unembed(model.ln_final(resid))
        return torch.cat([base_logits[:, :, :start], logits, base_logits[:, :, done:]], dim=2)
    out = buffer[:C]
    where = {p: i for i, p in enumerate(positions)}
    inside = [p for p in reads if p in where]
    outside = [p for p in reads if p not in where]
    if inside:
        out[:, :, inside] = model.unembed(model.ln_final(resid[:, :, [where[p] for p in inside]])).to(out.dtype)
    if outside:
        out[:, :, outside] = base_logits[:, :, outside]
    return out


def logits_buffer(base: BaseRun, chunk: int, reads: Sequence[int] | None) -> torch.Tensor | None:
    """The NaN-filled buffer patched_logits needs when the metric declares its positions, else None."""
    return None if reads is None else torch.full((chunk, *base.logits.shape), float("nan"),
                                                 dtype=base.logits.dtype, device=base.logits.device)


def _chunks(positions: torch.Tensor | None, n: int, per_chunk: int, span: int) -> list[tuple[int, int, int]]:
    """(first, end, start position) of each chunk of patches, which are sorted by position.

    A chunk holds patches within `span` positions of its first one and runs from that position.
    """
    if positions is None:
        return [(lo, min(n, lo + per_chunk), 0) for lo in range(0, n, per_chunk)]
    out, lo = [], 0
    while lo < n:
        first = int(positions[lo])
        hi = lo + 1
        while hi < n and hi - lo < per_chunk and int(positions[hi]) < first + span:
            hi += 1
        out.append((lo, hi, first))
        lo = hi
    return out


@torch.no_grad()
def sweep(model, base: BaseRun, layer: int, sites: Sequence[Site], metric: Metric,
          batch_size: int | None = None, progress: bool = True, desc: str = "patching",
          positions: torch.Tensor | None = None, local: bool = False) -> torch.Tensor:
    """The metric after each of n_patch patches; patch n applies every site's n-th index at once.

    layer: the earliest layer any site touches. batch_size: patches per forward pass (default:
    chunk_size()). positions [n_patch]: the (query) position each patch touches, if it has one;
    patches are then grouped by position and run from there. local: the patches change block
    `layer`'s output at their own position only (see patched_run's `width`). Returns [n_patch].
    """
    B, T = base.logits.shape[:2]
    n = len(sites[0].index)
    eager = any(s.hook.endswith(("hook_pattern", "hook_attn_scores")) for s in sites)
    per_chunk = batch_size or chunk_size(model, B, T, eager)
    # Chunks spanning T/8 positions recompute about 1/8 more than one-position chunks, in 8x fewer passes.
    span = max(1, T // 8)
    order = torch.arange(n) if positions is None else positions.argsort(stable=True)
    if positions is not None:  # sort the patches by position, and the results back at the end
        sites = [dataclasses.replace(s, index=s.index[order], source=s.source[order] if s.per_patch else s.source)
                 for s in sites]
        positions = positions[order]
    chunks = _chunks(positions, n, per_chunk, span)
    reads = read_positions(metric, T)
    buffer = logits_buffer(base, max(hi - lo for lo, hi, _ in chunks), reads)
    out = torch.empty(n, dtype=torch.float64)  # metric values are Python floats; keep their precision
    with tqdm(total=n, desc=desc, unit="patch", delay=2.0, disable=not progress) as bar:
        for lo, hi, start in chunks:
            width = span if local and positions is not None else None
            resid, computed = patched_run(model, base, layer, sites, slice(lo, hi), start, width, reads)
            logits = patched_logits(model, base, resid, computed, reads, buffer)
            out[lo:hi] = torch.tensor([metric_value(metric, chunk) for chunk in logits], dtype=torch.float64)
            bar.update(hi - lo)
    return out[order.argsort()]


def grid_index(sizes: Sequence[int]) -> torch.Tensor:
    """Every combination of indices, last axis fastest: [prod(sizes), len(sizes)]."""
    return torch.tensor(list(itertools.product(*(range(s) for s in sizes))), dtype=torch.long).view(-1, len(sizes))


# ---------------------------------------------------------------------------- results


@dataclass
class PatchResult(Displayed):
    """Metric after each patch of one target.

    values [layer, *axes]: e.g. [layer, pos, head] for head_out_by_pos (layers as in `layers`);
    clean_value / corrupt_value: the metric on the unpatched clean and corrupted runs;
    method: "activation" (real patching) or "attribution" (its linear approximation).
    """

    target: str
    axes: tuple[str, ...]
    layers: list[int]
    values: torch.Tensor
    clean_value: float
    corrupt_value: float
    direction: str = "denoise"
    method: str = "activation"
    metric: str = "metric"

    @property
    def base_value(self) -> float:
        """The metric of the run being patched (corrupted when denoising, clean when noising)."""
        return self.corrupt_value if self.direction == "denoise" else self.clean_value

    def effect(self) -> torch.Tensor:
        """values - base_value [layer, *axes]: how much each patch moved the metric."""
        return self.values - self.base_value

    def recovery(self) -> torch.Tensor:
        """(values - corrupt) / (clean - corrupt) [layer, *axes]: 1 = clean behaviour, 0 = corrupted."""
        gap = self.clean_value - self.corrupt_value
        if gap == 0:
            return torch.full_like(self.values, float("nan"))
        return (self.values - self.corrupt_value) / gap

    def top(self, k: int = 5) -> list[tuple[dict[str, int], float]]:
        """The k patches that moved the metric most: ({axis: index}, effect)."""
        eff = self.effect()
        order = eff.abs().nan_to_num(-1.0).flatten().argsort(descending=True)[:k]
        out = []
        for i in order.tolist():
            idx = torch.unravel_index(torch.tensor(i), eff.shape)
            where = {"layer": self.layers[int(idx[0])], **{a: int(j) for a, j in zip(self.axes, idx[1:])}}
            out.append((where, float(eff.flatten()[i])))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "axes": ["layer", *self.axes], "layers": self.layers,
                "values": rounded(self.values), "clean_value": round(self.clean_value, 6),
                "corrupt_value": round(self.corrupt_value, 6), "direction": self.direction, "method": self.method,
                "metric": self.metric, "top": [{**w, "effect": round(e, 6)} for w, e in self.top()]}



# ---------------------------------------------------------------------------- activation patching


def check_request(model, clean, corrupt, metric: Metric, targets: Sequence[str], direction: str,
                  layers: Sequence[int] | None):
    """Every check of a patching request, before any compute. Returns (targets, layers, base tokens,
    source tokens, the hook names to cache): denoising runs the corrupted prompt and takes
    activations from the clean one, noising the other way round."""
    check_direction(direction)
    clean, corrupt = check_pair(model, clean, corrupt)
    check_metric(model, metric, tuple(clean.shape))
    chosen = [get_target(model, t) for t in targets]
    layers = check_layers(model, layers)
    base_tokens, source_tokens = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
    hooks = sorted({act_name(t.hook, l) for t in chosen for l in layers})
    return chosen, layers, base_tokens, source_tokens, hooks


def _prepare(model, clean, corrupt, metric: Metric, targets: Sequence[str], direction: str,
             layers: Sequence[int] | None):
    """Every check (before any compute), then the two cached runs shared by all targets."""
    chosen, layers, base_tokens, source_tokens, hooks = check_request(model, clean, corrupt, metric, targets,
                                                                      direction, layers)
    base, _ = BaseRun.of(model, base_tokens)
    source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=hooks)
    if direction == "denoise":
        values = (metric_value(metric, source_logits), metric_value(metric, base.logits))
    else:
        values = (metric_value(metric, base.logits), metric_value(metric, source_logits))
    return chosen, layers, base, source_cache, values


def _patch_target(model, target: Target, layers: list[int], base: BaseRun, source_cache, metric: Metric,
                  values: tuple[float, float], direction: str, batch_size: int | None, progress: bool
                  ) -> PatchResult:
    per_layer = []
    for l in layers:
        hook = act_name(target.hook, l)
        src = source_cache[hook]
        sizes = [src.shape[1 + d] for d in target.dims]
        index = grid_index(sizes)
        site = Site(hook, src, target.dims, index, pos_dim=target.pos_dim)
        positions = index[:, target.pos_axis] if target.pos_axis is not None else None
        per_layer.append(sweep(model, base, l, [site], metric, batch_size, progress,
                               desc=f"patching {target.name} L{l}", positions=positions,
                               local=target.local).view(sizes))
    return PatchResult(target.name, target.axes, layers, torch.stack(per_layer), values[0], values[1], direction,
                       metric=getattr(metric, "__name__", "metric"))


def activation_patching(model, clean_tokens, corrupt_tokens, metric: Metric, target: str = "resid_pre", *,
                        direction: str = "denoise", layers: Sequence[int] | None = None,
                        batch_size: int | None = None, progress: bool = True) -> PatchResult:
    """Patch every piece of `target` one at a time (batched) and record the metric.

    clean_tokens, corrupt_tokens [batch, pos] (same shape; [pos] is one prompt).
    metric: fn(logits [batch, pos, d_vocab]) -> scalar, e.g. logit_diff(...).
    target: a name in TARGETS. layers: which layers to sweep (default all).
    batch_size: patches per forward pass (default: as many as fit a memory budget); 1 is one at a time.
    Returns PatchResult with values [layer, *target axes], e.g. [layer, pos, head] for head_out_by_pos.
    """
    return patching_sweep(model, clean_tokens, corrupt_tokens, metric, [target], direction=direction,
                          layers=layers, batch_size=batch_size, progress=progress)[target]


def patching_sweep(model, clean_tokens, corrupt_tokens, metric: Metric, targets: Sequence[str] | None = None,
                   *, direction: str = "denoise", layers: Sequence[int] | None = None,
                   batch_size: int | None = None, progress: bool = True) -> dict[str, PatchResult]:
    """activation_patching for several targets, sharing the clean and corrupted runs.

    targets: default DEFAULT_TARGETS that the model has; naming one it lacks (mlp_out on an
    attention-only model) is an error; available_targets(model) lists all it has.
    Returns {target: PatchResult}.
    """
    targets = default_targets(model) if targets is None else [targets] if isinstance(targets, str) else targets
    chosen, layers, base, source_cache, values = _prepare(model, clean_tokens, corrupt_tokens, metric, targets,
                                                          direction, layers)
    return {t.name: _patch_target(model, t, layers, base, source_cache, metric, values, direction, batch_size,
                                  progress) for t in chosen}
