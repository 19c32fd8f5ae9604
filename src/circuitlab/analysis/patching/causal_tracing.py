# long module: one prompt's trace (run, restoration grid, sweep, estimate) and its average over prompts share their types
"""Causal tracing (Meng et al. 2022, "Locating and Editing Factual Associations in GPT").

Run the prompt with the subject's token embeddings corrupted by noise (patching/noise.py), then restore one
piece of the clean run and measure how much of the answer comes back:

    hidden   the residual stream leaving layer l at position p (blocks.l.hook_resid_post)
    mlp      the MLP outputs at position p of a window of `window` layers centred on l
    attn     the attention outputs, likewise
    hidden_no_mlp / hidden_no_attn   hidden, with every later MLP (attention) output frozen at its corrupted
             value: the "severed" traces, which show whether the effect travels through that path.

    trace = causal_trace(model, tokens, subject="Eiffel Tower", tokenizer=tok)   # one prompt
    trace.values["mlp"]            # [layer, pos]: the metric with that window of MLP outputs restored
    trace.indirect_effect("mlp")   # values - corrupted; trace.total_effect = clean - corrupted
    trace.peak("mlp")              # {"layer", "pos", "effect", "share"}: share = effect / total effect
    avg = average_causal_trace(model, prompts, subjects, tokenizer=tok)   # AIE by token category

The metric is the answer's probability at the last position (or its log-prob, or a logit difference),
averaged over the noise samples. Every (layer, position) of one kind is one staggered sweep (patching/grid.py:
grid_sweep): noise samples x restorations go in the batch dimension, in chunks that bound memory; each
restoration starts from the corrupted run's residual stream at its first layer and position, with the earlier
positions' keys and values cached, and joins the batch at its layer. Results equal restoring one state at a
time with plain hooks (tested in float64).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.analysis._json import rounded
from circuitlab.analysis.patching.checks import check_grid, one_sequence
from circuitlab.analysis.patching.engine import BaseRun, Site, chunk_size, sweep
from circuitlab.analysis.patching.grid import grid_sweep
from circuitlab.analysis.patching.work import full_grid, grid_flops, naive_flops
from circuitlab.analysis.patching.metrics import Metric, logit_diff, logprob, metric_value, probability
from circuitlab.analysis.patching.noise import Corrupted, Noise, check_runs, corrupt_positions, embedding_std, run_floats
from circuitlab.display import Displayed
from circuitlab.errors import InputError
from circuitlab.model.hooks import act_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

# What each kind restores, and for the severed kinds which outputs are frozen downstream.
RESTORES = {"hidden": "resid_post", "mlp": "mlp_out", "attn": "attn_out", "hidden_no_mlp": "resid_post",
            "hidden_no_attn": "resid_post"}
FROZEN = {"hidden_no_mlp": "mlp_out", "hidden_no_attn": "attn_out"}
KINDS = tuple(RESTORES)
DEFAULT_KINDS = ("hidden", "mlp", "attn")
METRICS = ("prob", "logprob", "logit_diff")
# The paper's window: 10 layers of GPT-2 XL's 48; the default keeps that share of the depth.
PAPER_WINDOW, PAPER_LAYERS = 10, 48
CATEGORIES = ("first subject token", "middle subject tokens", "last subject token", "first subsequent token",
              "further tokens", "last token")


def default_window(n_layers: int) -> int:
    """The paper's window scaled to the depth: round(n_layers x 10 / 48), at least 1."""
    return max(1, round(n_layers * PAPER_WINDOW / PAPER_LAYERS))


def window_layers(layer: int, window: int, n_layers: int) -> range:
    """The layers restored together for centre `layer`: layer - window//2 .. layer + ceil(window/2) - 1,
    cut to the model (the paper's windows)."""
    return range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2)))


def check_window(model: Transformer, window: int | None) -> int:
    n = model.cfg.n_layers
    if window is None:
        return default_window(n)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InputError(f"the window must be a whole number of layers >= 1, got {window!r}")
    if window > n:
        raise InputError(f"a window of {window} layers is wider than the model ({n} layers); give --window 1..{n}")
    return window


