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

The memory plan and the estimate are graphs/plan.py; the columns a pass's gradients make, graphs/columns.py;
the capped rows (in memory or in a file) and the greedy choice's influence over them, graphs/rowstore.py;
the logit targets, graphs/targets.py.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.checks import COUNT, SHARE
from circuitlab.graphs.columns import Columns
from circuitlab.graphs.attribution_graph import Graph, check_token_nodes
# Re-exported: the names other modules, the tests and the docs use (graphs.attribution.graph_floats, ...).
from circuitlab.graphs.plan import (CHUNK_FLOATS, OFFLOAD_SHARE, PASS_EFFICIENCY, check_graph_size,  # noqa: F401
                                    estimate_attribution, graph_budget, graph_floats, offload_folder, offloads,
                                    pass_budget, row_chunk, row_floats, rows_per_pass)
from circuitlab.graphs.options import DEFAULTS
from circuitlab.graphs.replacement import LinearPass, ReplacementModel
from circuitlab.graphs.rowstore import RowStore, partial_influence
from circuitlab.graphs.targets import (LogitTarget, logit_difference, named_logit_targets,  # noqa: F401
                                       token_text, top_logit_targets)
from circuitlab.graphs.transcoders import Transcoders, made_with
from circuitlab.model import model_dtype
from circuitlab.perf import ThreadGovernor, transformer_step_flops

if TYPE_CHECKING:
    from circuitlab.model import Transformer

N_SPANS = 8  # feature targets are batched by span of positions: a pass runs over the positions up to its span's end


def _libc_trim() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def _release() -> None:
    """Give the memory a phase freed back to the system (glibc's malloc_trim): blocks under the allocator's mmap
    threshold (up to 32 MiB) stay in its heap when freed, so without this a pass's gradients, influence's copies
    and the next pass would add up in resident memory instead of taking turns."""
    if _TRIM is not None:
        _TRIM(0)


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
    n_pos, batch_size = int(tokens.shape[-1]), int(COUNT.check(batch_size, "batch_size"))  # checked before it sizes the work
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
    max_n_logits = int(COUNT.check(max_n_logits, "max_n_logits"))
    rm = ReplacementModel(model, transcoders, tokens, bos=bos, lean=True)   # no [pos, d_sae] per layer
    features = rm.active_features                                       # [n, 3] sorted (layer, pos, feature)
    last = rm.logits[-1]
    logit_targets = (top_logit_targets(last, max_n_logits, desired_logit_prob, tokenizer) if targets is None
                     else named_logit_targets(last, targets, tokenizer))
    n_feat = len(features)
    cap = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    offload = offloads(cap, n_feat, n_feat + (transcoders.n_layers + 1) * rm.n_pos, dtype)
    check_graph_size(features[:, 0], transcoders, cap, rm.n_pos, len(logit_targets), model.cfg.d_model,
                     offloaded=offload, positions=features[:, 1])
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


@dataclass
class _Run:
    """One attribution's state between its steps: the replacement model, the active features [n, 3], the
    columns, the thread governor, the compute dtype, the rows per pass (B), and its counters."""

    rm: ReplacementModel
    features: torch.Tensor
    cols: Columns
    gov: ThreadGovernor
    dtype: torch.dtype
    B: int
    t_forward: float = 0.0
    n_passes: int = 0


def _linear_pass(run: _Run, n_pos: int, logits: bool = False) -> LinearPass:
    """The frozen linear system over the first n_pos positions, its time counted as forward time."""
    t = time.perf_counter()
    lp = run.rm.linear_pass(n_pos, logits=logits)
    run.t_forward += time.perf_counter() - t
    return lp


