"""Attribution: the adjacency matrix of a prompt's graph, by batched backward passes.

    graph = attribute(model, transcoders, tokens)               # tokens [pos]
    graph.adjacency                                             # [n_nodes, n_nodes], rows = targets

A[target, source] is the direct effect of the source on the target through the frozen linear system
(replacement model, features fixed): for a feature target its encoder pre-activation, for a logit
target its demeaned logit (the logit minus the mean logit over the vocabulary; a logit difference is
demeaned already). Under a logit soft-cap (Gemma-2) the logit attributed is the one before the cap, as
circuit-tracer does (the cap is monotone per token); the targets and their weights are the real, capped
probabilities. A source contributes act * decoder vector (a feature; a cross-layer feature at every
layer it writes), its error vector (an error node) or its embedding (a token node); the edge is that
contribution dotted with the gradient of the target at the place it is added.

Each backward pass computes many target rows at once: the replacement model's linear system runs forward
once per span of positions (one copy of the prompt, ReplacementModel.linear_pass) and torch.autograd.grad with batched
gradients (is_grads_batched) gives every row's gradient at every MLP output and at the embedding. Rows
are grouped by layer, so a pass for layer-l targets runs backward through layers < l only, and by span
of positions, so it runs over the positions up to the span's end only (attention is causal).
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.checks import COUNT, SHARE
from circuitlab.errors import InputError
from circuitlab.graphs.attribution_graph import Graph, check_token_nodes, normalized
from circuitlab.graphs.options import DEFAULTS
from circuitlab.graphs.replacement import LinearPass, ReplacementModel
from circuitlab.graphs.transcoders import Transcoders, made_with
from circuitlab.model import model_dtype
from circuitlab.perf import ThreadGovernor, transformer_step_flops

if TYPE_CHECKING:
    from circuitlab.model import Transformer


# Memory bounds: shares of the memory budget (circuitlab.memory: the memory available now, or --memory). The
# graph's dense matrices grow with the square of its node count, so a long prompt or wide transcoders are
# refused before any backward pass, saying how many feature nodes fit; the rows of one backward pass grow with
# the batch, so batch_size is cut to what fits.


# Capped rows (cap x (active features + errors + tokens): long prompts) above this share of the budget are
# streamed to a file instead of memory (offload_folder()).
OFFLOAD_SHARE = 0.25


def graph_budget() -> int:
    """Floats the graph's dense matrices may take: the adjacency, pruning's float64 copy, the capped rows."""
    return memory.floats(memory.GRAPH_SHARE)


def pass_budget() -> int:
    """Floats one backward pass's batched gradients and rows may take."""
    return memory.floats(memory.PASS_SHARE)


def graph_floats(layers: torch.Tensor, transcoders: Transcoders, cap: int, n_pos: int, n_logits: int,
                 d_model: int, offloaded: bool = False) -> int:
    """Floats a graph's dense matrices take at once: layers [n_feat], each active feature's layer; cap: feature
    nodes kept (>= n_feat: all). The adjacency [n, n] (float32) and pruning's edge scores among the kept nodes
    (float64, 2 floats per entry); each feature's decoder vectors into every layer it writes; with a cap, the
    visited features' rows [cap, n_cols] (none in memory when offloaded to disk) and influence's walk over
    them ([cap, cap] float64 and a chunk of rows)."""
    n_feat, L = len(layers), transcoders.n_layers
    writes = sum(len(transcoders.writes(int(l))) * int(n) for l, n in zip(*layers.unique(return_counts=True)))
    n_nodes = min(cap, n_feat) + (L + 1) * n_pos + n_logits
    total = 3 * n_nodes ** 2 + writes * d_model
    if cap < n_feat:
        total += (0 if offloaded else cap * (n_feat + (L + 1) * n_pos)) + 2 * cap * cap + 3 * min(CHUNK_FLOATS, cap * n_feat)
    return total