def check_kinds(model: Transformer, kinds: Sequence[str] | None) -> list[str]:
    """The kinds to trace (default: hidden, mlp, attn that the model has), or a one-line InputError."""
    has = [k for k in KINDS if model.cfg.has_mlp or "mlp" not in k]
    if kinds is None:
        return [k for k in DEFAULT_KINDS if k in has]
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for k in kinds:
        if k not in KINDS:
            raise InputError(f"unknown causal tracing kind {k!r}; kinds: {', '.join(KINDS)}")
        if k not in has:
            raise InputError(f"kind {k!r} needs MLPs, and this model is attention-only; kinds: {', '.join(has)}")
    return kinds


def _pieces(tokens: Sequence[int], tokenizer) -> list[str] | None:
    return None if tokenizer is None else [tokenizer.decode([int(t)]) for t in tokens]


def subject_span(tokens: Sequence[int], subject: Any, tokenizer=None) -> tuple[int, int]:
    """The subject's token positions start..end-1 in tokens [pos], as (start, end).

    subject: a (start, end) pair of positions; a list of token ids (found in the prompt); or text (needs
    the tokenizer; the tokens whose text overlaps its first occurrence in the decoded prompt). A subject
    not in the prompt is a one-line InputError listing the prompt's tokens.
    """
    tokens = [int(t) for t in tokens]
    T = len(tokens)
    pieces = _pieces(tokens, tokenizer)
    shown = ", ".join(repr(p) for p in pieces) if pieces is not None else ", ".join(map(str, tokens))
    if isinstance(subject, str):
        if tokenizer is None:
            raise InputError("a subject given as text needs the tokenizer (tokenizer=...)")
        if not subject.strip():
            raise InputError("the subject is empty; give the words of the prompt to corrupt")
        assert pieces is not None  # decoded: there is a tokenizer
        text = "".join(pieces)
        at = text.find(subject)
        if at < 0:
            raise InputError(f"subject {subject!r} is not in the prompt; the prompt's tokens are: {shown}")
        ends = torch.tensor([len(p) for p in pieces]).cumsum(0).tolist()
        starts = [e - len(p) for e, p in zip(ends, pieces)]
        inside = [i for i in range(T) if starts[i] < at + len(subject) and ends[i] > at]
        return inside[0], inside[-1] + 1
    if isinstance(subject, tuple) and len(subject) == 2 and all(isinstance(x, int) for x in subject):
        start, end = subject
        if not 0 <= start < end <= T:
            raise InputError(f"subject span {subject} is not within the prompt's {T} tokens (give start < end <= {T})")
        return start, end
    ids = [int(t) for t in subject]
    for i in range(T - len(ids) + 1):
        if ids and tokens[i:i + len(ids)] == ids:
            return i, i + len(ids)
    raise InputError(f"subject tokens {ids} are not in the prompt; the prompt's tokens are: {shown}")


def _metric(kind: str, answer: int, wrong: int | None) -> Metric:
    if kind == "prob":
        return probability(answer)
    if kind == "logprob":
        return logprob(answer)
    if kind == "logit_diff":
        if wrong is None:
            raise InputError("metric logit_diff needs a wrong answer token (wrong=...)")
        return logit_diff(answer, wrong)
    raise InputError(f"unknown metric {kind!r}; metrics: {', '.join(METRICS)}")


@dataclass
class TraceRun:
    """What every restoration of one prompt shares: the corrupted runs (base: noise samples in the batch),
    the clean run's activations [1, pos, ...] and the corrupted run's [samples, pos, ...] by hook name;
    first: the first corrupted position."""

    base: BaseRun
    clean: dict[str, torch.Tensor]
    corrupted: dict[str, torch.Tensor]
    metric: Metric
    clean_value: float
    corrupt_value: float
    first: int = 0


def trace_run(model: Transformer, tokens: torch.Tensor, corrupted: Corrupted, metric: Metric) -> TraceRun:
    """Run tokens [pos] clean and corrupted, caching the states restoration reads."""
    L = range(model.cfg.n_layers)
    names = [act_name(h, l) for h in sorted({*RESTORES.values()}) for l in L
             if act_name(h, l) in model.hook_points()]
    clean_logits, clean = model.run_with_cache(tokens[None], names_filter=names)
    with model.hooks(corrupted.hooks()):
        base, corrupt = BaseRun.of(model, corrupted.tokens, names)
    return TraceRun(base, dict(clean.items()), dict(corrupt.items()), metric,
                    metric_value(metric, clean_logits), metric_value(metric, base.logits), corrupted.first)