def _backward(run: _Run, lp: LinearPass, inject: dict[int, torch.Tensor], logit_dirs: torch.Tensor | None
              ) -> torch.Tensor:
    """Rows for targets injected at transcoder inputs ({layer: [rows, pos, d_in]}) or the logits
    ([rows, d_vocab]): one backward pass, every row's gradient at once (batched gradients, one copy
    of the forward). -> [rows, n_cols]."""
    run.n_passes += 1
    run.gov.step()
    outputs, grads = [], []
    for layer, g in inject.items():
        outputs.append(lp.x[layer])
        grads.append(g[:, None].to(lp.x[layer].dtype))
    if logit_dirs is not None:
        assert lp.logits is not None, "the linear pass was made without logits"
        outputs.append(lp.logits)
        grads.append(logit_dirs[:, None].to(lp.logits.dtype))
    top = run.cols.L if logit_dirs is not None else max(inject)  # MLP outputs at or after a target's layer are unread
    out_layers = [k for k in sorted(lp.out) if k < top]
    assert lp.embed is not None
    found = torch.autograd.grad(outputs, [lp.out[k] for k in out_layers] + [lp.embed], grads,
                                retain_graph=True, allow_unused=True, is_grads_batched=True)
    g_out = {k: g[:, 0].to(run.dtype) for k, g in zip(out_layers, found[:-1]) if g is not None}
    g_emb = found[-1][:, 0] if found[-1] is not None else lp.embed.new_zeros(len(grads[0]), *lp.embed.shape[1:])
    del found
    return run.cols.rows(g_out, g_emb.to(run.dtype))


def _feature_rows(run: _Run, lp: LinearPass, idx: torch.Tensor) -> torch.Tensor:
    """The rows of the active features idx [k] (each target its encoder vector at its layer and position):
    one backward pass. -> [k, n_cols]."""
    features, tc = run.features, run.rm.tc
    inject: dict[int, torch.Tensor] = {}
    for layer in features[idx, 0].unique().tolist():
        sel = (features[idx, 0] == layer).nonzero().flatten()
        x = lp.x[layer]
        g = x.new_zeros(len(idx), lp.n_pos, x.shape[-1])
        vecs = tc.encoder_vectors(layer, features[idx[sel], 2]).detach().to(x.dtype)  # [n, d_in]
        g[sel, features[idx[sel], 1]] = vecs
        inject[layer] = g
    return _backward(run, lp, inject, None)