def check_graph_size(layers: torch.Tensor, transcoders: Transcoders, cap: int, n_pos: int, n_logits: int,
                     d_model: int, budget: int | None = None, name: str = "max_feature_nodes (--max-feature-nodes)",
                     where: str = "", offloaded: bool = False) -> None:
    """A one-line InputError, before any backward pass, when the graph's dense matrices (graph_floats) would
    pass `budget` floats (default graph_budget()), saying how many feature nodes (`name`) would fit."""
    limit = None
    if budget is None:
        budget, limit = graph_budget(), memory.describe(memory.GRAPH_SHARE)
    need = graph_floats(layers, transcoders, cap, n_pos, n_logits, d_model, offloaded)
    if need <= budget:
        return
    n_feat = len(layers)
    lo, hi = -1, min(cap, n_feat) - 1            # the most feature nodes that fit: binary search (monotone)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if graph_floats(layers, transcoders, mid, n_pos, n_logits, d_model, offloaded) <= budget \
            else (lo, mid - 1)
    n_nodes = min(cap, n_feat) + (transcoders.n_layers + 1) * n_pos + n_logits
    fix = f"give {name} at most {lo} or a shorter prompt" if lo >= 1 else "give a shorter prompt"
    mb = lambda floats: f"{floats * 4 / 2**20:,.{0 if floats * 4 >= 10 * 2**20 else 2}f} MB"  # noqa: E731
    raise InputError(f"this graph would hold {n_nodes:,} nodes ({n_feat:,} active features over {n_pos} tokens): "
                     f"its dense matrices need {mb(need)} (limit {limit or mb(budget)}{where}); {fix}")


def row_floats(model: Transformer, n_cols: int, n_pos: int) -> int:
    """Floats one target row holds in a backward pass: its gradient at every MLP output and the embedding (kept
    until its adjacency row is made), the injected gradient at its layer's input, the working gradients through
    a block (norms, attention, skip: ~8 [pos, d_model], measured on GPT-2 small and Gemma-2-2B shapes with
    benchmarks/bench_scale.py), and its adjacency row [n_cols]. Vocabulary-sized only for the few logit
    rows (the gradient of one logit direction), which is not what a pass of feature rows is sized by."""
    cfg = model.cfg
    return n_pos * cfg.d_model * (2 * max(cfg.n_layers, 1) + 8) + n_cols