def restoration_grid(model: Transformer, run: TraceRun, kind: str, window: int = 1,
                     layers: Sequence[int] | None = None, positions: Sequence[int] | None = None
                     ) -> tuple[list[Site], torch.Tensor, torch.Tensor, bool]:
    """The patches of a restoration sweep of `kind`: one per (layer, position >= run.first), layer-major, as
    (sites, entry layers [n], positions [n], local) for grid.grid_sweep; layers / positions (default all, sorted
    non-negative indices): only those of the grid.

    hidden kinds: the residual stream leaving layer l is the one entering l + 1, so it is restored there and
    the patch starts at block l + 1 (block l's output at that position is replaced whole: nothing of it is
    recomputed); the last layer's is restored at its hook_resid_post. The severed kinds hold every MLP (attention)
    output above l at its corrupted value, all positions. mlp / attn: the window's outputs at the position,
    entering at the window's first layer, which they change at that position only (local)."""
    L, T = model.cfg.n_layers, run.base.logits.shape[1]
    chosen = list(range(L)) if layers is None else list(layers)
    at = [p for p in (range(T) if positions is None else positions) if p >= run.first]
    P = len(at)
    layer_of = torch.tensor(chosen, dtype=torch.long).repeat_interleave(P)
    pos_of = torch.tensor(at, dtype=torch.long).repeat(len(chosen))
    index = pos_of[:, None]
    if kind in ("mlp", "attn"):
        windows = [window_layers(l, window, L) for l in chosen]
        hook = RESTORES[kind]
        sites = [Site(act_name(hook, j), run.clean[act_name(hook, j)], (0,), index, pos_dim=0,
                      active=torch.tensor([j in w for w in windows]).repeat_interleave(P)) for j in range(L)]
        return sites, torch.tensor([w[0] for w in windows]).repeat_interleave(P), pos_of, True
    sites = [Site(act_name("resid_pre", l + 1) if l < L - 1 else act_name("resid_post", l),
                  run.clean[act_name("resid_post", l)], (0,), index, pos_dim=0, active=layer_of == l) for l in range(L)]
    if kind in FROZEN:
        none = torch.zeros(len(pos_of), 0, dtype=torch.long)
        sites += [Site(act_name(FROZEN[kind], j), run.corrupted[act_name(FROZEN[kind], j)], (), none, pos_dim=0,
                       active=layer_of < j) for j in range(1, L)]
    return sites, (layer_of + 1).clamp(max=L - 1), pos_of, False


def restoration_sweep(model: Transformer, run: TraceRun, kind: str, window: int = 1, batch_size: int | None = None,
                      progress: bool = True, layers: Sequence[int] | None = None,
                      positions: Sequence[int] | None = None) -> torch.Tensor:
    """The metric with each (layer, position) of `kind` restored from the clean run: [layer, pos]; with layers /
    positions (sorted non-negative indices) only those are traced, the other cells NaN (not traced).

    One staggered sweep (grid.grid_sweep) over the grid: patches sit in the batch dimension beside the noise
    samples, each computed from its layer and position on. States before the first corrupted position are the
    clean run's already (attention is causal): restoring them gives the corrupted value, which is filled in
    without a forward pass.
    """
    L, T = model.cfg.n_layers, run.base.logits.shape[1]
    rows = list(range(L)) if layers is None else list(layers)
    cols = list(range(T)) if positions is None else list(positions)
    sites, entries, at, local = restoration_grid(model, run, kind, window, rows, cols)
    out = torch.full((L, T), math.nan, dtype=torch.float64)
    traced = [p for p in cols if p >= run.first]
    grid = out[rows][:, cols]
    grid[:] = run.corrupt_value   # before the first corrupted position: the corrupted value, no pass needed
    if traced and rows:
        values = grid_sweep(model, run.base, sites, run.metric, entries, at, local, batch_size, progress,
                            desc=f"tracing {kind}").view(len(rows), len(traced))
        grid[:, [cols.index(p) for p in traced]] = values
    out[torch.tensor(rows)[:, None], torch.tensor(cols)[None]] = grid
    return out


