"""The attribution graph's memory plan: what it holds, checked against the budget before any backward pass.

    check_graph_size(layers, tc, cap, n_pos, n_logits, d_model)   # one line when the dense parts do not fit
    rows_per_pass(model, n_cols, n_pos)                           # target rows one backward pass may hold
    estimate_attribution(model, tc, features, n_pos, cap, ...)    # memory.Estimate, said before the work

What attribute() holds beyond the model and transcoders, by phase (none of them grows with the prompt's
length past the feature cap apart from a row's columns, the reference run and the attention patterns):

- the reference run: each layer's feature activations [pos, d_sae], the logits [pos, d_vocab], the frozen
  attention patterns [layers, heads, pos, pos] and the residual inputs and outputs;
- the backward passes: B rows of row_floats each (their gradients at every MLP output) and, one (source
  layer, written layer) block at a time, the active features' decoder vectors times their activations
  (gathered from the transcoders in their storage dtype each pass: never one float32 copy per active
  feature);
- with a cap, the visited rows [cap, n_cols] (in memory, or in a file when they pass OFFLOAD_SHARE of the
  budget: read back a chunk at a time, never mapped, so they are the page cache's and not this process's)
  and the greedy choice's influence walk ([cap, cap] float64 and a chunk of rows);
- the adjacency [n_nodes, n_nodes], of which only the feature and logit rows are ever written (error and
  token rows are zero: their pages are never touched), made after the backward passes when capped.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import torch

import circuitlab.memory as memory
from circuitlab.errors import InputError

if TYPE_CHECKING:
    from circuitlab.graphs.transcoders import Transcoders
    from circuitlab.model import Transformer

# Capped rows (cap x (active features + errors + tokens): long prompts) above this share of the budget are
# written to a file instead of memory (offload_folder()).
OFFLOAD_SHARE = 0.25
CHUNK_FLOATS = 2 ** 24  # a chunk of rows made absolute (and float64) at a time: influence never copies all rows
# The share of the machine's matmul speed a backward pass of the frozen system reaches on a CPU (batched
# products of a few hundred rows; measured with benchmarks/bench_scale.py): turns flops into seconds.
PASS_EFFICIENCY = 0.5
# What the first backward pass adds beside its tensors (autograd's engine, thread pools, the allocator's slack):
# ~25 MiB measured on the tests' small shapes (tests/test_memory.py), where it is a third of the peak.
RUNTIME_BYTES = 32 * 2 ** 20


def graph_budget() -> int:
    """Floats the graph's dense matrices may take: the adjacency's written rows, the capped rows, influence."""
    return memory.floats(memory.GRAPH_SHARE)


def pass_budget() -> int:
    """Floats one backward pass's batched gradients and rows may take."""
    return memory.floats(memory.PASS_SHARE)