def rows_per_pass(model: Transformer, n_cols: int, n_pos: int) -> int:
    """Target rows one backward pass may hold within pass_budget() (row_floats each); at least 1."""
    return max(1, pass_budget() // row_floats(model, n_cols, n_pos))


# The share of the machine's matmul speed a backward pass of the frozen system reaches on a CPU (batched
# products of a few hundred rows; measured with benchmarks/bench_scale.py): turns flops into seconds.
PASS_EFFICIENCY = 0.5


class _Estimate(memory.Estimate):
    """The attribution's estimate, with the pass layout it decided (read back by _attribute)."""

    batch_size: int
    passes: int
    offload: bool


def estimate_attribution(model: Transformer, transcoders: Transcoders, features: torch.Tensor, n_pos: int, cap: int,
                         n_logits: int, batch_size: int, dtype: torch.dtype = torch.float32,
                         offload: bool = False) -> _Estimate:
    """What attribute() will hold at its peak beyond the model and transcoders, and its arithmetic, once the
    reference run has found the active features (features [n_active, 3] (layer, pos, feature); cap: feature
    nodes kept). Parts: the reference run's activations, the decoder columns, the dense adjacency, the capped
    rows, one backward pass."""
    cfg, tc = model.cfg, transcoders
    size = torch.empty(0, dtype=dtype).element_size()
    n_feat, L, T, d = len(features), tc.n_layers, n_pos, cfg.d_model
    n_cols = n_feat + (L + 1) * T
    n_nodes = min(cap, n_feat) + (L + 1) * T + n_logits
    d_sae = sum(tc.d_sae(layer) for layer in tc.layers)
    attn = cfg.n_layers * cfg.n_heads * T * T                                  # the frozen patterns
    parts = {"reference run": 4 * (T * d_sae + 2 * T * max(tc.d_sae(layer) for layer in tc.layers) + attn
                                   + 6 * L * T * d)}
    dec = 0
    for layer in tc.layers:
        pos = features[features[:, 0] == layer, 1]
        if len(pos):
            dec += T * int(torch.bincount(pos, minlength=T).max()) * len(tc.writes(layer)) * d
    parts["decoder columns"] = dec * size
    parts["adjacency"] = n_nodes ** 2 * size
    B = min(batch_size, rows_per_pass(model, n_cols, T))
    rows = min(cap, n_feat)
    if cap < n_feat:
        if not offload:
            parts["capped rows"] = cap * n_cols * size
        parts["influence"] = cap * cap * 8 + min(cap * n_feat, CHUNK_FLOATS) * 12   # [V, V] float64, a chunk
    parts["backward pass"] = B * row_floats(model, n_cols, T) * size
    parts["forward of the frozen system"] = 12 * cfg.n_layers * T * d * size
    heads = cfg.n_heads * cfg.head_dim
    per_row = T * (cfg.n_layers / 2) * (4 * d * heads + 2 * cfg.n_heads * T * cfg.head_dim
                                        + (2 * d * d if getattr(tc.dictionary(tc.layers[0]).cfg, "skip", False) else 0))
    per_row += 2 * n_cols * d
    flops = (rows + n_logits) * per_row
    est = _Estimate(f"the attribution graph ({n_feat:,} active features, {rows:,} feature nodes, "
                          f"{math.ceil(rows / B) + math.ceil(n_logits / B):,} backward passes of {B} rows)", parts,
                          held=memory.tensor_bytes(model, *{id(tc.dictionary(l_)): tc.dictionary(l_)
                                                              for l_ in tc.layers}.values()),
                          flops=flops, efficiency=PASS_EFFICIENCY)
    est.batch_size, est.passes = B, math.ceil(rows / B) + math.ceil(n_logits / B)
    est.offload = offload
    if offload:
        est.disk = (cap * n_cols * size, offload_folder())
    return est


def offload_folder() -> str:
    """Where capped rows too large for memory go: $CIRCUITLAB_OFFLOAD, else the temporary folder."""
    import tempfile

    return os.environ.get("CIRCUITLAB_OFFLOAD") or tempfile.gettempdir()


def _check_disk(n_bytes: int) -> None:
    import shutil

    folder = offload_folder()
    free = shutil.disk_usage(folder).free
    if free < 1.1 * n_bytes:
        raise InputError(f"the capped rows need {memory.gib(n_bytes)} on disk (over {OFFLOAD_SHARE:.0%} of the memory "
                         f"budget, so they are offloaded) but {folder} has {memory.gib(free)} free; set CIRCUITLAB_OFFLOAD "
                         "to a folder with room, or give fewer --max-feature-nodes")


def _disk_rows(n: int, m: int, dtype: torch.dtype) -> torch.Tensor:
    """A [n, m] zero tensor backed by a file in offload_folder() (deleted at once: the mapping keeps it until
    the tensor is freed). Its pages are the kernel's to write out and drop, so the rows do not stay in memory."""
    import tempfile

    size = torch.empty(0, dtype=dtype).element_size()
    fd, path = tempfile.mkstemp(prefix="circuitlab-rows-", suffix=".bin", dir=offload_folder())
    try:
        os.ftruncate(fd, max(1, n * m * size))
        rows = torch.from_file(path, shared=True, size=n * m, dtype=dtype)
    finally:
        os.close(fd)
        os.unlink(path)
    return rows.view(n, m)


@dataclass
class LogitTarget:
    """One logit node: a label, a direction over the vocabulary [d_vocab] (demeaned when used), its weight
    (the token's probability, or 1 for a named direction) and the token id (-1 for a direction)."""

    label: str
    direction: torch.Tensor
    weight: float
    token: int = -1


def top_logit_targets(logits: torch.Tensor, max_n_logits: int = DEFAULTS.max_n_logits,
                      desired_logit_prob: float = DEFAULTS.desired_logit_prob,
                      tokenizer: Any = None) -> list[LogitTarget]:
    """The most likely next tokens (logits [d_vocab]) until their probability adds to desired_logit_prob,
    at most max_n_logits."""
    probs = logits.double().softmax(-1)
    top_p, top_i = probs.topk(min(max_n_logits, probs.numel()))
    n = int(torch.searchsorted(top_p.cumsum(0), torch.tensor(desired_logit_prob, dtype=top_p.dtype))) + 1
    out = []
    for p, i in zip(top_p[:n].tolist(), top_i[:n].tolist()):
        onehot = torch.zeros_like(logits)
        onehot[i] = 1
        out.append(LogitTarget(_token_label(tokenizer, i), onehot, float(p), i))
    return out


def named_logit_targets(logits: torch.Tensor, targets: Sequence[Any], tokenizer: Any = None) -> list[LogitTarget]:
    """Targets the user names: token ids, (label, direction [d_vocab]) pairs or LogitTargets. A token's
    weight is its probability; a direction's is 1 (use LogitTarget to give another)."""
    probs = logits.double().softmax(-1)
    out = []
    for t in targets:
        if isinstance(t, LogitTarget):
            out.append(t)
        elif isinstance(t, int) and not isinstance(t, bool):
            if not 0 <= t < logits.numel():
                raise InputError(f"target token {t} is outside the vocabulary [0, {logits.numel()})")
            onehot = torch.zeros_like(logits)
            onehot[t] = 1
            out.append(LogitTarget(_token_label(tokenizer, t), onehot, float(probs[t]), t))
        elif isinstance(t, tuple) and len(t) == 2:
            label, vec = t
            vec = torch.as_tensor(vec, dtype=logits.dtype)
            if vec.shape != logits.shape:
                raise InputError(f"target direction {label!r} must be a [d_vocab={logits.numel()}] vector")
            out.append(LogitTarget(str(label), vec, 1.0))
        else:
            raise InputError(f"a target is a token id, a (label, direction) pair or a LogitTarget, got {t!r}")
    if not out:
        raise InputError("no targets given")
    return out


def logit_difference(tokenizer: Any, token: int, foil: int, d_vocab: int) -> LogitTarget:
    """The direction logit[token] - logit[foil] as one logit node (weight 1); the same token twice is refused
    (the difference is zero: the graph would explain nothing)."""
    if int(token) == int(foil):
        raise InputError(f"the foil {_token_label(tokenizer, foil)!r} is the target: give a different token to "
                         "contrast with (or no foil)")
    vec = torch.zeros(d_vocab)
    vec[token], vec[foil] = 1.0, -1.0
    return LogitTarget(f"{_token_label(tokenizer, token)} - {_token_label(tokenizer, foil)}", vec, 1.0)


def _token_label(tokenizer: Any, i: int) -> str:
    if tokenizer is None:
        return f"tok{i}"
    try:
        return tokenizer.decode([i])
    except Exception:  # noqa: BLE001 - a label only
        return f"tok{i}"


N_SPANS = 8  # feature targets are batched by span of positions: a pass runs over the positions up to its span's end


def _rss_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), or None where that cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _PeakMemory:
    """The peak growth of resident memory while the block runs, over what it was on entry: what the block's
    own work held at most (sampled every `every` seconds in a thread; the process's lifetime peak would
    count whatever ran before). growth_mb is None where memory cannot be read."""

    def __init__(self, every: float = 0.005) -> None:
        self.every, self.start, self.peak = every, _rss_bytes(), _rss_bytes()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(self.every):
            self._sample_once()

    def __enter__(self) -> "_PeakMemory":
        if self.start is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self._sample_once()

    def _sample_once(self) -> None:
        now = _rss_bytes()
        if now is not None and self.peak is not None:
            self.peak = max(self.peak, now)

    @property
    def growth_mb(self) -> float | None:
        return None if self.start is None or self.peak is None else (self.peak - self.start) / 2**20