def restore_everything(model: Transformer, run: TraceRun, layer: int, kind: str = "hidden") -> float:
    """The metric with `kind` restored at every position at once (hidden: the residual stream leaving
    `layer`): the whole clean state at that layer, so it equals the clean metric (a check)."""
    site = Site(act_name(RESTORES[kind], layer), run.clean[act_name(RESTORES[kind], layer)], (),
                torch.zeros(1, 0, dtype=torch.long), pos_dim=0)
    return float(sweep(model, run.base, layer, [site], run.metric, progress=False)[0])


@dataclass
class CausalTrace(Displayed):
    """Causal tracing of one prompt.

    values: kind -> [layer, pos], the metric with that state restored (mlp / attn: the window of `window`
    layers centred on the layer); clean_value / corrupt_value: the metric on the clean prompt and averaged
    over the corrupted runs; subject: the corrupted positions start..end-1; answer: the token measured.
    """

    tokens: list[int]
    subject: tuple[int, int]
    answer: int
    metric: str
    clean_value: float
    corrupt_value: float
    values: dict[str, torch.Tensor]
    window: int
    noise: dict[str, Any]
    token_strs: list[str] | None = None
    answer_str: str | None = None

    @property
    def total_effect(self) -> float:
        """clean - corrupted: what the corruption took away."""
        return self.clean_value - self.corrupt_value

    def indirect_effect(self, kind: str) -> torch.Tensor:
        """values - corrupted [layer, pos]: how much each restoration gave back."""
        return self.values[kind] - self.corrupt_value

    def peak(self, kind: str) -> dict[str, Any]:
        """The restoration that gave back most: layer, pos, token, effect and share of the total effect."""
        ie = self.indirect_effect(kind)
        i = int(ie.nan_to_num(-math.inf).flatten().argmax())
        layer, pos = divmod(i, ie.shape[1])
        effect = float(ie[layer, pos])
        share = effect / self.total_effect if self.total_effect else float("nan")
        token = self.token_strs[pos] if self.token_strs else str(self.tokens[pos])
        return {"layer": layer, "pos": pos, "token": token, "effect": effect, "share": share}

    def summary(self) -> list[str]:
        answer = repr(self.answer_str) if self.answer_str is not None else str(self.answer)
        s, e = self.subject
        subject = "".join(self.token_strs[s:e]) if self.token_strs else str(self.tokens[s:e])
        lines = [f"{self.metric} of {answer}: clean {self.clean_value:.4g}, subject {subject!r} corrupted "
                 f"{self.corrupt_value:.4g} (total effect {self.total_effect:+.4g})"]
        for kind in self.values:
            p = self.peak(kind)
            where = f"layer {p['layer']}" + (f" (window of {self.window})" if kind in ("mlp", "attn") else "")
            lines.append(f"{kind}: strongest at {where}, position {p['pos']} {p['token']!r}: indirect effect "
                         f"{p['effect']:+.4g}, {p['share']:.0%} of the total")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_strs": self.token_strs, "subject": list(self.subject),
                "answer": self.answer, "answer_str": self.answer_str, "metric": self.metric,
                "clean_value": round(self.clean_value, 8), "corrupt_value": round(self.corrupt_value, 8),
                "total_effect": round(self.total_effect, 8), "window": self.window, "noise": self.noise,
                "axes": ["layer", "pos"], "values": {k: rounded(v, 8) for k, v in self.values.items()},
                "peaks": {k: {**p, "effect": round(p["effect"], 8), "share": round(p["share"], 6)}
                          for k, p in ((k, self.peak(k)) for k in self.values)}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CausalTrace":
        """The trace its to_dict() form describes (results.json); total_effect and peaks are recomputed, a null
        value (NaN when written) is NaN again."""
        def grid(v: list) -> torch.Tensor:
            return torch.tensor([[math.nan if x is None else x for x in row] for row in v], dtype=torch.float64)
        return cls(list(d["tokens"]), (int(d["subject"][0]), int(d["subject"][1])), int(d["answer"]), d["metric"],
                   float(d["clean_value"]), float(d["corrupt_value"]), {k: grid(v) for k, v in d["values"].items()},
                   int(d["window"]), dict(d["noise"]), d.get("token_strs"), d.get("answer_str"))


