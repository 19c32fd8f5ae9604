"""Attribution: the adjacency matrix of a prompt's graph, by batched backward passes.

    graph = attribute(model, transcoders, tokens)               # tokens [pos]
    graph.adjacency                                             # [n_nodes, n_nodes], rows = targets

A[target, source] is the direct effect of the source on the target through the frozen linear system
(replacement model, features fixed): for a feature target its encoder pre-activation, for a logit
target its demeaned logit (the logit minus the mean logit over the vocabulary; a logit difference is
demeaned already). A source contributes act * decoder vector (a feature; a cross-layer feature at every
layer it writes), its error vector (an error node) or its embedding (a token node); the edge is that
contribution dotted with the gradient of the target at the place it is added.

Each backward pass computes many target rows at once: the forward runs `batch_size` copies of the
prompt through the frozen system, row b's target is injected into copy b only, and one
torch.autograd.grad gives every row's gradient at every MLP output and at the embedding. Rows are
grouped by layer, so a pass for layer-l targets runs backward through layers < l only.
"""
from __future__ import annotations

import contextlib
import math
import resource
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from circuitlab.errors import InputError
from circuitlab.graphs.graph import Graph, node_influence
from circuitlab.graphs.replacement import ReplacementModel
from circuitlab.graphs.transcoders import Transcoders
from circuitlab.model.assumptions import require
from circuitlab.model.hooks import HookPoint


@dataclass
class LogitTarget:
    """One logit node: a label, a direction over the vocabulary [d_vocab] (demeaned when used), its weight
    (the token's probability, or 1 for a named direction) and the token id (-1 for a direction)."""

    label: str
    direction: torch.Tensor
    weight: float
    token: int = -1


