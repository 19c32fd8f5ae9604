"""Edge scores: how much the metric moves when one edge of the graph is patched.

    scores = edge_scores(model, clean, corrupt, metric, method="eap-ig")
    scores.top(10)             # [(source, reader, score), ...] by |score|
    scores.scores              # [n_edges], in graph.edges order

A score estimates m(clean run with that edge patched) − m(clean run): negative for an edge the
behaviour needs (for a metric where higher means "more of the behaviour").

Methods:
  "eap"     activation difference × gradient: (ref_s − clean_s) · ∂m/∂(input of r), summed over
            batch and positions. Every edge from 2 forward passes and 1 backward pass.
  "eap-ig"  the same with the gradient averaged over `steps` points of a straight path, batched:
            ig_path="inputs" moves the input embeddings from the reference input to the clean one
            (Hanna et al. 2024); ig_path="edges" moves every edge's patch weight from 0 to 1 and
            integrates ∂m/∂weight (auto-circuit's integrated-gradient mask scores).
  "exact"   the true effect of patching each edge alone: one copy of the batch per edge in a batched
            forward pass with per-edge masks, each starting at its reader's layer.

Interventions (what an edge carries when patched): "counterfactual" (the writer's output on the
corrupted prompt), "zero", "mean" (its mean over the clean batch and positions), "position-mean"
(its mean over the clean batch, per position).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.analysis._json import rounded
from circuitlab.analysis.edges.forward import EdgeRun, graph_forward, input_output
from circuitlab.analysis.edges.edge_graph import EdgeGraph
from circuitlab.analysis.patching import Metric, as_tokens, check_metric, check_pair, read_positions
from circuitlab.checks import Number
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

METHODS = ("eap", "eap-ig", "exact")
INTERVENTIONS = ("counterfactual", "zero", "mean", "position-mean")
IG_PATHS = ("inputs", "edges")
# What circuit discovery does unless told (`circuitlab circuit`'s defaults: experiments/circuit.CircuitOptions reads
# them; edge_scores alone defaults to plain eap): EAP-IG over 5 path points, patching in the corrupted run's values.
DEFAULT_METHOD: Final = "eap-ig"   # Final: typed as the literal, one of the explorer's Literal choices
DEFAULT_INTERVENTION: Final = "counterfactual"
DEFAULT_STEPS: Final = 5
# Floats one batched run may hold in its per-copy activations (about 16 MB in fp32). Small on purpose: on
# 2 CPU cores, exact patching of the demo-sized graph ran 2x faster in runs of ~4-8 copies that stay in cache
# than in one run of every copy (128 MB: 0.19 s vs 0.10 s for 81 edges; EAP-IG unchanged).
COPY_BUDGET = 2 ** 22
# One copy of all rows (every edge source's output at every position) may take a pass's share of the memory budget
# (circuitlab.memory: the memory available now, or --memory); above it, a refusal naming how many rows fit.


def edge_rows_budget() -> int:
    """Floats one copy of all rows may need: a pass's share of the memory budget."""
    return memory.floats(memory.PASS_SHARE)

# EAP-IG's path points: run in chunks of copies, so memory is bounded; time grows with them.
EAP_IG_STEPS = Number(int, low=1, high=10_000, why="each point is a forward and backward pass over every row; "
                                                   "EAP-IG's scores settle by 5 to 50")