# The share of the machine's matmul speed (perf.matmul_gflops) causal tracing's staggered sweeps reach on a CPU:
# 0.6-0.85 measured on SmolLM2-135M's shape at 10 tokens, 10 noise runs, 4 kinds, one thread (load 3-14).
TRACE_EFFICIENCY = 0.7


def trace_flops(cfg, n_pos: int, runs: int = 10, kinds: int | Sequence[str] = 3, window: int | None = None,
                first: int = 0, layers: Sequence[int] | None = None, positions: Sequence[int] | None = None
                ) -> tuple[float, float]:
    """(flops, the naive sweep's flops) of causal tracing one prompt of n_pos tokens, corrupted from position
    `first`, with `runs` noise runs: the clean and corrupted runs, then each kind's grid of restorations as
    restoration_sweep computes them (work.grid_flops: from the restored layer and position on); the naive sweep
    runs a full forward per (layer, position). kinds: names, or a count of KINDS in order. layers / positions: the
    traced ones (non-negative; default all)."""
    names = list(KINDS[:kinds]) if isinstance(kinds, int) else list(kinds)
    L = cfg.n_layers
    w = default_window(L) if window is None else window
    layers_given, positions_given = layers, positions
    grid = [(l, p) for l, p in zip(*full_grid(L, n_pos, first))
            if (layers is None or l in layers) and (positions is None or p in positions)]
    layers, positions = [l for l, _ in grid], [p for _, p in grid]
    done = naive_flops(cfg, n_pos) * (1 + runs)
    for kind in names:
        if kind in ("mlp", "attn"):
            done += runs * grid_flops(cfg, n_pos, [window_layers(l, w, L)[0] for l in layers], positions, local=True)
        else:
            done += runs * grid_flops(cfg, n_pos, [min(l + 1, L - 1) for l in layers], positions)
    cells = (L if layers_given is None else len(layers_given)) * (n_pos if positions_given is None else
                                                                  len(positions_given))
    return done, naive_flops(cfg, n_pos) * (1 + runs + runs * len(names) * cells)


@torch.no_grad()
def trace_estimate(model: Transformer, n_pos: int, runs: int = 10, kinds: int | Sequence[str] = 3,
                   layers: Sequence[int] | None = None, positions: Sequence[int] | None = None,
                   window: int | None = None, first: int = 0) -> memory.Estimate:
    """What causal tracing of one prompt of n_pos tokens with `runs` noise runs holds and computes: every run's
    cached activations (one batch: noise.run_floats) and a chunk of restored copies of them; the flops of
    trace_flops (corrupted from position `first`: the default 0, the whole prompt, is an upper bound), said as a
    share of the naive sweep's."""
    cfg = model.cfg
    check_runs(cfg, runs, 1, n_pos)
    size = next(model.parameters()).element_size()
    held = runs * run_floats(cfg, n_pos) * size
    # a chunk of restored copies, each the working set of one block over the positions it recomputes and the
    # logits at the position the metric reads (the engine recomputes from the restored layer and position on)
    per_copy = n_pos * (2 * cfg.d_model + (cfg.mlp_dim if cfg.has_mlp else 0)) + cfg.d_vocab
    chunk = min(chunk_size(model, runs, n_pos), cfg.n_layers * n_pos) * runs * per_copy * size
    flops, naive = trace_flops(cfg, n_pos, runs, kinds, window, first, layers=layers, positions=positions)
    count = kinds if isinstance(kinds, int) else len(kinds)
    n_l = cfg.n_layers if layers is None else len(layers)
    n_p = n_pos if positions is None else len(positions)
    return memory.Estimate(f"causal tracing ({runs} noise runs of {n_pos} tokens, {count} kinds x {n_l} "
                           f"layers x {n_p} positions; {flops / naive:.0%} of the naive sweep's flops)",
                           {"noise runs' activations": held, "restored copies": chunk},
                           held=memory.tensor_bytes(model), flops=flops, efficiency=TRACE_EFFICIENCY)