class _Columns:
    """Turns gradients at the sources' places into adjacency columns (all sources, in node order).

    A source layer's features are laid out per position, padded to the most any position has ([T, m]), so
    that one batched product per (source layer, layer written) gives every row's edges from all of them:
    [pos, rows, d_model] @ [pos, d_model, m] (a product per position and layer was hundreds of small,
    strided matrix products per backward pass)."""

    @torch.no_grad()
    def __init__(self, rm: ReplacementModel, features: torch.Tensor, values: torch.Tensor, dtype: torch.dtype,
                 token_nodes: str = DEFAULTS.token_nodes):
        tc, T = rm.tc, rm.n_pos
        self.n_feat, self.T, self.L = len(features), T, tc.n_layers
        self.n_cols = self.n_feat + (self.L + 1) * T
        # Per target layer k: (pos [n], columns [n], slot [n] in the padded [T, m] layout, act * decoder vectors
        # into k [T, m, d_model]). Features are sorted by (layer, pos, feature): one layer's are adjacent columns.
        self.writes: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        for layer in tc.layers:
            mine = (features[:, 0] == layer).nonzero().flatten()
            if not len(mine):
                continue
            pos = features[mine, 1]
            counts = torch.bincount(pos, minlength=T)
            m = int(counts.max())
            first = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
            slot = pos * m + (torch.arange(len(mine), device=pos.device) - first[pos])   # [n] place in [T * m]
            dec = tc.decoder_vectors(layer, features[mine, 2]).to(dtype)          # [n, w, d]
            dec = dec * values[mine].to(dtype)[:, None, None]
            for i, k in enumerate(tc.writes(layer)):
                padded = dec.new_zeros(T * m, dec.shape[-1])
                padded[slot] = dec[:, i]
                self.writes.setdefault(k, []).append((mine, slot, padded.view(T, m, -1)))
        errs = torch.stack([rm.errors[k] for k in range(self.L)]).to(dtype).clone()   # [L, T, d]
        if rm.bos:
            errs[:, 0] = 0  # position 0's MLP output is a constant, not a node
        self.errors = errs
        self.embeds = rm.token_vectors(token_nodes).to(dtype)

    @torch.no_grad()
    def rows(self, grads_out: dict[int, torch.Tensor], grad_embed: torch.Tensor) -> torch.Tensor:
        """grads_out {layer: [rows, pos, d_model]}, grad_embed [rows, pos, d_model] -> [rows, n_cols]."""
        R, P = grad_embed.shape[:2]  # a pass over the first P positions: later sources get no gradient
        rows = grad_embed.new_zeros(R, self.n_cols)
        for k, g in grads_out.items():
            gt = g.transpose(0, 1)                                                   # [P, R, d]
            for cols, slot, dec in self.writes.get(k, ()):
                m = dec.shape[1]
                edges = torch.bmm(gt, dec[:P].transpose(1, 2)).transpose(0, 1)       # [R, P, m]
                seen = slot < P * m                                                  # sources at positions < P
                rows[:, cols[seen]] += edges.reshape(R, P * m)[:, slot[seen]]
            start = self.n_feat + k * self.T
            rows[:, start:start + P] = (g * self.errors[k][:P]).sum(-1)
        start = self.n_feat + self.L * self.T
        rows[:, start:start + P] = (grad_embed * self.embeds[:P]).sum(-1)
        return rows