def top_logit_targets(logits: torch.Tensor, max_n_logits: int = 10, desired_logit_prob: float = 0.95,
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
    """The direction logit[token] - logit[foil] as one logit node (weight 1)."""
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


N_SPANS = 4  # feature targets are batched by span of positions: a pass runs over the positions up to its span's end


class _Stop(Exception):
    """Raised in a hook to end a forward pass once everything attribution needs is computed."""


class _MLPStandIn(torch.nn.Module):
    """Takes an MLP's place during a linear pass: its output is replaced at hook_mlp_out anyway (by the
    skip path plus a constant), so running the real MLP on every copy would be wasted work."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.d_model)


@contextlib.contextmanager
def _mlps_stood_in(model: Any) -> Iterator[None]:
    """Swap every block's MLP for an _MLPStandIn for the block; restored on exit, even on error."""
    saved = [(block, block.mlp) for block in model.blocks if getattr(block, "mlp", None) is not None]
    try:
        for block, _ in saved:
            block._modules["mlp"] = _MLPStandIn(model.cfg.d_model)
        yield
    finally:
        for block, mlp in saved:
            block._modules["mlp"] = mlp


class _LinearPass:
    """One forward of `batch` copies of the prompt's first `n_pos` positions through the frozen linear
    system, kept for backward (causal: targets at positions < n_pos see only those positions).

    x[l]: each layer's transcoder input [batch, n_pos, d_in] (feature targets are injected here);
    out[l]: each layer's MLP output [batch, n_pos, d_model] (where feature and error sources add);
    embed: the embedding [batch, n_pos, d_model] (token sources); logits: the last position's [batch, d_vocab]."""

    def __init__(self, rm: ReplacementModel, batch: int, n_pos: int | None = None, logits: bool = True) -> None:
        model, tc = rm.model, rm.tc
        P = self.n_pos = n_pos or rm.n_pos
        self.x: dict[int, torch.Tensor] = {}
        self.out: dict[int, torch.Tensor] = {}
        fns: list[tuple[str, Any]] = []

        def embed(t: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            self.embed = t.detach().requires_grad_(True)
            return self.embed

        def read(x: torch.Tensor, hook: HookPoint) -> None:
            self.x[int(hook.name.split(".")[1])] = x

        def write(y: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            layer = int(hook.name.split(".")[1])
            const = rm.mlp_out[layer][:P]
            skip = tc.skip(layer, self.x[layer]) if tc.has(layer) else None
            if skip is None:
                out = const.to(y.dtype).expand_as(y).clone().requires_grad_(True)
            else:  # the skip path stays linear in the input; the rest of the output is constant
                ref_skip = tc.skip(layer, rm.inputs[layer][:P])
                out = skip.to(y.dtype) + (const - ref_skip).to(y.dtype)
            self.out[layer] = out
            return out

        def stop(x: torch.Tensor, hook: HookPoint) -> None:
            self.resid = x
            raise _Stop

        fns.append(("hook_embed", embed))
        if "hook_pos_embed" in model.hook_points():
            fns.append(("hook_pos_embed", lambda t, hook: t.detach()))
        fns += [(tc.input_hook(layer), read) for layer in tc.layers]
        fns += [(tc.output_hook(layer), write) for layer in range(tc.n_layers)]
        fns.append((f"blocks.{tc.n_layers - 1}.hook_resid_post", stop))
        with torch.enable_grad(), model.frozen(rm.frozen), model.hooks(fns), _mlps_stood_in(model):
            try:
                model(rm.tokens[None, :P].expand(batch, -1))
            except _Stop:
                pass
            if logits:  # the model's read-out (its final norm's scale frozen), at the last position
                self.logits = model.readout(self.resid)[:, -1]                       # [batch, d_vocab]


class _Columns:
    """Turns gradients at the sources' places into adjacency columns (all sources, in node order)."""

    @torch.no_grad()
    def __init__(self, rm: ReplacementModel, features: torch.Tensor, values: torch.Tensor, dtype: torch.dtype):
        tc, T = rm.tc, rm.n_pos
        self.n_feat, self.T, self.L = len(features), T, tc.n_layers
        self.n_cols = self.n_feat + (self.L + 1) * T
        # per target layer k: per position, (columns, act * decoder vector into k)
        self.writes: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        for layer in tc.layers:
            mine = (features[:, 0] == layer).nonzero().flatten()
            if not len(mine):
                continue
            dec = tc.decoder_vectors(layer, features[mine, 2]).to(dtype)          # [n, w, d]
            dec = dec * values[mine].to(dtype)[:, None, None]
            for i, k in enumerate(tc.writes(layer)):
                for p in features[mine, 1].unique().tolist():
                    sel = (features[mine, 1] == p).nonzero().flatten()
                    self.writes.setdefault(k, []).append((p, mine[sel], dec[sel, i]))
        errs = torch.stack([rm.errors[k] for k in range(self.L)]).to(dtype).clone()   # [L, T, d]
        if rm.bos:
            errs[:, 0] = 0  # position 0's MLP output is a constant, not a node
        self.errors = errs
        self.embeds = rm.embeddings.to(dtype)

    @torch.no_grad()
    def rows(self, grads_out: dict[int, torch.Tensor], grad_embed: torch.Tensor) -> torch.Tensor:
        """grads_out {layer: [batch, pos, d_model]}, grad_embed [batch, pos, d_model] -> [batch, n_cols]."""
        B, P = grad_embed.shape[:2]  # a pass over the first P positions: later sources get no gradient
        rows = grad_embed.new_zeros(B, self.n_cols)
        for k, g in grads_out.items():
            for p, cols, vecs in self.writes.get(k, ()):
                if p < P:
                    rows[:, cols] += g[:, p] @ vecs.T
            start = self.n_feat + k * self.T
            rows[:, start:start + P] = torch.einsum("btd,td->bt", g, self.errors[k][:P])
        start = self.n_feat + self.L * self.T
        rows[:, start:start + P] = torch.einsum("btd,td->bt", grad_embed, self.embeds[:P])
        return rows


def attribute(model: Any, transcoders: Transcoders, tokens: torch.Tensor, targets: Sequence[Any] | None = None,
              max_n_logits: int = 10, desired_logit_prob: float = 0.95, batch_size: int = 128,
              max_feature_nodes: int | None = None, bos: bool = False, tokenizer: Any = None,
              progress: bool = False, dtype: torch.dtype | None = None, prompt: str | None = None,
              verbose: bool = False) -> Graph:
    """The attribution graph of the next-token prediction at the prompt's last position (tokens [pos]).

    targets: None (the top tokens until desired_logit_prob, at most max_n_logits) or a list of token ids,
    (label, direction [d_vocab]) pairs and LogitTargets (see logit_difference).
    max_feature_nodes: keep at most this many feature nodes, visited greedily by their influence on the
    logits (estimated from the rows computed so far), for long prompts.
    bos: position 0 is an attention sink (circuit-tracer's convention): no features, no error node there.
    dtype: compute in this dtype (default: the model's).
    Returns the unpruned Graph, with its timings and peak memory in graph.info.
    """
    t0 = time.perf_counter()
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise InputError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if max_feature_nodes is not None and not (isinstance(max_feature_nodes, int) and max_feature_nodes >= 0):
        raise InputError(f"max_feature_nodes must be a whole number >= 0, got {max_feature_nodes!r}")
    if not 0 < desired_logit_prob <= 1:
        raise InputError(f"desired_logit_prob must be in (0, 1], got {desired_logit_prob}")
    require(model, "attribution graphs (demeaned logits)", "linear_readout")
    dtype = dtype or next(model.parameters()).dtype
    rm = ReplacementModel(model, transcoders, tokens, bos=bos)
    features = rm.active_features                                       # [n, 3] sorted (layer, pos, feature)
    values = torch.stack([rm.acts[int(l_)][p, f] for l_, p, f in features.tolist()]) if len(features) \
        else torch.zeros(0)
    last = rm.logits[-1]
    logit_targets = (top_logit_targets(last, max_n_logits, desired_logit_prob, tokenizer) if targets is None
                     else named_logit_targets(last, targets, tokenizer))
    t_setup = time.perf_counter() - t0

    n_feat, T, L = len(features), rm.n_pos, transcoders.n_layers
    n_logit = len(logit_targets)
    n_active = n_feat
    cap = n_feat if max_feature_nodes is None else min(max_feature_nodes, n_feat)
    cols = _Columns(rm, features, values, dtype)
    B = max(1, min(batch_size, max(n_logit, cap)))
    t1 = time.perf_counter()
    t_forward = 0.0
    n_passes = 0
    current: dict[int, _LinearPass] = {}

    def linear_pass(n_pos: int) -> _LinearPass:
        """The kept forward over the first n_pos positions (one at a time: the last one is dropped)."""
        nonlocal t_forward
        if n_pos not in current:
            current.clear()
            t = time.perf_counter()
            current[n_pos] = _LinearPass(rm, B, n_pos, logits=False)
            t_forward += time.perf_counter() - t
        return current[n_pos]

    def backward(lp: _LinearPass, inject: dict[int, torch.Tensor], logit_dirs: torch.Tensor | None) -> torch.Tensor:
        nonlocal n_passes
        n_passes += 1
        outputs, grads = [], []
        for layer, g in inject.items():
            outputs.append(lp.x[layer])
            grads.append(g.to(lp.x[layer].dtype))
        if logit_dirs is not None:
            outputs.append(lp.logits)
            grads.append(logit_dirs.to(lp.logits.dtype))
        out_layers = sorted(lp.out)
        found = torch.autograd.grad(outputs, [lp.out[k] for k in out_layers] + [lp.embed], grads,
                                    retain_graph=True, allow_unused=True)
        g_out = {k: g for k, g in zip(out_layers, found[:-1]) if g is not None}
        g_emb = found[-1] if found[-1] is not None else torch.zeros_like(lp.embed)
        return cols.rows({k: g.to(dtype) for k, g in g_out.items()}, g_emb.to(dtype))

    # Logit rows first (they also seed the influence order when feature nodes are capped).
    dirs = torch.stack([t.direction - t.direction.mean() for t in logit_targets])     # demeaned [n_logit, V]
    t = time.perf_counter()
    logit_pass = _LinearPass(rm, n_logit, T, logits=True)  # its own pass: n_logit rows of [pos, d_vocab] logits
    t_forward += time.perf_counter() - t
    logit_rows_t = backward(logit_pass, {}, dirs)
    del logit_pass
    weights = torch.tensor([t.weight for t in logit_targets], dtype=torch.float64)

    feature_rows = torch.zeros(n_feat, cols.n_cols, dtype=dtype)
    visited = torch.zeros(n_feat, dtype=torch.bool)

    def feature_batch(idx: torch.Tensor, n_pos: int) -> None:
        lp = linear_pass(n_pos)
        inject: dict[int, torch.Tensor] = {}
        for layer in features[idx, 0].unique().tolist():
            sel = (features[idx, 0] == layer).nonzero().flatten()
            x = lp.x[layer]
            g = torch.zeros(B, n_pos, x.shape[-1], dtype=x.dtype)
            vecs = transcoders.encoder_vectors(layer, features[idx[sel], 2]).detach().to(x.dtype)  # [n, d_in]
            g[sel, features[idx[sel], 1]] = vecs
            inject[layer] = g
        rows = backward(lp, inject, None)
        feature_rows[idx] = rows[:len(idx)]
        visited[idx] = True

    bar = tqdm(total=cap, desc="attribution", unit="feature", disable=not progress)
    if cap == n_feat:
        # Every feature, in batches of one layer and one span of positions: a pass for layer-l targets runs
        # backward through the layers below l only, and (attention is causal) over the positions up to the
        # span's end only.
        span = T if T < 16 else math.ceil(T / N_SPANS)
        ends = ((features[:, 1] // span + 1) * span).clamp(max=T)
        for end in ends.unique().tolist():
            for layer in features[:, 0].unique().tolist():
                mine = ((ends == end) & (features[:, 0] == layer)).nonzero().flatten()
                for i in range(0, len(mine), B):
                    feature_batch(mine[i:i + B], int(end))
                    bar.update(len(mine[i:i + B]))
    else:
        # Greedy: the features with the most influence on the logits so far, a few batches at a time.
        while int(visited.sum()) < cap:
            partial = _partial_rows(feature_rows, visited, logit_rows_t, n_feat, cols.n_cols)
            w = torch.zeros(partial.shape[0], dtype=torch.float64)
            w[cols.n_cols:] = weights
            influence = node_influence(partial, w)[:n_feat]
            influence[visited] = -math.inf
            todo = influence.argsort(descending=True)[:min(4 * B, cap - int(visited.sum()))]
            todo = todo[features[todo, 0].argsort(stable=True)]
            for i in range(0, len(todo), B):
                feature_batch(todo[i:i + B], T)
                bar.update(len(todo[i:i + B]))
    bar.close()
    current.clear()
    t_backward = time.perf_counter() - t1 - t_forward

    # Assemble: nodes = [selected features, errors (layer-major), tokens, logits].
    selected = visited.nonzero().flatten() if cap < n_feat else torch.arange(n_feat)
    keep_cols = torch.cat([selected, torch.arange(n_feat, cols.n_cols)])
    n_nodes = len(selected) + (L + 1) * T + n_logit
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=dtype)
    adjacency[:len(selected), :len(keep_cols)] = feature_rows[selected][:, keep_cols]
    adjacency[n_nodes - n_logit:, :len(keep_cols)] = logit_rows_t[:, keep_cols]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    info = {"seconds": {"setup": t_setup, "forward": t_forward, "backward": t_backward,
                        "total": time.perf_counter() - t0},
            "n_active_features": n_active, "n_feature_nodes": len(selected), "batch_size": B,
            "backward_passes": n_passes,
            "adjacency_mb": adjacency.numel() * adjacency.element_size() / 2**20, "peak_rss_mb": peak}
    if verbose:
        s = info["seconds"]
        print(f"attribution: {n_active} active features ({len(selected)} kept as nodes), {n_nodes} nodes, "
              f"{info['backward_passes']} backward passes of {B} rows; {s['total']:.2f} s "
              f"(forward {s['forward']:.2f}, backward {s['backward']:.2f}); adjacency {info['adjacency_mb']:.1f} MB, "
              f"peak RSS {peak:.0f} MB")
    token_strs = [_token_label(tokenizer, int(t)) for t in rm.tokens] if tokenizer is not None else None
    return Graph(tokens=rm.tokens.clone(), active_features=features, activations=values.to(dtype),
                 selected=selected, adjacency=adjacency, logit_labels=[t.label for t in logit_targets],
                 logit_tokens=torch.tensor([t.token for t in logit_targets], dtype=torch.long),
                 logit_weights=weights, n_layers=L, bos=bos, token_strs=token_strs, prompt=prompt,
                 transcoders=transcoders.describe(), info=info)


def _partial_rows(feature_rows: torch.Tensor, visited: torch.Tensor, logit_rows: torch.Tensor, n_feat: int,
                  n_cols: int) -> torch.Tensor:
    """A square matrix over [features, errors, tokens, logits] with the rows computed so far."""
    n = n_cols + len(logit_rows)
    m = torch.zeros(n, n, dtype=torch.float64)
    m[:n_feat, :n_cols] = torch.where(visited[:, None], feature_rows, 0).double()
    m[n_cols:, :n_cols] = logit_rows.double()
    return m