def causal_trace(model: Transformer, tokens, subject: Any, answer: int | str | None = None, *, tokenizer=None,
                 kinds: Sequence[str] | None = None, window: int | None = None, metric: str = "prob",
                 wrong: int | str | None = None, noise: Noise | None = None, batch_size: int | None = None,
                 progress: bool = True, layers: Sequence[int] | None = None,
                 positions: Sequence[int] | None = None) -> CausalTrace:
    """Causal tracing of one prompt: tokens [pos] (or [1, pos]).

    subject: the tokens to corrupt (text with tokenizer, token ids, or a (start, end) span). answer: the
    token measured at the last position (default: the clean run's top token; text needs the tokenizer).
    kinds: see the module docstring (default hidden, mlp, attn). window: layers restored together for mlp
    and attn (default default_window(n_layers)). metric: "prob" (the paper's), "logprob" or "logit_diff"
    (answer - wrong). noise: Noise() by default. batch_size: restorations per forward pass (default: a
    memory budget; 1 = one at a time). layers / positions: trace only these (positions may count from the end:
    -1 is the last); the cells left out are NaN. Returns a CausalTrace with values [layer, pos] per kind.
    """
    noise = noise if noise is not None else Noise()
    kinds = check_kinds(model, kinds)
    window = check_window(model, window)
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; metrics: {', '.join(METRICS)}")
    tokens = one_sequence(model, tokens, "causal tracing")
    layers, positions = check_grid(model, len(tokens), layers, positions)
    start, end = subject_span(tokens.tolist(), subject, tokenizer)
    noise.check(end - start, model.cfg.d_vocab)
    answer, wrong = _token(answer, tokenizer, "answer"), _token(wrong, tokenizer, "wrong answer")
    for t, what in ((answer, "answer"), (wrong, "wrong answer")):
        if t is not None and not 0 <= t < model.cfg.d_vocab:
            raise InputError(f"the {what} token {t} is outside the vocabulary [0, {model.cfg.d_vocab})")
    if answer is None:
        answer = int(model(tokens[None])[0, -1].argmax())
    measure = _metric(metric, answer, wrong)
    corrupted = corrupt_positions(model, tokens, range(start, end), noise)
    run = trace_run(model, tokens, corrupted, measure)
    if not math.isfinite(run.clean_value):
        raise InputError(f"the clean run gave a non-finite {metric}: the model's own activations overflow on this "
                         "prompt (a broken checkpoint?)")
    if not math.isfinite(run.corrupt_value):
        raise InputError(f"the corrupted runs gave a non-finite {metric}: the noise (nu {corrupted.nu:.3g}) "
                         "overflows the model's activations; give a smaller noise scale")
    values = {k: restoration_sweep(model, run, k, window, batch_size, progress, layers, positions) for k in kinds}
    return CausalTrace(tokens.tolist(), (start, end), answer, measure.__name__, run.clean_value, run.corrupt_value,
                       values, window, noise.describe(corrupted.nu), _pieces(tokens, tokenizer),
                       None if tokenizer is None else tokenizer.decode([answer]))


def _token(value: int | str | None, tokenizer, what: str) -> int | None:
    if value is None or isinstance(value, int):
        return value
    if tokenizer is None:
        raise InputError(f"an {what} given as text needs the tokenizer (tokenizer=...)")
    return tokenizer.token_id(value, what)


# ---------------------------------------------------------------------------- many prompts


def token_categories(n_pos: int, subject: tuple[int, int]) -> list[list[int]]:
    """The positions of each of CATEGORIES (the paper's grouping for averages over prompts); a one-token
    subject is both its first and its last token."""
    s, e = subject
    return [[s], list(range(s + 1, e - 1)), [e - 1], [e] if e < n_pos - 1 else [],
            list(range(e + 1, n_pos - 1)), [n_pos - 1]]