def row_chunk(n_cols: int) -> int:
    """Rows of n_cols columns per chunk: CHUNK_FLOATS values (64 MiB of float32), at least 1."""
    return max(1, CHUNK_FLOATS // max(1, n_cols))


def n_nodes_of(n_feat: int, cap: int, n_layers: int, n_pos: int, n_logits: int) -> int:
    """Nodes of the graph: the kept features, an error per (layer, position), a token per position, the logits."""
    return min(cap, n_feat) + (n_layers + 1) * n_pos + n_logits


def decoder_block_floats(layers: torch.Tensor, positions: torch.Tensor | None, n_pos: int, d_model: int) -> int:
    """The largest block of decoder vectors a pass makes at once (columns.BLOCK_FLOATS, or one position's
    [m, d_model] for the most active features m any position of a layer has, when larger), three copies
    (gathered, upcast, scaled). layers [n_feat] (and positions [n_feat], None: spread evenly over the positions)."""
    from circuitlab.graphs.columns import BLOCK_FLOATS

    if not len(layers):
        return 0
    most = 0
    for layer in layers.unique().tolist():
        mine = layers == layer
        if positions is None:
            m = math.ceil(int(mine.sum()) / max(1, n_pos))
        else:
            m = int(torch.bincount(positions[mine], minlength=n_pos).max())
        most = max(most, m)
    per_pos = most * d_model
    return 3 * min(n_pos * per_pos, max(per_pos, BLOCK_FLOATS // per_pos * per_pos))


def graph_floats(layers: torch.Tensor, transcoders: "Transcoders", cap: int, n_pos: int, n_logits: int,
                 d_model: int, offloaded: bool = False, positions: torch.Tensor | None = None) -> int:
    """Float32 values a graph's dense parts take at their peak: layers [n_feat], each active feature's layer
    (positions [n_feat]: its position, for the decoder block); cap: feature nodes kept (>= n_feat: all).
    The larger of the backward passes' phase (a decoder block; with a cap the visited rows, none in memory
    when offloaded, and influence's [cap, cap] walk with a chunk of rows) and the assembled graph
    (the adjacency's feature and logit rows, and pruning's [rows, kept] float64 block with its masks: error and
    token rows are zero and never touched, so nothing here is [n_nodes, n_nodes])."""
    n_feat = len(layers)
    kept = min(cap, n_feat)
    n_nodes = n_nodes_of(n_feat, cap, transcoders.n_layers, n_pos, n_logits)
    n_cols = n_feat + (transcoders.n_layers + 1) * n_pos
    written = (kept + n_logits) * n_nodes
    passes = decoder_block_floats(layers, positions, n_pos, d_model)
    if cap < n_feat:
        passes += (0 if offloaded else cap * n_cols) + cap * cap + min(CHUNK_FLOATS, cap * n_cols)
    else:
        passes += written                     # uncapped: rows go straight into the adjacency
    # pruning: the adjacency's written rows, their [rows, kept] float64 edge scores, two bool masks of their rows
    pruning = written + 2 * written + written // 2 + 2 * min(n_nodes, 1024) * n_nodes   # + a float64 row chunk
    return max(passes, pruning)


def check_graph_size(layers: torch.Tensor, transcoders: "Transcoders", cap: int, n_pos: int, n_logits: int,
                     d_model: int, budget: int | None = None, name: str = "max_feature_nodes (--max-feature-nodes)",
                     where: str = "", offloaded: bool = False, positions: torch.Tensor | None = None) -> None:
    """A one-line InputError, before any backward pass, when the graph's dense parts (graph_floats) would pass
    `budget` floats (default graph_budget()), saying how many feature nodes (`name`) would fit."""
    limit = None
    if budget is None:
        budget, limit = graph_budget(), memory.describe(memory.GRAPH_SHARE)
    need = graph_floats(layers, transcoders, cap, n_pos, n_logits, d_model, offloaded, positions)
    if need <= budget:
        return
    n_feat = len(layers)
    lo, hi = -1, min(cap, n_feat) - 1            # the most feature nodes that fit: binary search (monotone)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        fits = graph_floats(layers, transcoders, mid, n_pos, n_logits, d_model, offloaded, positions) <= budget
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    n_nodes = n_nodes_of(n_feat, cap, transcoders.n_layers, n_pos, n_logits)
    fix = f"give {name} at most {lo} or a shorter prompt" if lo >= 1 else "give a shorter prompt"
    mb = lambda floats: f"{floats * 4 / 2**20:,.{0 if floats * 4 >= 10 * 2**20 else 2}f} MB"  # noqa: E731
    raise InputError(f"this graph would hold {n_nodes:,} nodes ({n_feat:,} active features over {n_pos} tokens): "
                     f"its dense matrices need {mb(need)} (limit {limit or mb(budget)}{where}); {fix}")


def row_floats(model: Transformer, n_cols: int, n_pos: int) -> int:
    """Floats one target row holds in a backward pass: its gradient at every MLP output and the embedding (kept
    until its adjacency row is made), the injected gradients at its batch's layers' inputs, the working gradients
    through a block (norms, attention, skip): ~8 [pos, d_model] beside the layers' (measured on GPT-2 small and
    Gemma-2-2B shapes with benchmarks/bench_scale.py), one attention-shaped [heads, pos, pos] (the frozen pattern's
    product taken back for each row of a batched gradient: 8.3 MB a row measured at 512 tokens and 8 heads, the
    most of a row on long prompts), and its adjacency row [n_cols]. Vocabulary-sized only for the few logit
    rows (the gradient of one logit direction), which is not what a pass of feature rows is sized by."""
    cfg = model.cfg
    return n_pos * cfg.d_model * (max(cfg.n_layers, 1) + 8) + cfg.n_heads * n_pos * n_pos + n_cols


def rows_per_pass(model: Transformer, n_cols: int, n_pos: int) -> int:
    """Target rows one backward pass may hold within pass_budget() (row_floats each); at least 1."""
    return max(1, pass_budget() // row_floats(model, n_cols, n_pos))


def logit_row_floats(model: Transformer, n_cols: int, n_pos: int) -> int:
    """Floats one logit row holds in its backward pass: a feature row's (row_floats) and the gradient of the
    unembedding's output at every position [pos, d_vocab] (the logits are read at the last position of the
    prompt's, so their gradient is made whole before the unembedding takes it back): 65 MB a row for Gemma-2's
    vocabulary at 64 tokens, 206 MB for GPT-2's at 1,024."""
    return row_floats(model, n_cols, n_pos) + n_pos * model.cfg.d_vocab


def logit_rows_per_pass(model: Transformer, n_cols: int, n_pos: int) -> int:
    """Logit rows one backward pass may hold within pass_budget() (logit_row_floats each); at least 1."""
    return max(1, pass_budget() // logit_row_floats(model, n_cols, n_pos))


def offload_folder() -> str:
    """Where capped rows too large for memory go: $CIRCUITLAB_OFFLOAD, else the temporary folder."""
    import tempfile

    return os.environ.get("CIRCUITLAB_OFFLOAD") or tempfile.gettempdir()


def offloads(cap: int, n_feat: int, n_cols: int, dtype: torch.dtype) -> bool:
    """Whether the capped rows go to a file: over OFFLOAD_SHARE of the budget (its room is checked, one line)."""
    row_bytes = cap * n_cols * dtype.itemsize
    if not (cap < n_feat and row_bytes > OFFLOAD_SHARE * memory.budget_bytes()):
        return False
    import shutil

    folder = offload_folder()
    free = shutil.disk_usage(folder).free
    if free < 1.1 * row_bytes:
        raise InputError(f"the capped rows need {memory.gib(row_bytes)} on disk (over {OFFLOAD_SHARE:.0%} of the memory "
                         f"budget, so they are offloaded) but {folder} has {memory.gib(free)} free; set CIRCUITLAB_OFFLOAD "
                         "to a folder with room, or give fewer --max-feature-nodes")
    return True


def reference_bytes(model: Transformer, transcoders: "Transcoders", n_pos: int, n_feat: int) -> tuple[float, float]:
    """(held, transient) bytes of the reference run (lean: graphs.replacement). Held until the graph is made: the
    frozen attention patterns and norm scales, each layer's transcoder input, MLP output and error [pos, d_model],
    the active features (layer, pos, feature, activation). Transient: the logits [pos, d_vocab] and one layer's
    activations and pre-activations [pos, d_sae] at a time."""
    cfg, tc, T = model.cfg, transcoders, n_pos
    attn = cfg.n_layers * cfg.n_heads * T * T
    held = 4 * (attn + 6 * cfg.n_layers * T * cfg.d_model) + 32 * n_feat
    return held, 4 * (T * cfg.d_vocab + 3 * T * max(tc.d_sae(layer) for layer in tc.layers))


def attribution_phases(model: Transformer, transcoders: "Transcoders", features: torch.Tensor, n_pos: int, cap: int,
                       n_logits: int, B: int, dtype: torch.dtype = torch.float32, offload: bool = False,
                       B_logit: int | None = None) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(held, phases) in bytes: what attribute() holds throughout (the reference run, the frozen system's forward
    kept for every backward pass, the capped rows when in memory) and the phases that never overlap, one of
    which is on top at a time (the reference run's transients, a backward pass of B feature rows or B_logit
    logit rows (default min(B, n_logits)) with a decoder block, the greedy choice's influence walk, the
    assembled adjacency). features [n_active, 3]."""
    cfg, tc = model.cfg, transcoders
    size = dtype.itemsize
    n_feat, L, T, d = len(features), tc.n_layers, n_pos, cfg.d_model
    n_cols = n_feat + (L + 1) * T
    n_nodes = n_nodes_of(n_feat, cap, L, T, n_logits)
    ref_held, ref_transient = reference_bytes(model, tc, T, n_feat)
    held: dict[str, float] = {"reference run": ref_held,   # the forward's logits [pos, d_vocab] included
                              "forward of the frozen system": (12 * cfg.n_layers * T * d + T * cfg.d_vocab) * size,
                              "autograd and allocator": RUNTIME_BYTES}
    chunk = min(cap * n_cols, CHUNK_FLOATS)
    adjacency = (min(cap, n_feat) + n_logits) * n_nodes * size   # the rows written; error and token rows untouched
    block = decoder_block_floats(features[:, 0], features[:, 1], T, d) * size
    B_logit = min(B, n_logits) if B_logit is None else B_logit
    phases: list[dict[str, float]] = [{"backward pass": B * row_floats(model, n_cols, T) * size, "decoder block": block},
                                      {"logit rows' backward pass": B_logit * logit_row_floats(model, n_cols, T) * size,
                                       "decoder block": block},
                                      {"reference run (logits, a layer's activations)": ref_transient}]
    if cap < n_feat:   # the adjacency is made after the passes
        if not offload:
            held["capped rows"] = cap * n_cols * size
        phases.append({"influence": (cap * cap + chunk) * size})      # [V, V] and a chunk made absolute
        phases.append({"adjacency": adjacency, "a chunk of rows": chunk * size})
    else:
        held["adjacency"] = adjacency
    return held, phases


class AttributionEstimate(memory.Estimate):
    """The attribution's estimate, with the pass layout it decided (read back by attribute)."""

    batch_size: int       # feature rows a backward pass
    logit_batch: int      # logit rows a backward pass
    passes: int
    offload: bool         # the capped rows go to a file


def estimate_attribution(model: Transformer, transcoders: "Transcoders", features: torch.Tensor, n_pos: int,
                         cap: int, n_logits: int, batch_size: int, dtype: torch.dtype = torch.float32,
                         offload: bool = False) -> AttributionEstimate:
    """What attribute() will hold at its peak beyond the model and transcoders, and its arithmetic, once the
    reference run has found the active features (features [n_active, 3] (layer, pos, feature); cap: feature
    nodes kept): what it holds throughout and the largest of its phases (attribution_phases)."""
    cfg, tc = model.cfg, transcoders
    size = dtype.itemsize
    n_feat, L, T, d = len(features), tc.n_layers, n_pos, cfg.d_model
    n_cols = n_feat + (L + 1) * T
    kept = min(cap, n_feat)
    B = min(batch_size, rows_per_pass(model, n_cols, T))
    B_logit = min(B, n_logits, logit_rows_per_pass(model, n_cols, T))
    parts, phases = attribution_phases(model, tc, features, T, cap, n_logits, B, dtype, offload, B_logit)
    # The reference run's transients come before anything else is held but its own results.
    reference = {k: v for ph in phases for k, v in ph.items() if k.startswith("reference run")}
    work: list[dict[str, float]] = [ph for ph in phases if not any(k.startswith("reference run") for k in ph)]
    biggest: dict[str, float] = max(work, key=lambda ph: sum(ph.values()))
    parts.update(biggest)
    reference["reference run"] = parts["reference run"]
    if sum(reference.values()) > sum(parts.values()):
        parts = reference
    heads = cfg.n_heads * cfg.head_dim
    skip = getattr(tc.dictionary(tc.layers[0]).cfg, "skip", False)
    per_row = T * (cfg.n_layers / 2) * (4 * d * heads + 2 * cfg.n_heads * T * cfg.head_dim + (2 * d * d if skip else 0))
    per_row += 2 * n_cols * d
    n_passes = math.ceil(kept / B) + math.ceil(n_logits / max(1, B_logit))
    held = memory.tensor_bytes(model, *{id(tc.dictionary(l_)): tc.dictionary(l_) for l_ in tc.layers}.values())
    est = AttributionEstimate(f"the attribution graph ({n_feat:,} active features, {kept:,} feature nodes, "
                          f"{n_passes:,} backward passes of {B} rows)", parts, held=held,
                          flops=(kept + n_logits) * per_row, efficiency=PASS_EFFICIENCY)
    est.batch_size, est.logit_batch, est.passes, est.offload = B, max(1, B_logit), n_passes, offload
    if offload:
        est.disk = (cap * n_cols * size, offload_folder())
    return est