def attribute(model: Transformer, transcoders: Transcoders, tokens: torch.Tensor, targets: Sequence[Any] | None = None,
              max_n_logits: int = DEFAULTS.max_n_logits, desired_logit_prob: float = DEFAULTS.desired_logit_prob,
              batch_size: int = DEFAULTS.batch_size,
              max_feature_nodes: int | None = None, bos: bool = False, tokenizer: Any = None,
              progress: bool = False, dtype: torch.dtype | None = None, prompt: str | None = None,
              verbose: bool = False, token_nodes: str = DEFAULTS.token_nodes) -> Graph:
    """The attribution graph of the next-token prediction at the prompt's last position (tokens [pos]).

    targets: None (the top tokens until desired_logit_prob, at most max_n_logits) or a list of token ids,
    (label, direction [d_vocab]) pairs and LogitTargets (see logit_difference).
    batch_size: target rows per backward pass (at most as many as fit pass_budget(), rows_per_pass).
    max_feature_nodes: keep at most this many feature nodes, visited greedily by their influence on the
    logits (estimated from the rows computed so far), for long prompts. A graph whose dense matrices would
    pass graph_budget() is refused in one line before any backward pass, saying how many would fit.
    bos: position 0 is an attention sink (circuit-tracer's convention): no features, no error node there.
    dtype: compute in this dtype (default: the model's).
    token_nodes: "embedding" (a token node is the whole embedding at its position: W_E[token] + W_pos[pos] on
    learned-position models) or "W_E" (the token's row alone, circuit-tracer's: the graph then equals its).
    Returns the unpruned Graph, with its timings and memory in graph.info: peak_mb, how much the
    process's resident memory grew at most while attributing (the computation's own peak), and
    adjacency_mb, the dense adjacency's size.
    """
    # Threads re-decided between backward passes (perf.ThreadGovernor): two threads while another process
    # holds a core made one graph 8x slower than one thread.
    n_pos, batch_size = int(tokens.shape[-1]), COUNT.check(batch_size, "batch_size")  # checked before it sizes the work
    with _PeakMemory() as peak, ThreadGovernor(transformer_step_flops(model.cfg, batch_size * n_pos, n_pos)) as gov:
        graph = _attribute(model, transcoders, tokens, targets, max_n_logits, desired_logit_prob, batch_size,
                           max_feature_nodes, bos, tokenizer, progress, dtype, prompt, gov, token_nodes, verbose)
    info = graph.info
    info["peak_mb"] = peak.growth_mb
    if verbose:
        s = info["seconds"]
        peak_note = "" if info["peak_mb"] is None else f", peak {info['peak_mb']:.0f} MB"
        print(f"attribution: {info['n_active_features']} active features ({graph.n_features} kept as nodes), "
              f"{graph.n_nodes} nodes, {info['backward_passes']} backward passes of up to {info['batch_size']} rows; "
              f"{s['total']:.2f} s (forward {s['forward']:.2f}, backward {s['backward']:.2f}); adjacency "
              f"{info['adjacency_mb']:.1f} MB{peak_note}")
    return graph


