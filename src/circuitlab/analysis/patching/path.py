"""Path patching: the effect of one head on another head's query, key or value input.

Activation patching says a head matters; path patching says through which path. For a sender
head S and a receiver head R (in a later layer) reading input x in {q, k, v}:

1. run the clean prompt with S's output taken from the corrupted run and every other head's
   output and every MLP output up to R's layer frozen at their clean values, so the only change
   reaching R is S's direct contribution; record R's x (R's slice of hook_q / hook_k / hook_v);
2. run the clean prompt again with only R's x replaced by the recorded one, and measure.

If the metric moves, S's output reaches the logits through R's x (Wang et al., 2022). For an
induction head this separates K-composition with a previous-token head (the key path moves the
metric) from Q- and V-composition (they do not).

    res = path_patching(model, clean, corrupt, metric, receiver=(1, 4), receiver_input="k")
    res.values[0, 2]   # the metric when L0H2's corrupted output reaches L1H4's keys and nothing else

Senders are batched like activation patching: one forward pass per chunk of senders for step 1, and
step 2 is patching.sweep with one recorded input per patch, each starting at the first layer it changes. A head's output is patched through
its z, as in activation patching. Under grouped-query attention a receiver's k and v are shared by
its kv group, so patching them affects every query head in the group.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.analysis.patching import (BaseRun, Metric, Site, check_metric, check_pair, chunk_size,
                                          gap_within_noise, metric_value, patched_run, rounded, sweep)
from circuitlab.analysis.patching.engine import PATCH_EFFICIENCY, base_run_floats, chunk_floats
from circuitlab.analysis.patching.metrics import read_positions
from circuitlab.errors import CircuitlabError
from circuitlab.model.hooks import act_name
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

INPUTS = ("q", "k", "v")


@dataclass
class PathPatchResult:
    """Path patching from sender heads to one receiver head's input.

    values [layer, head]: the metric with that sender's path patched (NaN for heads not tried:
    those in the receiver's layer or later); clean_value / corrupt_value: the unpatched runs.
    """

    receiver: tuple[int, int]
    receiver_input: str
    values: torch.Tensor
    clean_value: float
    corrupt_value: float
    metric: str = "metric"

    def effect(self) -> torch.Tensor:
        """values - clean_value [layer, head]: how far each path moved the clean metric."""
        return self.values - self.clean_value

    def recovery(self) -> torch.Tensor:
        """(values - corrupt) / (clean - corrupt) [layer, head]: 1 = path unused, 0 = the whole corruption."""
        gap = self.clean_value - self.corrupt_value
        return (self.values - self.corrupt_value) / gap if gap else torch.full_like(self.values, float("nan"))

    def top(self, k: int = 3) -> list[tuple[tuple[int, int], float]]:
        """The k senders whose path moved the metric most: ((layer, head), effect)."""
        eff = self.effect().nan_to_num(0.0)
        order = eff.abs().flatten().argsort(descending=True)[:k].tolist()
        H = eff.shape[1]
        return [((i // H, i % H), float(eff.flatten()[i])) for i in order]

    def to_dict(self) -> dict[str, Any]:
        l, h = self.receiver
        return {"receiver": head_name(l, h), "receiver_input": self.receiver_input, "values": rounded(self.values),
                "clean_value": round(self.clean_value, 6), "corrupt_value": round(self.corrupt_value, 6),
                "metric": self.metric,
                "gap_within_noise": gap_within_noise(self.clean_value, self.corrupt_value),  # GAP_FLOOR only
                "top": [{"sender": head_name(*s), "effect": round(e, 6)} for s, e in self.top()]}


def _check_heads(model: Transformer, receiver, receiver_input: str, senders) -> list[tuple[int, int]]:
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if receiver_input not in INPUTS:
        raise CircuitlabError(f"receiver_input must be one of q, k, v; got {receiver_input!r}")
    try:
        rl, rh = (int(x) for x in receiver)
    except (TypeError, ValueError):
        raise CircuitlabError(f"receiver must be a (layer, head) pair, got {receiver!r}") from None
    if not (1 <= rl < L and 0 <= rh < H):
        raise CircuitlabError(f"receiver L{rl}H{rh} does not exist or has no earlier heads: it must be in layers "
                              f"1..{L - 1} and heads 0..{H - 1}")
    if senders is None:
        return [(l, h) for l in range(rl) for h in range(H)]
    out = []
    for s in senders:
        sl, sh = (int(x) for x in s)
        if not (0 <= sl < rl and 0 <= sh < H):
            raise CircuitlabError(f"sender L{sl}H{sh} must be a head in a layer before the receiver's "
                                  f"(layers 0..{rl - 1}, heads 0..{H - 1})")
        out.append((sl, sh))
    return out


def path_patching_estimate(model: Transformer, batch: int, pos: int, receiver_layer: int | None = None,
                           n_senders: int | None = None) -> memory.Estimate:
    """What path_patching on prompts [batch, pos] into a head of `receiver_layer` (default: the last layer, the
    most senders) from n_senders heads (default: every earlier head) holds at its peak and computes: the clean
    base run with every earlier head's z and MLP output, the corrupted run's z, the receiver inputs recorded for
    one sender layer's heads, and a chunk of patched copies (chunk_size). Each sender costs a run up to the
    receiver and one from the receiver on."""
    from circuitlab.model import model_dtype
    from circuitlab.perf import block_weights

    cfg = model.cfg
    rl = cfg.n_layers - 1 if receiver_layer is None else receiver_layer
    n = rl * cfg.n_heads if n_senders is None else n_senders
    size = model_dtype(model).itemsize
    heads, mlp = cfg.n_heads * cfg.head_dim, (cfg.d_model if cfg.has_mlp else 0)
    cached = batch * pos * rl * (2 * heads + mlp) + batch * pos * cfg.d_vocab   # clean z, MLP outs; corrupted z, logits
    per_chunk = min(chunk_size(model, batch, pos), cfg.n_heads, max(1, n))   # a sender layer's heads at most
    parts = {"base run": base_run_floats(model, batch, pos) * size, "cached heads and MLPs": cached * size,
             "recorded receiver inputs": min(n, cfg.n_heads) * batch * pos * cfg.head_dim * size,
             "a chunk of patched runs": per_chunk * batch * chunk_floats(model, pos) * size}
    per_token = 2 * block_weights(cfg) + 4 * pos * heads
    # each sender: a run from its layer to the receiver, one from the receiver on (about half the model and a
    # layer, on average) and the read-out at the metric's position
    flops = n * batch * (pos * (cfg.n_layers / 2 + 1) * per_token + 2 * cfg.d_model * cfg.d_vocab)
    return memory.Estimate(f"path patching ({n} sender heads into layer {rl}, {batch} x {pos} tokens)", parts,
                           held=memory.tensor_bytes(model), flops=flops, efficiency=PATCH_EFFICIENCY)


@torch.no_grad()
def path_patching(model: Transformer, clean_tokens, corrupt_tokens, metric: Metric, receiver: tuple[int, int],
                  receiver_input: str = "k", senders: Sequence[tuple[int, int]] | None = None, *,
                  batch_size: int | None = None, progress: bool = True) -> PathPatchResult:
    """Effect of each sender head's corrupted output on the metric, through the receiver head's input only.

    clean_tokens, corrupt_tokens [batch, pos] (same shape). metric: fn(logits [batch, pos, d_vocab]) -> scalar.
    receiver: (layer, head); receiver_input: "q", "k" or "v"; senders: (layer, head) pairs in earlier
    layers (default: all of them). batch_size: senders per forward pass.
    Returns PathPatchResult with values [layer, head].
    """
    senders = _check_heads(model, receiver, receiver_input, senders)
    clean, corrupt = check_pair(model, clean_tokens, corrupt_tokens)
    check_metric(model, metric, tuple(clean.shape))
    rl, rh = receiver
    cfg = model.cfg
    slot = rh // (cfg.n_heads // cfg.kv_heads) if receiver_input != "q" else rh  # the receiver's k/v head
    receiver_hook = act_name(receiver_input, rl)

    z = [act_name("z", l) for l in range(rl)]
    mlp = [act_name("mlp_out", l) for l in range(rl)] if cfg.has_mlp else []
    base, clean_cache = BaseRun.of(model, clean, z + mlp)
    corrupt_logits, corrupt_cache = model.run_with_cache(corrupt, names_filter=z)
    clean_value, corrupt_value = metric_value(metric, base.logits), metric_value(metric, corrupt_logits)

    B, T = clean.shape
    per_chunk = batch_size or chunk_size(model, B, T)
    values = torch.full((cfg.n_layers, cfg.n_heads), float("nan"), dtype=torch.float64)
    by_layer: dict[int, list[int]] = {}
    for l, h in senders:
        by_layer.setdefault(l, []).append(h)
    with tqdm(total=len(senders), desc=f"path patching -> L{rl}H{rh}.{receiver_input}", unit="sender",
              delay=2.0, disable=not progress) as bar:
        for sl, heads in sorted(by_layer.items()):
            n = len(heads)
            everything = torch.zeros(n, 0, dtype=torch.long)  # a site with no dims patches the whole activation
            # Step 1: the sender's z from the corrupted run; everything after it, up to the receiver, frozen clean.
            sites = [Site(act_name("z", sl), corrupt_cache[act_name("z", sl)], (1,), torch.tensor(heads)[:, None])]
            sites += [Site(name, clean_cache[name], (), everything) for name in z[sl + 1:] + mlp[sl:]]
            recorded = []
            for lo in range(0, n, per_chunk):
                rows = slice(lo, min(n, lo + per_chunk))
                seen: list[torch.Tensor] = []
                record = (receiver_hook, lambda act, hook: seen.append(act[:, :, slot:slot + 1].clone()))
                patched_run(model, base, sl, sites, rows, stop=rl + 1, extra_hooks=[record])
                recorded.append(seen[0].view(rows.stop - rows.start, B, T, 1, -1))
            # Step 2: a clean run from the receiver's layer with only the receiver's input replaced: an
            # activation-patching sweep whose n patches each bring their own recorded input.
            site = Site(receiver_hook, torch.cat(recorded), (1,), torch.full((n, 1), slot), per_patch=True)
            values[sl, heads] = sweep(model, base, rl, [site], metric, per_chunk, progress=False)
            bar.update(n)
    return PathPatchResult((rl, rh), receiver_input, values, clean_value, corrupt_value,
                           getattr(metric, "__name__", "metric"))


@dataclass
class DirectPathResult:
    """Path patching from each head straight to the logits (Wang et al.'s sender -> logits): values [layer, head],
    the metric when only that head's direct path carries its corrupted output; clean_value / corrupt_value: the
    unpatched runs. effect() < 0: the head's direct output raises the metric (a name mover, for the IO - S logit
    difference); > 0: it lowers it (a negative name mover)."""

    values: torch.Tensor
    clean_value: float
    corrupt_value: float
    metric: str = "metric"

    def effect(self) -> torch.Tensor:
        """values - clean_value [layer, head]."""
        return self.values - self.clean_value

    def ranked(self, k: int = 5, sign: int = -1) -> list[tuple[str, float]]:
        """The k heads whose direct path moved the metric most in direction `sign` (-1: lowered it): (name, effect)."""
        eff = (self.effect() * sign).flatten()
        order = eff.argsort(descending=True)[:k].tolist()
        H = self.values.shape[1]
        return [(head_name(i // H, i % H), float(self.effect().flatten()[i])) for i in order if eff[i] > 0]

    def to_dict(self) -> dict[str, Any]:
        return {"values": rounded(self.values), "clean_value": round(self.clean_value, 6),
                "corrupt_value": round(self.corrupt_value, 6), "metric": self.metric,
                "lowers": [{"head": h, "effect": round(e, 6)} for h, e in self.ranked(5, -1)],
                "raises": [{"head": h, "effect": round(e, 6)} for h, e in self.ranked(5, 1)]}


@torch.no_grad()
def path_patching_to_logits(model: Transformer, clean_tokens, corrupt_tokens, metric: Metric) -> DirectPathResult:
    """Each head's corrupted output reaching the logits through the residual stream alone, every other head and MLP
    frozen at its clean value (path patching with the logits as the receiver).

    Freezing everything downstream leaves the final residual stream the clean one plus that head's change,
    z_corrupt - z_clean of the head through W_O (the residual decomposition's part of the head): so one readout
    per head, where the engine would rerun the layers after it (tests: the same number from frozen hooks).
    clean_tokens, corrupt_tokens [batch, pos] (same shape). Returns DirectPathResult, values [layer, head].
    """
    clean, corrupt = check_pair(model, clean_tokens, corrupt_tokens)
    check_metric(model, metric, tuple(clean.shape))
    cfg = model.cfg
    if cfg.block_norms != "pre":
        raise CircuitlabError("path patching to the logits reads the residual stream as a sum of parts: it needs "
                              "pre-norm blocks (a post-norm block rescales every earlier part)")
    names = ["hook_embed", "hook_pos_embed"] + [act_name(n, l) for l in range(cfg.n_layers)
                                               for n in ("z", "mlp_out", "resid_post")]
    logits, clean_cache = model.run_with_cache(clean, names_filter=lambda n: n in names)
    corrupt_logits, corrupt_cache = model.run_with_cache(corrupt, names_filter=lambda n: n.endswith("hook_z"))
    clean_value, corrupt_value = metric_value(metric, logits), metric_value(metric, corrupt_logits)
    final = clean_cache[act_name("resid_post", cfg.n_layers - 1)]   # [batch, pos, d_model]
    values = torch.full((cfg.n_layers, cfg.n_heads), float("nan"), dtype=torch.float64)
    T = clean.shape[1]
    reads = read_positions(metric, T) or list(range(T))   # only these positions are unembedded; the rest NaN
    patched = torch.full_like(logits, float("nan"))
    W_O = model.W_O
    for layer in range(cfg.n_layers):
        z_change = (corrupt_cache["z", layer] - clean_cache["z", layer])[:, reads]
        change = torch.einsum("bphd,hdm->hbpm", z_change, W_O[layer])   # each head's part, as the decomposition's
        for head in range(cfg.n_heads):
            patched[:, reads] = model.readout(final[:, reads] + change[head]).to(patched.dtype)
            values[layer, head] = metric_value(metric, patched)
    return DirectPathResult(values, clean_value, corrupt_value, getattr(metric, "__name__", "metric"))