@dataclass
class AverageTrace(Displayed):
    """Causal tracing averaged over prompts: the average indirect effect (AIE) of restoring each kind,
    [layer, category] per kind, the categories being CATEGORIES (NaN where no prompt has that category),
    and the average total effect (ATE)."""

    values: dict[str, torch.Tensor]
    total_effect: float
    counts: list[int]
    metric: str
    window: int
    noise: dict[str, Any]
    traces: list[CausalTrace] = field(default_factory=list)
    categories: tuple[str, ...] = CATEGORIES

    def peak(self, kind: str) -> dict[str, Any]:
        v = self.values[kind]
        i = int(v.nan_to_num(-math.inf).flatten().argmax())
        layer, c = divmod(i, v.shape[1])
        effect = float(v[layer, c])
        return {"layer": layer, "category": self.categories[c], "effect": effect,
                "share": effect / self.total_effect if self.total_effect else float("nan")}

    def summary(self) -> list[str]:
        lines = [f"{len(self.traces)} prompts; average total effect {self.total_effect:+.4g} ({self.metric})"]
        for kind in self.values:
            p = self.peak(kind)
            lines.append(f"{kind}: average indirect effect strongest at layer {p['layer']}, {p['category']}: "
                         f"{p['effect']:+.4g}, {p['share']:.0%} of the average total effect")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"categories": list(self.categories), "counts": self.counts, "metric": self.metric,
                "window": self.window, "noise": self.noise, "total_effect": round(self.total_effect, 8),
                "axes": ["layer", "category"], "values": {k: rounded(v, 8) for k, v in self.values.items()},
                "peaks": {k: self.peak(k) for k in self.values},
                "prompts": [t.to_dict() for t in self.traces]}


def average_traces(traces: Sequence[CausalTrace]) -> AverageTrace:
    """The average indirect effect by token category and the average total effect of several traces."""
    if not traces:
        raise InputError("average_traces needs at least one trace")
    kinds = list(traces[0].values)
    sums = {k: torch.zeros(traces[0].values[k].shape[0], len(CATEGORIES), dtype=torch.float64) for k in kinds}
    counts = [0] * len(CATEGORIES)
    for t in traces:
        for c, pos in enumerate(token_categories(len(t.tokens), t.subject)):
            if not pos:
                continue
            counts[c] += 1
            for k in kinds:
                sums[k][:, c] += t.indirect_effect(k)[:, pos].double().mean(1)
    n = torch.tensor([float(c) if c else float("nan") for c in counts], dtype=torch.float64)
    first = traces[0]
    return AverageTrace({k: s / n for k, s in sums.items()}, sum(t.total_effect for t in traces) / len(traces),
                        counts, first.metric, first.window, first.noise, list(traces))


@torch.no_grad()
def average_causal_trace(model: Transformer, prompts: Sequence, subjects: Sequence, answers: Sequence | None = None, *,
                         tokenizer=None, kinds: Sequence[str] | None = None, window: int | None = None,
                         metric: str = "prob", wrongs: Sequence | None = None, noise: Noise | None = None,
                         batch_size: int | None = None, progress: bool = True) -> AverageTrace:
    """Causal tracing of many prompts (each tokens [pos], or text with tokenizer), averaged by token category.

    The noise's std is measured once over every prompt's subject tokens (as the paper does over its data
    set), so all prompts get the same nu. answers / wrongs: one per prompt (default: each clean top token).
    """
    if len(prompts) != len(subjects) or not prompts:
        raise InputError(f"give one subject per prompt (got {len(prompts)} prompts and {len(subjects)} subjects)")
    noise = noise if noise is not None else Noise()
    kinds, window = check_kinds(model, kinds), check_window(model, window)
    if tokenizer is None and any(isinstance(p, str) for p in prompts):
        raise InputError("prompts given as text need the tokenizer (tokenizer=...)")
    seqs = [one_sequence(model, tokenizer.encode(p) if isinstance(p, str) else p, "causal tracing") for p in prompts]
    spans = [subject_span(t.tolist(), s, tokenizer) for t, s in zip(seqs, subjects)]
    if noise.kind != "replace" and noise.std is None:
        subject_tokens = torch.cat([t[s:e] for t, (s, e) in zip(seqs, spans)])
        noise = replace(noise, std=embedding_std(model, subject_tokens))
    answers = list(answers) if answers is not None else [None] * len(seqs)
    wrongs = list(wrongs) if wrongs is not None else [None] * len(seqs)
    traces = [causal_trace(model, t, span, a, tokenizer=tokenizer, kinds=kinds, window=window, metric=metric,
                           wrong=w, noise=noise, batch_size=batch_size, progress=False)
              for t, span, a, w in tqdm(list(zip(seqs, spans, answers, wrongs)), desc="causal tracing",
                                        unit="prompt", delay=2.0, disable=not progress)]
    return average_traces(traces)