def _prepare(model: Transformer, transcoders: Transcoders, tokens: torch.Tensor, targets: Sequence[Any] | None,
             max_n_logits: int, desired_logit_prob: float, batch_size: int, max_feature_nodes: int | None,
             bos: bool, tokenizer: Any, dtype: torch.dtype) -> tuple[Any, ...]:
    """The checks, the reference run, the logit targets and the size check: everything before the estimate."""
    COUNT.check(batch_size, "batch_size")
    if max_feature_nodes is not None:
        COUNT.check(max_feature_nodes, "max_feature_nodes")
    desired_logit_prob = SHARE.check(desired_logit_prob, "desired_logit_prob")
    max_n_logits = COUNT.check(max_n_logits, "max_n_logits")
    rm = ReplacementModel(model, transcoders, tokens, bos=bos)
    features = rm.active_features                                       # [n, 3] sorted (layer, pos, feature)
    last = rm.logits[-1]
    logit_targets = (top_logit_targets(last, max_n_logits, desired_logit_prob, tokenizer) if targets is None
                     else named_logit_targets(last, targets, tokenizer))
    n_feat = len(features)
    cap = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    n_cols = n_feat + (transcoders.n_layers + 1) * rm.n_pos
    row_bytes = cap * n_cols * torch.empty(0, dtype=dtype).element_size()
    offload = cap < n_feat and row_bytes > OFFLOAD_SHARE * memory.budget_bytes()
    if offload:
        _check_disk(row_bytes)
    check_graph_size(features[:, 0], transcoders, cap, rm.n_pos, len(logit_targets), model.cfg.d_model,
                     offloaded=offload)
    est = estimate_attribution(model, transcoders, features, rm.n_pos, cap, len(logit_targets), batch_size, dtype,
                               offload)
    return rm, features, logit_targets, cap, est


def estimate_graph(model: Transformer, transcoders: Transcoders, tokens: torch.Tensor,
                   targets: Sequence[Any] | None = None,
                   max_n_logits: int = DEFAULTS.max_n_logits, desired_logit_prob: float = DEFAULTS.desired_logit_prob,
                   batch_size: int = DEFAULTS.batch_size,
                   max_feature_nodes: int | None = None, bos: bool = False, dtype: torch.dtype | None = None,
                   timed: bool = True) -> memory.Estimate:
    """What attribute() with these arguments will hold and how long it will take (tokens [pos]), from the
    reference run alone (one forward pass; no backward pass): `circuitlab graph --estimate`. A graph that would
    not fit is refused here as attribute() refuses it. timed: measure the machine's speed for the seconds."""
    dtype = dtype or model_dtype(model)
    est = _prepare(model, transcoders, tokens, targets, max_n_logits, desired_logit_prob, batch_size,
                   max_feature_nodes, bos, None, dtype)[-1]
    return est.timed() if timed else est