@dataclass
class EdgeScores:
    """Scores for every edge of a graph, from one method.

    scores [n_edges] (float64, graph.edges order): estimated (eap, eap-ig) or measured (exact) change of the
    metric when that edge alone is patched; node_scores [n_sources]: the same for patching all of a
    writer's outgoing edges at once (measured for exact, the sum of its edges' scores otherwise).
    clean_value: the metric of the full model; ablated_value: with every edge patched (the empty circuit).
    """

    graph: EdgeGraph
    scores: torch.Tensor
    node_scores: torch.Tensor
    method: str
    intervention: str
    metric: str
    clean_value: float
    ablated_value: float
    options: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    position_scores: torch.Tensor | None = None  # [n_edges, pos] with per_position=True (eap, eap-ig)

    def order(self) -> torch.Tensor:
        """Edge indices [n_edges], most important (largest |score|) first; ties keep graph order."""
        return torch.sort(self.scores.abs(), descending=True, stable=True).indices

    def top(self, n: int = 10) -> list[tuple[str, str, float]]:
        edges = self.graph.edges
        return [(*edges[i], float(self.scores[i])) for i in self.order()[:n].tolist()]

    def score(self, source: str, reader: str) -> float:
        return float(self.scores[self.graph.edge_index(source, reader)])

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "intervention": self.intervention, "metric": self.metric,
                "options": self.options, "clean_value": round(self.clean_value, 6),
                "ablated_value": round(self.ablated_value, 6), "seconds": round(self.seconds, 3),
                "graph": self.graph.to_dict(),
                "edges": [[s, r, v] for (s, r), v in zip(self.graph.edges, rounded(self.scores, 8))],
                "node_scores": dict(zip(self.graph.sources, rounded(self.node_scores, 8))),
                **({} if self.position_scores is None else {"position_scores": rounded(self.position_scores, 8)})}

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{s}</td><td>{r}</td><td>{v:+.4g}</td></tr>" for s, r, v in self.top(15))
        return (f"<b>Edge scores</b> ({self.method}, {self.intervention}, metric {self.metric}): "
                f"{self.graph.summary()}; metric {self.clean_value:.4g} clean, {self.ablated_value:.4g} with every "
                f"edge patched<table><tr><th>from</th><th>to</th><th>score</th></tr>{rows}</table>")


# ---------------------------------------------------------------------------- shared pieces