def _every_feature(run: _Run, whole: LinearPass, adjacency: torch.Tensor, bar: Any) -> None:
    """Every feature's row straight into the adjacency, in batches of one layer and one span of positions: a pass
    for layer-l targets runs backward through the layers below l only, and (attention is causal) over the
    positions up to the span's end only."""
    features, T, B = run.features, run.rm.n_pos, run.B
    span = T if T < 16 else math.ceil(T / N_SPANS)
    ends = ((features[:, 1] // span + 1) * span).clamp(max=T)
    for end in ends.unique().tolist():
        lp = whole if end == T else _linear_pass(run, int(end))
        for layer in features[:, 0].unique().tolist():
            mine = ((ends == end) & (features[:, 0] == layer)).nonzero().flatten()
            for i in range(0, len(mine), B):
                adjacency[mine[i:i + B], :run.cols.n_cols] = _feature_rows(run, lp, mine[i:i + B])
                _release()
                bar.update(len(mine[i:i + B]))
        del lp


def _greedy(run: _Run, whole: LinearPass, store: RowStore, cap: int, logit_rows: torch.Tensor,
            weights: torch.Tensor, offload: bool, bar: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """With a cap: the features with the most influence on the logits so far (partial_influence over the rows
    computed), a few batches at a time, their rows into the store in the order visited (which features become
    nodes is known only at the end: cap rows, never one per active feature). -> (visited [n_feat] bool,
    order [cap]: the feature of each stored row)."""
    n_feat, B = len(run.features), run.B
    visited = torch.zeros(n_feat, dtype=torch.bool)
    order = torch.zeros(cap, dtype=torch.long)
    n_done = 0
    while n_done < cap:
        infl = partial_influence(store, n_done, order, n_feat, logit_rows, weights)
        _release()
        infl[visited] = -math.inf
        step = max(4 * B, cap // 16) if offload else 4 * B   # offloaded: each estimate reads the file
        todo = infl.argsort(descending=True)[:min(step, cap - n_done)]
        todo = todo[run.features[todo, 0].argsort(stable=True)]
        for i in range(0, len(todo), B):
            idx = todo[i:i + B]
            store.write(n_done, _feature_rows(run, whole, idx))
            _release()
            order[n_done:n_done + len(idx)] = idx
            n_done += len(idx)
            visited[idx] = True
            bar.update(len(idx))
    return visited, order


def _assemble(adjacency: torch.Tensor, store: RowStore, visited: torch.Tensor, order: torch.Tensor,
              logit_rows: torch.Tensor, n_src: int) -> torch.Tensor:
    """The kept features' rows (in node order: sorted by feature) and the logit rows into the adjacency, a chunk
    of rows at a time (no second copy of the capped rows). -> selected [cap]."""
    n_feat, n_cols = len(visited), store.m
    selected = visited.nonzero().flatten()
    keep_cols = torch.cat([selected, torch.arange(n_feat, n_cols)])
    slot = torch.empty(n_feat, dtype=torch.long)
    slot[order] = torch.arange(len(order))
    chunk = row_chunk(n_cols)
    for i in range(0, len(selected), chunk):
        j = min(i + chunk, len(selected))
        adjacency[i:j, :n_src] = store.take(slot[selected[i:j]])[:, keep_cols]
    adjacency[n_src:, :n_src] = logit_rows[:, keep_cols]
    return selected


def _zeros(n: int, m: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, m] zeros whose pages are the kernel's zero pages until written (calloc): the adjacency's error and
    token rows (zero by construction) never take memory, so it costs its feature and logit rows only."""
    return torch.from_numpy(np.zeros(n * m * dtype.itemsize, dtype=np.uint8)).view(dtype).view(n, m)


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
    n_feat, T, L, n_logit = len(features), rm.n_pos, transcoders.n_layers, len(logit_targets)
    values = rm.active_values()
    t_setup = time.perf_counter() - t0
    run = _Run(rm, features, Columns(rm, features, values, dtype, token_nodes), gov, dtype, est.batch_size)
    t1 = time.perf_counter()
    # Logit rows first (they also seed the influence order when feature nodes are capped).
    dirs = torch.stack([t.direction - t.direction.mean() for t in logit_targets])     # demeaned [n_logit, V]
    whole = _linear_pass(run, T, logits=True)
    BL = est.logit_batch   # a logit row also holds a [pos, d_vocab] gradient
    logit_rows = torch.cat([_backward(run, whole, {}, dirs[i:i + BL]) for i in range(0, n_logit, BL)])
    weights = torch.tensor([t.weight for t in logit_targets], dtype=torch.float64)
    n_nodes = min(cap, n_feat) + (L + 1) * T + n_logit
    n_src = n_nodes - n_logit
    bar = tqdm(total=cap, desc="attribution", unit="feature", disable=not progress)
    if cap == n_feat:
        adjacency = _zeros(n_nodes, n_nodes, dtype)
        _every_feature(run, whole, adjacency, bar)
        del whole
        t_backward = time.perf_counter() - t1 - run.t_forward
        adjacency[n_src:, :n_src] = logit_rows
        selected = torch.arange(n_feat)
    else:
        with RowStore(cap, run.cols.n_cols, dtype, est.offload) as store:
            visited, order = _greedy(run, whole, store, cap, logit_rows, weights, est.offload, bar)
            del whole
            t_backward = time.perf_counter() - t1 - run.t_forward
            adjacency = _zeros(n_nodes, n_nodes, dtype)        # made after the passes: never held with them
            selected = _assemble(adjacency, store, visited, order, logit_rows, n_src)
    bar.close()
    info = {"seconds": {"setup": t_setup, "forward": run.t_forward, "backward": t_backward,
                        "total": time.perf_counter() - t0},
            "n_active_features": n_feat, "n_feature_nodes": len(selected), "batch_size": run.B,
            "threads": gov.n, "thread_changes": gov.changes, "estimate": est.to_dict(),
            "backward_passes": run.n_passes, "adjacency_mb": adjacency.numel() * adjacency.element_size() / 2**20}
    token_strs = [token_text(tokenizer, int(t)) for t in rm.tokens] if tokenizer is not None else None
    return Graph(tokens=rm.tokens.clone(), active_features=features, activations=values.to(dtype),
                 selected=selected, adjacency=adjacency, logit_labels=[t.label for t in logit_targets],
                 logit_tokens=torch.tensor([t.token for t in logit_targets], dtype=torch.long),
                 logit_weights=weights, n_layers=L, bos=bos, token_strs=token_strs, prompt=prompt,
                 transcoders=transcoders.describe(), info=info, token_nodes=token_nodes,
                 identity=made_with(model, transcoders))