def _attribute(model: Transformer, transcoders: Transcoders, tokens: torch.Tensor, targets: Sequence[Any] | None,
               max_n_logits: int, desired_logit_prob: float, batch_size: int, max_feature_nodes: int | None,
               bos: bool, tokenizer: Any, progress: bool, dtype: torch.dtype | None, prompt: str | None,
               gov: ThreadGovernor, token_nodes: str = DEFAULTS.token_nodes, verbose: bool = False) -> Graph:
    t0 = time.perf_counter()
    token_nodes = check_token_nodes(token_nodes)
    dtype = dtype or model_dtype(model)
    rm, features, logit_targets, cap, est = _prepare(model, transcoders, tokens, targets, max_n_logits,
                                                     desired_logit_prob, batch_size, max_feature_nodes, bos,
                                                     tokenizer, dtype)
    if verbose:
        print(est.timed().line(), flush=True)
    n_feat, T, L = len(features), rm.n_pos, transcoders.n_layers
    n_logit = len(logit_targets)
    values = torch.zeros(0)
    if n_feat:
        values = torch.cat([rm.acts[int(l_)][features[features[:, 0] == l_, 1], features[features[:, 0] == l_, 2]]
                            for l_ in features[:, 0].unique().tolist()])   # sorted by layer, as features are
    t_setup = time.perf_counter() - t0

    cols = _Columns(rm, features, values, dtype, token_nodes)
    B = est.batch_size
    t1 = time.perf_counter()
    t_forward = 0.0
    n_passes = 0

    def linear_pass(n_pos: int, logits: bool = False) -> LinearPass:
        nonlocal t_forward
        t = time.perf_counter()
        lp = rm.linear_pass(n_pos, logits=logits)
        t_forward += time.perf_counter() - t
        return lp

    def backward(lp: LinearPass, inject: dict[int, torch.Tensor], logit_dirs: torch.Tensor | None) -> torch.Tensor:
        """Rows for targets injected at transcoder inputs ({layer: [rows, pos, d_in]}) or the logits
        ([rows, d_vocab]): one backward pass, every row's gradient at once (batched gradients, one copy
        of the forward). -> [rows, n_cols]."""
        nonlocal n_passes
        n_passes += 1
        gov.step()
        outputs, grads = [], []
        for layer, g in inject.items():
            outputs.append(lp.x[layer])
            grads.append(g[:, None].to(lp.x[layer].dtype))
        assert lp.embed is not None  # every pass sets its embedding leaf
        if logit_dirs is not None:
            assert lp.logits is not None  # a pass with logit rows keeps its logits
            outputs.append(lp.logits)
            grads.append(logit_dirs[:, None].to(lp.logits.dtype))
        top = L if logit_dirs is not None else max(inject)  # MLP outputs at or after a target's layer are not read
        out_layers = [k for k in sorted(lp.out) if k < top]
        found = torch.autograd.grad(outputs, [lp.out[k] for k in out_layers] + [lp.embed], grads,
                                    retain_graph=True, allow_unused=True, is_grads_batched=True)
        g_out = {k: g[:, 0].to(dtype) for k, g in zip(out_layers, found[:-1]) if g is not None}
        g_emb = found[-1][:, 0] if found[-1] is not None else lp.embed.new_zeros(len(grads[0]), *lp.embed.shape[1:])
        return cols.rows(g_out, g_emb.to(dtype))

    # Logit rows first (they also seed the influence order when feature nodes are capped).
    dirs = torch.stack([t.direction - t.direction.mean() for t in logit_targets])     # demeaned [n_logit, V]
    whole = linear_pass(T, logits=True)
    logit_rows_t = torch.cat([backward(whole, {}, dirs[i:i + B]) for i in range(0, n_logit, B)])
    weights = torch.tensor([t.weight for t in logit_targets], dtype=torch.float64)

    # Feature rows go straight into the adjacency when every feature is a node; with a cap, into their own
    # matrix first, in the order visited (which features become nodes is known only at the end): cap rows,
    # never one per active feature.
    n_nodes = (cap if cap < n_feat else n_feat) + (L + 1) * T + n_logit
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=dtype)
    if cap == n_feat:
        feature_rows = adjacency[:n_feat, :cols.n_cols]
    elif est.offload:   # long prompts: the rows stream to disk; influence reads them a chunk at a time
        feature_rows = _disk_rows(cap, cols.n_cols, dtype)
    else:
        feature_rows = torch.zeros(cap, cols.n_cols, dtype=dtype)
    visited = torch.zeros(n_feat, dtype=torch.bool)
    order = torch.zeros(cap, dtype=torch.long)   # with a cap: the feature of each row of feature_rows
    n_done = 0

    def feature_batch(lp: LinearPass, idx: torch.Tensor) -> None:
        nonlocal n_done
        inject: dict[int, torch.Tensor] = {}
        for layer in features[idx, 0].unique().tolist():
            sel = (features[idx, 0] == layer).nonzero().flatten()
            x = lp.x[layer]
            g = x.new_zeros(len(idx), lp.n_pos, x.shape[-1])
            vecs = transcoders.encoder_vectors(layer, features[idx[sel], 2]).detach().to(x.dtype)  # [n, d_in]
            g[sel, features[idx[sel], 1]] = vecs
            inject[layer] = g
        if cap == n_feat:
            feature_rows[idx] = backward(lp, inject, None)
        else:
            feature_rows[n_done:n_done + len(idx)] = backward(lp, inject, None)
            order[n_done:n_done + len(idx)] = idx
        n_done += len(idx)
        visited[idx] = True

    bar = tqdm(total=cap, desc="attribution", unit="feature", disable=not progress)
    if cap == n_feat:
        # Every feature, in batches of one layer and one span of positions: a pass for layer-l targets runs
        # backward through the layers below l only, and (attention is causal) over the positions up to the
        # span's end only.
        span = T if T < 16 else math.ceil(T / N_SPANS)
        ends = ((features[:, 1] // span + 1) * span).clamp(max=T)
        for end in ends.unique().tolist():
            lp = whole if end == T else linear_pass(int(end))
            for layer in features[:, 0].unique().tolist():
                mine = ((ends == end) & (features[:, 0] == layer)).nonzero().flatten()
                for i in range(0, len(mine), B):
                    feature_batch(lp, mine[i:i + B])
                    bar.update(len(mine[i:i + B]))
            del lp
    else:
        # Greedy: the features with the most influence on the logits so far, a few batches at a time.
        while int(visited.sum()) < cap:
            infl = _partial_influence(feature_rows[:n_done], order[:n_done], n_feat, logit_rows_t, weights)
            infl[visited] = -math.inf
            step = max(4 * B, cap // 16) if est.offload else 4 * B   # offloaded: each estimate reads the file
            todo = infl.argsort(descending=True)[:min(step, cap - int(visited.sum()))]
            todo = todo[features[todo, 0].argsort(stable=True)]
            for i in range(0, len(todo), B):
                feature_batch(whole, todo[i:i + B])
                bar.update(len(todo[i:i + B]))
    bar.close()
    del whole
    t_backward = time.perf_counter() - t1 - t_forward

    # Assemble: nodes = [selected features, errors (layer-major), tokens, logits].
    selected = visited.nonzero().flatten() if cap < n_feat else torch.arange(n_feat)
    n_src = n_nodes - n_logit
    if cap < n_feat:
        keep_cols = torch.cat([selected, torch.arange(n_feat, cols.n_cols)])
        slot = torch.empty(n_feat, dtype=torch.long)
        slot[order] = torch.arange(cap)
        chunk = row_chunk(cols.n_cols)
        for i in range(0, len(selected), chunk):   # a chunk at a time: no second copy of the capped rows
            j = min(i + chunk, len(selected))
            adjacency[i:j, :n_src] = feature_rows[slot[selected[i:j]]][:, keep_cols]
        adjacency[n_src:, :n_src] = logit_rows_t[:, keep_cols]
    else:
        adjacency[n_src:, :n_src] = logit_rows_t
    del feature_rows
    info = {"seconds": {"setup": t_setup, "forward": t_forward, "backward": t_backward,
                        "total": time.perf_counter() - t0},
            "n_active_features": n_feat, "n_feature_nodes": len(selected), "batch_size": B,
            "threads": gov.n, "thread_changes": gov.changes, "estimate": est.to_dict(),
            "backward_passes": n_passes, "adjacency_mb": adjacency.numel() * adjacency.element_size() / 2**20}
    token_strs = [_token_label(tokenizer, int(t)) for t in rm.tokens] if tokenizer is not None else None
    return Graph(tokens=rm.tokens.clone(), active_features=features, activations=values.to(dtype),
                 selected=selected, adjacency=adjacency, logit_labels=[t.label for t in logit_targets],
                 logit_tokens=torch.tensor([t.token for t in logit_targets], dtype=torch.long),
                 logit_weights=weights, n_layers=L, bos=bos, token_strs=token_strs, prompt=prompt,
                 transcoders=transcoders.describe(), info=info, token_nodes=token_nodes,
                 identity=made_with(model, transcoders))


CHUNK_FLOATS = 2 ** 24  # a chunk of rows made absolute (and float64) at a time: influence never copies all rows


def row_chunk(n_cols: int) -> int:
    """Rows of n_cols columns per chunk: CHUNK_FLOATS values (64 MiB of float32), at least 1."""
    return max(1, CHUNK_FLOATS // max(1, n_cols))


@torch.no_grad()
def _partial_influence(rows: torch.Tensor, order: torch.Tensor, n_feat: int, logit_rows: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
    """Each feature's influence on the weighted logits [n_feat] through the rows computed so far (the logit
    rows and the visited features' rows: rows [n_visited, n_cols], row j that of feature order[j]):
    w (Â + Â² + ...) without building the square matrix (a feature not yet visited has no row: nothing passes
    through it yet).

    Influence reaches an unvisited feature only through a visited row, so the walk runs on the visited
    features' own columns ([V, V]); one product with all the rows at the end (a chunk of rows made absolute at
    a time) carries it to every feature: memory is V² plus a chunk, never a copy of the [V, n_cols] rows."""
    a_logit = normalized(logit_rows)[:, :n_feat]
    start = weights.to(a_logit.dtype) @ a_logit                           # [n_feat]: straight into the logits
    V = len(rows)
    if not V:
        return start
    chunk = row_chunk(rows.shape[1])
    inv = torch.cat([1 / rows[i:i + chunk].abs().sum(1).clamp(min=1e-10) for i in range(0, V, chunk)])
    a_vv = rows[:, order].abs().to(start.dtype)                          # [V, V]: visited -> visited
    inv = inv.to(start.dtype)
    u, through = start[order], torch.zeros(V, dtype=start.dtype)
    for _ in range(V + 1):  # edges run from earlier layers to later ones: reaches zero
        if not bool(u.any()):
            break
        through += u
        u = (u * inv) @ a_vv
    else:
        raise RuntimeError("influence did not converge (the rows have a cycle)")
    factor = through * inv                                               # [V]
    total = start.clone()
    for i in range(0, V, chunk):
        total += factor[i:i + chunk] @ rows[i:i + chunk, :n_feat].abs().to(start.dtype)
    return total