def per_copy(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    """metric applied to each copy: logits [copies, batch, pos, d_vocab] -> [copies]."""
    values = [metric(logits[c]) for c in range(logits.shape[0])]
    return torch.stack([v if isinstance(v, torch.Tensor) else torch.tensor(float(v)) for v in values])


def check_edge_request(model: Transformer, clean, corrupt, metric: Metric, method: str, intervention: str
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens checked ([batch, pos], same shape when corrupt is given) and the method/intervention names."""
    if method not in METHODS:
        raise CircuitlabError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if intervention not in INTERVENTIONS:
        raise CircuitlabError(f"unknown intervention {intervention!r}; choose one of {', '.join(INTERVENTIONS)}")
    if model.cfg.n_layers == 0:
        raise CircuitlabError("this model has no layers, so its graph has no heads or MLPs to score")
    if intervention == "counterfactual":
        if corrupt is None:
            raise CircuitlabError("the counterfactual intervention needs corrupted prompts (or choose zero, mean "
                                  "or position-mean)")
        clean, corrupt = check_pair(model, clean, corrupt)
    else:
        clean = as_tokens(model, clean, "clean tokens")
        corrupt = None if corrupt is None else check_pair(model, clean, corrupt)[1]
    check_metric(model, metric, tuple(clean.shape))
    return clean, corrupt


def reference(model: Transformer, graph: EdgeGraph, clean: torch.Tensor, corrupt: torch.Tensor | None, intervention: str,
              clean_run: EdgeRun) -> torch.Tensor:
    """What each writer's output becomes on a patched edge, broadcastable to [batch, pos, n_sources, d_model]."""
    outs = clean_run.source_outputs()[0]  # [batch, pos, n_sources, d_model]
    if intervention == "counterfactual":
        assert corrupt is not None  # check_edge_request refused the counterfactual intervention without it
        with torch.no_grad():
            return graph_forward(model, graph, corrupt).source_outputs()[0]
    if intervention == "zero":
        return torch.zeros_like(outs[:1, :1])
    if intervention == "mean":
        return outs.mean(dim=(0, 1), keepdim=True)
    return outs.mean(dim=0, keepdim=True)


def all_patched(graph: EdgeGraph, value: float = 1.0, copies: int = 1, dtype=torch.float32,
                device=None) -> torch.Tensor:
    """Mask [copies, n_sources, n_readers] with `value` on every edge."""
    return (graph.allowed.to(device=device, dtype=dtype) * value).expand(copies, -1, -1).clone()


def _contract(graph: EdgeGraph, diff: torch.Tensor, inputs, grads, per_position: bool = False) -> torch.Tensor:
    """Σ over copies, batch, pos of diff_s · grad_r for every edge -> dense [n_sources, n_readers]; with
    per_position, not summed over pos: [n_sources, n_readers, pos].

    diff [copies or 1, batch, pos, n_sources, d_model]; grads: per reader group [copies, batch, pos, n, d].
    """
    S, P = diff.shape[-2], diff.shape[-3]
    dense = torch.zeros(S, len(graph.readers), *([P] if per_position else []), dtype=torch.float64,
                        device=diff.device)
    if diff.shape[0] == 1:  # the same differences in every copy: sum the gradients over the copies first
        grads = [g.sum(0, keepdim=True) for g in grads]
    # writers laid out once: [n_sources, copies·batch·pos·d_model] (per position: [pos, n_sources, ...]);
    # a reader group reads a prefix of the writers
    flat = diff.permute(2, 3, 0, 1, 4).reshape(P, S, -1) if per_position else diff.movedim(-2, 0).reshape(S, -1)
    for (readers, _), g in zip(inputs, grads):
        n_up = int(graph.allowed[:, readers].any(1).nonzero().max()) + 1  # writers upstream of the group
        if per_position:
            g = g.permute(2, 0, 1, 4, 3).reshape(P, -1, g.shape[-2])  # [pos, copies·batch·d_model, n]
            dense[:n_up, readers] += torch.bmm(flat[:, :n_up], g).permute(1, 2, 0).double()
        else:
            dense[:n_up, readers] += (flat[:n_up] @ g.movedim(-2, -1).reshape(-1, g.shape[-2])).double()
    return dense


def _backward(model: Transformer, graph, tokens, metric, *, ref=None, mask=None, input_out=None, reads=None):
    """One batched forward + backward: (run, gradient of Σ_copies metric w.r.t. every reader input).
    reads: the positions whose logits the metric reads (the others are never computed)."""
    with torch.enable_grad():
        if input_out is None:
            input_out = input_output(model, tokens)
        input_out = input_out.detach().requires_grad_(True)  # works with frozen parameters too
        if mask is not None:
            mask = mask.detach()
        run = graph_forward(model, graph, tokens, ref=ref, mask=mask, input_out=input_out, reads=reads)
        value = per_copy(metric, run.logits).sum()
        if not value.requires_grad:
            raise CircuitlabError("gradient methods need a metric computed from the logits with torch operations; "
                                  "this one returned a constant (use method='exact')")
        grads = torch.autograd.grad(value, [x for _, x in run.inputs], allow_unused=True)
    filled = [torch.zeros_like(x) if g is None else g for (_, x), g in zip(run.inputs, grads)]
    return run, [g.detach() for g in filled]


# ---------------------------------------------------------------------------- the methods


def edge_scores(model: Transformer, clean, corrupt=None, metric: Metric | None = None, *, method: str = "eap",
                intervention: str = DEFAULT_INTERVENTION, steps: int = DEFAULT_STEPS, ig_path: str = "inputs",
                batch_size: int | None = None, progress: bool = True, per_position: bool = False) -> EdgeScores:
    """Score every edge of the model's graph.

    clean, corrupt: token ids [batch, pos] (corrupt needed for the counterfactual intervention); metric:
    fn(logits [batch, pos, d_vocab]) -> scalar (logit_diff, logprob, kl_to_clean or the user's). method:
    "eap" | "eap-ig" | "exact"; steps, ig_path: EAP-IG's path points and path ("inputs" | "edges");
    batch_size: copies per batched run (default: sized to memory); per_position (eap, eap-ig): also score each
    edge at each position of the reader (EdgeScores.position_scores [n_edges, pos]; scores is their sum).
    Returns EdgeScores.
    """
    if metric is None:
        raise CircuitlabError("edge_scores needs a metric: a function of the logits, e.g. logit_diff(answer, wrong)")
    clean, corrupt = check_edge_request(model, clean, corrupt, metric, method, intervention)
    if per_position and method == "exact":
        raise CircuitlabError("per-position scores come from eap and eap-ig; exact patching patches whole edges")
    if method == "eap-ig":
        if ig_path not in IG_PATHS:
            raise CircuitlabError(f"unknown ig_path {ig_path!r}; choose one of {', '.join(IG_PATHS)}")
        EAP_IG_STEPS.check(steps, "steps")
    t0 = time.perf_counter()
    graph = EdgeGraph.of(model)
    check_rows_fit(model, clean, graph)
    reads = read_positions(metric, clean.shape[1])  # logits only where the metric reads them
    if method == "eap":  # the clean run itself carries the gradients: one forward + backward for the clean side
        clean_run, grads = _backward(model, graph, clean, metric, reads=reads)
    else:
        with torch.no_grad():
            clean_run = graph_forward(model, graph, clean, reads=reads)
    with torch.no_grad():
        clean_value = float(per_copy(metric, clean_run.logits)[0])
        ref, ablated_value = _reference_and_ablated(model, graph, clean, corrupt, metric, intervention, clean_run,
                                                    reads)
    chunk = batch_size or _copies_per_run(model, graph, clean)
    if method == "exact":
        scores, nodes = _exact(model, graph, clean, metric, ref, clean_run, clean_value, chunk, progress)
        options: dict[str, Any] = {}
        by_position = None
    else:
        dense = (_eap(graph, ref, clean_run, grads, per_position) if method == "eap" else
                 _eap_ig(model, graph, clean, corrupt, metric, ref, clean_run, steps, ig_path, chunk, progress,
                         per_position))
        by_position = graph.flat(dense.movedim(-1, 0)).T.cpu() if per_position else None  # [n_edges, pos]
        scores = by_position.sum(1) if by_position is not None else graph.flat(dense)
        nodes = graph.dense(scores).sum(1)
        options = {"steps": steps, "ig_path": ig_path} if method == "eap-ig" else {}
    return EdgeScores(graph, scores.double().cpu(), nodes.double().cpu(), method, intervention,
                      getattr(metric, "__name__", "metric"), clean_value, ablated_value, options,
                      time.perf_counter() - t0, by_position)


# The share of the machine's matmul speed a batched edge run reaches on a CPU: turns flops into seconds
# (benchmarks/bench_scale.py, EAP at 64 tokens: 3.1 s measured, 3.5 s estimated on GPT-2 small's shape; 6.0 s,
# 6.9 s on Llama-3.2-1B's at 4 layers).
EDGE_EFFICIENCY = 0.6


def edge_estimate(model: Transformer, batch: int, pos: int, method: str = DEFAULT_METHOD, steps: int = DEFAULT_STEPS,
                  batch_size: int | None = None) -> memory.Estimate:
    """What edge_scores on prompts [batch, pos] holds at its peak and computes, by method. A gradient run (eap,
    and each chunk of eap-ig's path points) peaks either while it keeps, per copy of a row, every reader's own
    input and what autograd saves through its norm (~5 [pos, d_model] per reader) beside the writers' outputs
    and their reference (2 per writer) and half a logit-sized tensor, or, where the vocabulary outweighs the
    readers, while it holds ~3 logit-sized tensors per row (the logits, their gradient, the metric's); eap-ig adds
    ~8 logit-sized tensors of its path runs. Fitted to benchmarks/bench_scale.py's EAP on the GPT-2 small,
    Qwen3-0.6B, Llama-3.2-1B and Gemma-2-2B shapes and a 2-layer model with GPT-2's vocabulary (tests/
    test_estimates.py): 0.85-1.04 of the measured peak. exact: a chunk of masked copies (_per_copy_floats each) beside
    the clean run's writers."""
    from circuitlab.model import model_dtype
    from circuitlab.perf import block_weights

    cfg = model.cfg
    graph = EdgeGraph.of(model)
    size = model_dtype(model).itemsize
    R, S, T, d = len(graph.readers), len(graph.sources), pos, cfg.d_model
    tokens = torch.empty(batch, pos)
    copies = batch_size or max(1, COPY_BUDGET // _per_copy_floats(model, graph, tokens))
    # a run's blocks over every position, and the read-out at the one position a metric reads, per row
    fwd = batch * (pos * cfg.n_layers * (2 * block_weights(cfg) + 4 * pos * cfg.n_heads * cfg.head_dim)
                   + 2 * cfg.d_model * cfg.d_vocab)
    contract = 2.0 * graph.n_edges * batch * pos * d
    parts: dict[str, float]
    if method == "exact":
        parts = {"clean run's writers": batch * T * d * S * size,
                 "a chunk of masked copies": copies * _per_copy_floats(model, graph, tokens) * size,
                 "logits": batch * T * cfg.d_vocab * size}
        flops = (graph.n_edges + S) * fwd / 2     # each edge's copy runs from its reader's layer on
        what = f"exact edge patching ({graph.n_edges:,} edges, {batch} x {pos} tokens)"
    else:
        runs = 1 if method == "eap" else min(copies, steps)
        logits, writers = batch * T * cfg.d_vocab * size, runs * batch * T * d * 2 * S * size
        parts = {"a gradient run's reader inputs": runs * batch * T * d * 5 * R * size,
                 "writers' outputs and reference": writers,
                 "logits": (0.5 * runs + (8 if method == "eap-ig" else 0)) * logits}
        by_logits: dict[str, float] = {"logits and their gradients": 3 * runs * logits,
                                       "writers' outputs and reference": writers}
        if sum(by_logits.values()) > sum(parts.values()):
            parts = by_logits
        n = 1 if method == "eap" else steps
        flops = n * (3 * fwd + contract) + 2 * fwd
        what = (f"{method.upper()} ({graph.n_edges:,} edges, {batch} x {pos} tokens"
                + (f", {steps} path points in runs of {runs})" if method == "eap-ig" else ")"))
    return memory.Estimate(what, parts, held=memory.tensor_bytes(model), flops=flops, efficiency=EDGE_EFFICIENCY)


def _per_copy_floats(model: Transformer, graph: EdgeGraph, tokens: torch.Tensor) -> int:
    cfg = model.cfg
    return tokens.numel() * (cfg.d_model * (len(graph.sources) + 3 * cfg.n_heads + 4) + cfg.d_vocab)


def _copies_per_run(model: Transformer, graph: EdgeGraph, tokens: torch.Tensor) -> int:
    """Copies per batched run: COPY_BUDGET floats (a size for speed), or a pass's share of the budget if less."""
    return max(1, min(COPY_BUDGET, memory.floats(memory.PASS_SHARE)) // _per_copy_floats(model, graph, tokens))


def check_rows_fit(model: Transformer, tokens: torch.Tensor, graph: EdgeGraph | None = None) -> None:
    """All rows, tokens [batch, pos], run together: one copy of them (every edge source's output at every
    position) must fit edge_rows_budget() floats, else a one-line refusal saying how many rows would."""
    graph = graph or EdgeGraph.of(model)
    need = _per_copy_floats(model, graph, tokens)
    budget = edge_rows_budget()
    if need > budget:
        rows, pos = tokens.shape
        fit = max(1, budget * rows // need)
        raise CircuitlabError(f"{rows} rows of {pos} tokens are too many for one run: every edge source's output at "
                              f"every position needs {need * 4 / 2**30:.1f} GiB per copy (limit "
                              f"{memory.describe(memory.PASS_SHARE)}); give at most {fit} rows of this length")


def _reference_and_ablated(model: Transformer, graph, clean, corrupt, metric, intervention, clean_run, reads
                           ) -> tuple[torch.Tensor, float]:
    """The reference outputs and the metric with every edge patched. For the counterfactual intervention
    every edge patched is the corrupted run itself, so its logits are used (no fully patched run)."""
    if intervention == "counterfactual":
        run = graph_forward(model, graph, corrupt, reads=reads)
        return run.source_outputs()[0], float(per_copy(metric, run.logits)[0])
    ref = reference(model, graph, clean, corrupt, intervention, clean_run)
    full = all_patched(graph, dtype=ref.dtype, device=ref.device)
    run = graph_forward(model, graph, clean, ref=ref, mask=full, reads=reads)
    return ref, float(per_copy(metric, run.logits)[0])


def _eap(graph, ref, clean_run, grads, per_position=False) -> torch.Tensor:
    """clean_run: the clean run with gradients, grads: ∂m/∂(every reader input) from _backward."""
    diff = ref - clean_run.source_outputs()[0].detach()  # [batch, pos, n_sources, d_model]
    return _contract(graph, diff[None], clean_run.inputs, grads, per_position)


def _eap_ig(model: Transformer, graph, clean, corrupt, metric, ref, clean_run, steps, ig_path, chunk, progress,
            per_position=False) -> torch.Tensor:
    reads = read_positions(metric, clean.shape[1])
    alphas = torch.arange(1, steps + 1, dtype=torch.float64) / steps
    dense: torch.Tensor | float = 0.0
    clean_outs = clean_run.source_outputs()[0]
    x_clean = clean_outs[..., 0, :]
    x_ref = ref[..., 0, :].expand_as(x_clean)
    bar = tqdm(total=steps, desc="EAP-IG", unit="step", disable=not progress or steps <= chunk)
    for start in range(0, steps, chunk):
        a = alphas[start:start + chunk].to(ref.device, ref.dtype)
        if ig_path == "inputs":  # the input embeddings move from the reference to the clean ones
            input_out = x_ref + a[:, None, None, None] * (x_clean - x_ref)
            run, grads = _backward(model, graph, clean, metric, input_out=input_out, reads=reads)
            diff = (ref - clean_outs)[None]
        else:  # every edge's patch weight moves from 0 to 1; ∂m/∂weight = (ref_s − out_s) · ∂m/∂input_r
            mask = all_patched(graph, 1.0, len(a), ref.dtype, ref.device) * a[:, None, None]
            run, grads = _backward(model, graph, clean, metric, ref=ref, mask=mask, reads=reads)
            diff = ref - run.source_outputs().detach()
        dense = dense + _contract(graph, diff, run.inputs, grads, per_position)
        bar.update(len(a))  # the bar counts path points (steps), not chunks
    bar.close()
    return dense / steps


def _exact(model: Transformer, graph, clean, metric, ref, clean_run, clean_value, chunk, progress):
    """Each edge patched alone, then each writer's outgoing edges together: measured metric changes."""
    reads = read_positions(metric, clean.shape[1])
    pairs = graph.edge_pairs
    edge_layer = torch.tensor([graph.reader_layer[r] for r in pairs[:, 1].tolist()])
    S, R = len(graph.sources), len(graph.readers)
    scores = torch.empty(graph.n_edges, dtype=torch.float64)
    jobs = []  # (start layer, mask rows, where the values go)
    for l in range(graph.n_layers + 1):
        idx = (edge_layer == l).nonzero().flatten()
        for c in range(0, len(idx), chunk):
            rows = idx[c:c + chunk]
            mask = torch.zeros(len(rows), S, R, dtype=ref.dtype, device=ref.device)
            mask[torch.arange(len(rows)), pairs[rows, 0], pairs[rows, 1]] = 1
            jobs.append((l, mask, ("edge", rows)))
    allowed = graph.allowed.to(ref.device, ref.dtype)
    for c in range(0, S, chunk):
        rows = torch.arange(c, min(S, c + chunk))
        mask = torch.zeros(len(rows), S, R, dtype=ref.dtype, device=ref.device)
        mask[torch.arange(len(rows)), rows] = allowed[rows]
        first = min(max(graph.source_layer[int(rows[0])], 0), graph.n_layers)
        jobs.append((first, mask, ("node", rows)))
    nodes = torch.empty(S, dtype=torch.float64)
    with torch.no_grad():
        for l, mask, (kind, rows) in tqdm(jobs, desc="exact edge patching", disable=not progress or len(jobs) < 3):
            run = graph_forward(model, graph, clean, ref=ref, mask=mask, base=clean_run, start=l, reads=reads)
            values = per_copy(metric, run.logits).double().cpu() - clean_value
            (scores if kind == "edge" else nodes)[rows] = values
    return scores, nodes


__all__ = ["EdgeScores", "INTERVENTIONS", "METHODS", "edge_scores", "per_copy"]
