"""Input attribution: which input tokens a prediction depends on.

    attr = integrated_gradients(model, tokens, target=tok_id, foil=other_id)   # tokens [pos]
    attr.scores                  # [pos] one number per input token
    attr.completeness_error      # |Σ scores − (f(x) − f(baseline))| / |f(x) − f(baseline)|
    saliency(...), gradient_x_input(...), occlusion(..., span=1), context_mixing(model, tokens)
    kernel_shap(..., samples=1024, baseline="mean", seed=0), lime(..., samples=1024, kernel_width=1.0)

What is explained is a metric of the logits: by default the logit of `target` at position `pos`
(the next-token prediction there), minus the logit of `foil` when one is given (contrastive), or
any function `metric(logits [batch, pos, d_vocab]) -> [batch]`. Gradient methods differentiate with
respect to the token embeddings (the output of hook_embed; positional embeddings stay as they are),
the convention of Captum's LayerIntegratedGradients on the embedding layer. Integrated gradients runs
all its steps as batched forward/backward passes in chunks (of `batch_size`; by default as many path points
as fit ROW_BUDGET floats of saved activations, as Captum's internal_batch_size bounds its memory), never one
call per step; occlusion runs its occluded copies the same way. Memory stays bounded whatever the count. Context mixing reads no gradient: it is the
norm-based measure (Kobayashi et al. 2020) of how much each source position's value vector, weighted
by attention and sent through W_O, moves into each position, with the residual stream kept, rolled out
through every layer. KernelSHAP and LIME treat the tokens up to pos as players that are present (their
embedding) or removed (the baseline's embedding, or the token deleted from the sequence), evaluate the model on
sampled coalitions in batched forward passes, and fit a linear surrogate (analysis/surrogate.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import torch
from tqdm.auto import tqdm

from circuitlab.analysis import surrogate
from circuitlab.analysis._json import rounded
from circuitlab.checks import COUNT, NONNEG, POSITIVE, Number
from circuitlab.analysis.patching.checks import one_sequence
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError
from circuitlab.model import frozen_parameters

Metric = Callable[[torch.Tensor], torch.Tensor]  # logits [batch, pos, d_vocab] -> [batch]
Explain = Callable[[torch.Tensor], torch.Tensor]  # token embeddings [batch, pos, d_model] -> explained value [batch]
Baseline = Union[str, int, torch.Tensor]
METHODS = ("ig", "saliency", "grad-x-input", "occlusion", "context-mixing", "shap", "lime")
DEFAULT_STEPS = 32  # Gauss-Legendre nodes; completeness error on the demo model: docs/attribution.md
# Limits on the path's points: Gauss-Legendre nodes come from an [n, n] eigenproblem (1024: 8 MB, 0.3 s;
# 50 000 would need 18.6 GiB), so beyond it use the midpoint (riemann) rule, whose points cost nothing.
STEPS = {"gausslegendre": Number(int, low=1, high=1024, why="Gauss-Legendre nodes solve an n x n eigenproblem; "
                                                            "rule='riemann' takes up to 100000"),
         "riemann": Number(int, low=1, high=100_000, why="more points take longer without a measurable change")}
ROW_BUDGET = 2 ** 26  # floats of activations a chunk of path points (or occluded copies) may hold: 256 MB
# KernelSHAP / LIME: model evaluations (coalitions), each one forward pass of the prompt; the regression holds
# [samples, pos] float64, bounded by ROW_BUDGET too (check_samples).
DEFAULT_SAMPLES = 1024  # KernelSHAP ranks the hand-built induction answer first on every test case from 1024 (docs)
SAMPLES = Number(int, low=3, high=100_000, why="each coalition is a forward pass of the prompt; past 100000 the "
                                                 "estimate's sampling error is below anything a figure shows")
SEED = Number(int, low=0, high=2 ** 63 - 1)
KERNEL_WIDTH = POSITIVE  # LIME: width of the exponential kernel on the cosine distance (in [0, 1])
DEFAULT_KERNEL_WIDTH = 1.0  # Captum's default
DEFAULT_ALPHA = 0.01  # LIME's L1 penalty: Captum's default surrogate, sklearn's Lasso(alpha=0.01)
EXACT_MAX_POSITIONS = 16  # exact Shapley values enumerate 2^M coalitions: 65 534 forward passes at 16
BASELINE_NAMES = ("zeros", "mean", "delete")


@dataclass
class InputAttribution(Displayed):
    """Attribution of one prediction to the input positions of one sequence.

    scores [pos]: one number per input token (for ig and grad-x-input they sum, over positions, to
    the model's metric change; saliency is the gradient's L2 norm; occlusion is the metric's drop when
    the token is replaced; context mixing is the share of the explained position's residual that came
    from each source, rolled out through every layer). per_layer [layer, pos]: context mixing's
    one-layer shares. metric_value: f(input); baseline_value, completeness_error: integrated gradients
    only (the relative gap between Σ scores and f(input) − f(baseline)).
    """

    method: str
    tokens: list[int]
    scores: torch.Tensor
    pos: int
    target: int | None = None
    foil: int | None = None
    metric_value: float | None = None
    baseline_value: float | None = None
    completeness_error: float | None = None
    steps: int | None = None
    baseline: str | None = None
    per_layer: torch.Tensor | None = None
    token_strs: list[str] | None = None
    target_str: str | None = None
    foil_str: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def top(self, n: int = 5) -> list[tuple[int, float]]:
        """The n positions with the largest |score|, with their signed score."""
        order = self.scores.abs().argsort(descending=True)[:n].tolist()
        return [(i, float(self.scores[i])) for i in order]

    def describe(self) -> str:
        what = self.target_str if self.target_str is not None else self.target
        line = f"{self.method} attribution of position {self.pos}"
        if what is not None:
            line += f", target {what!r}"
        if self.foil is not None:
            line += f" vs foil {self.foil_str if self.foil_str is not None else self.foil!r}"
        if "samples" in self.extra:  # KernelSHAP, LIME: how many coalitions, and how well a linear model fits them
            every = " (every one)" if self.extra.get("exact") else ""
            line += (f" ({self.extra['samples']} coalitions{every}, {self.baseline} baseline, surrogate R² "
                     f"{self.extra['surrogate_r2']:.2f})")
        elif self.completeness_error is not None:
            line += f" (completeness error {100 * self.completeness_error:.2g}% with {self.steps} steps)"
        return line

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "tokens": self.tokens, "scores": rounded(self.scores),
                             "pos": self.pos, "target": self.target, "foil": self.foil,
                             "metric_value": self.metric_value, "baseline_value": self.baseline_value,
                             "completeness_error": self.completeness_error, "steps": self.steps,
                             "baseline": self.baseline, "summary": self.describe(),
                             "top": [{"pos": p, "score": round(s, 6)} for p, s in self.top(5)], **self.extra}
        if self.per_layer is not None:
            d["per_layer"] = rounded(self.per_layer)
        if self.token_strs is not None:
            d.update(token_strs=self.token_strs, target_str=self.target_str, foil_str=self.foil_str)
        return d


# ---------------------------------------------------------------------------- inputs


def _sequence(tokens: torch.Tensor, model) -> torch.Tensor:
    return one_sequence(model, tokens, "input attribution")


def _check_token(t: int, name: str, d_vocab: int) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < d_vocab:
        raise CircuitlabError(f"{name} must be a token id in [0, {d_vocab}), got {t!r}")
    return t


def logit_metric(target: int, foil: int | None = None, pos: int = -1) -> Metric:
    """logits [batch, pos, d_vocab] -> logits[:, pos, target] (- logits[:, pos, foil]) [batch]."""
    if foil is not None and foil == target:
        raise CircuitlabError(f"the foil is the target ({target}): a logit difference with itself is always 0")

    def metric(logits: torch.Tensor) -> torch.Tensor:
        out = logits[:, pos, target]
        return out - logits[:, pos, foil] if foil is not None else out

    return metric


def _resolve(model, tokens: torch.Tensor, target: int | None, foil: int | None, pos: int,
             metric: Metric | None) -> tuple[Explain, int | None, int | None, int]:
    """What is explained, as explain(embeds [batch, pos, d_model]) -> [batch]; the target (the model's
    top prediction when not given); pos in [0, T)."""
    T = tokens.shape[0]
    if not -T <= pos < T:
        raise CircuitlabError(f"pos {pos} is outside the sequence of length {T}")
    pos %= T
    if metric is not None:
        if target is not None or foil is not None:
            raise CircuitlabError("give either metric= or target/foil, not both")
        return lambda embeds: _metric_of(model, tokens, embeds, metric), None, None, pos
    d_vocab = model.cfg.d_vocab
    if target is None:
        with torch.no_grad():
            target = int(model(tokens[None])[0, pos].argmax())
    _check_token(target, "target", d_vocab)
    if foil is not None:
        _check_token(foil, "foil", d_vocab)
    at_pos = logit_metric(target, foil, 0)
    return lambda embeds: at_pos(_logits_at(model, embeds, pos)), target, foil, pos


def _run_embeds(model, tokens: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """Forward with the token embeddings replaced: embeds [batch, pos, d_model] -> logits [batch, pos, d_vocab]."""

    def replace(_: torch.Tensor, hook) -> torch.Tensor:
        return embeds

    return model.run_with_hooks(tokens[None].expand(embeds.shape[0], -1), fwd_hooks=[("hook_embed", replace)])


def _logits_at(model, embeds: torch.Tensor, pos: int) -> torch.Tensor:
    """Logits [batch, 1, d_vocab] at position pos alone, the token embeddings being embeds [batch, ≥ pos+1,
    d_model]. model.forward's steps (and hook points), with two savings: positions after pos are not run
    (attention is causal, they cannot change pos) and the unembedding reads pos alone (it would cost as much
    as the blocks for a small model with a large vocabulary)."""
    x = model.resid_from_embeds(embeds[:, :pos + 1])
    for block in model.blocks:
        x = block(x)
    return model.readout(x[:, pos:])


def _logits_at_rows(model, embeds: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Logits [batch, 1, d_vocab] of each row at its own position last [batch], the token embeddings being
    embeds [batch, > max(last), d_model]: the blocks on every position, the unembedding at last alone."""
    x = model.resid_from_embeds(embeds)
    for block in model.blocks:
        x = block(x)
    return model.readout(x[torch.arange(len(last), device=x.device), last][:, None])


def _metric_of(model, tokens: torch.Tensor, embeds: torch.Tensor, metric: Metric) -> torch.Tensor:
    out = metric(_run_embeds(model, tokens, embeds))
    if out.shape != (embeds.shape[0],):
        raise CircuitlabError(f"the metric must map logits [batch, pos, d_vocab] to [batch]; got shape "
                              f"{tuple(out.shape)} for a batch of {embeds.shape[0]}")
    return out


def baseline_embeddings(model, tokens: torch.Tensor, baseline: Baseline) -> torch.Tensor:
    """The baseline's token embeddings [pos, d_model]: "zeros"; "mean" (the mean token embedding, at every
    position); a token id (e.g. pad or EOS) at every position; a prompt of the same length as tokens [pos]
    (token ids); or embeddings [pos, d_model]."""
    T, W_E = tokens.shape[0], model.W_E
    if isinstance(baseline, str):
        if baseline == "mean":
            every = model.token_embeddings(torch.arange(model.cfg.d_vocab, device=W_E.device)).detach()
            return every.mean(0).expand(T, -1).clone()
        if baseline != "zeros":
            raise CircuitlabError(f"unknown baseline {baseline!r}: give 'zeros', 'mean', a token id, a prompt's "
                                  "token ids or embeddings [pos, d_model]")
        return torch.zeros(T, W_E.shape[1], dtype=W_E.dtype, device=W_E.device)
    if isinstance(baseline, int) and not isinstance(baseline, bool):
        token = torch.tensor(_check_token(baseline, "the baseline token", model.cfg.d_vocab), device=W_E.device)
        return model.token_embeddings(token).detach().expand(T, -1).clone()
    base = torch.as_tensor(baseline)
    if base.dim() == 2 and base.is_floating_point():
        if base.shape != (T, W_E.shape[1]):
            raise CircuitlabError(f"baseline embeddings must be [pos, d_model] = [{T}, {W_E.shape[1]}], got "
                                  f"{list(base.shape)}")
        return base.to(W_E.device, W_E.dtype)
    if base.dim() != 1 or base.is_floating_point():
        raise CircuitlabError(f"a baseline prompt must be token ids [pos], got shape {tuple(base.shape)}")
    if base.shape[0] != T:
        raise CircuitlabError(f"the baseline prompt has {base.shape[0]} tokens but the input has {T}: "
                              "they must have the same length")
    if bool((base < 0).any() or (base >= model.cfg.d_vocab).any()):
        raise CircuitlabError(f"baseline token ids must be in [0, {model.cfg.d_vocab})")
    return model.token_embeddings(base.long().to(W_E.device)).detach()


def _baseline_name(baseline: Baseline) -> str:
    if isinstance(baseline, str):
        return baseline
    if isinstance(baseline, int):
        return f"token {baseline}"
    return "prompt" if not torch.as_tensor(baseline).is_floating_point() else "embeddings"


def _decorate(result: InputAttribution, tokenizer) -> InputAttribution:
    if tokenizer is not None:
        result.token_strs = [tokenizer.decode([t]) for t in result.tokens]
        result.target_str = tokenizer.decode([result.target]) if result.target is not None else None
        result.foil_str = tokenizer.decode([result.foil]) if result.foil is not None else None
    return result


# ---------------------------------------------------------------------------- gradient methods


def _gradient(model, tokens: torch.Tensor, explain: Explain) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(embeddings x [pos, d_model], d metric / d x [pos, d_model], metric value)."""
    x = model.token_embeddings(tokens).detach()
    with torch.enable_grad(), frozen_parameters(model):
        e = x[None].clone().requires_grad_(True)
        out = explain(e)
        (grad,) = torch.autograd.grad(out.sum(), e)
    return x, grad[0].detach(), float(out.detach()[0])


def saliency(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None, pos: int = -1,
             metric: Metric | None = None, tokenizer=None) -> InputAttribution:
    """L2 norm of the metric's gradient with respect to each token's embedding: scores [pos] (≥ 0)."""
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    _, grad, value = _gradient(model, tokens, explain)
    return _decorate(InputAttribution("saliency", tokens.tolist(), grad.norm(dim=-1).float().cpu(), pos, target,
                                      foil, value), tokenizer)


def gradient_x_input(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                     pos: int = -1, metric: Metric | None = None, tokenizer=None) -> InputAttribution:
    """Gradient · embedding, summed over d_model: scores [pos] (signed; IG with one step from zeros)."""
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    x, grad, value = _gradient(model, tokens, explain)
    return _decorate(InputAttribution("grad-x-input", tokens.tolist(), (grad * x).sum(-1).float().cpu(), pos,
                                      target, foil, value), tokenizer)


def path_nodes(steps: int, rule: str = "gausslegendre") -> tuple[torch.Tensor, torch.Tensor]:
    """Points alpha in (0, 1) on the straight path and their quadrature weights (summing to 1), [steps] each.

    "gausslegendre" (default; exact for polynomials of degree < 2·steps) or "riemann" (midpoints)."""
    if rule not in STEPS:
        raise CircuitlabError(f"unknown integration rule {rule!r}; choose gausslegendre or riemann")
    STEPS[rule].check(steps, "steps")
    if rule == "gausslegendre":
        import numpy as np

        x, w = np.polynomial.legendre.leggauss(steps)
        return torch.tensor(0.5 * (x + 1.0), dtype=torch.float64), torch.tensor(0.5 * w, dtype=torch.float64)
    if rule == "riemann":
        return (torch.arange(steps, dtype=torch.float64) + 0.5) / steps, torch.full((steps,), 1.0 / steps,
                                                                                     dtype=torch.float64)
    raise CircuitlabError(f"unknown integration rule {rule!r}; choose gausslegendre or riemann")


def rows_per_chunk(model, n_pos: int, backward: bool = True) -> int:
    """How many copies of a sequence of n_pos positions one batched pass may run so that the activations it
    holds (all layers' when backward: autograd keeps them) stay within ROW_BUDGET floats; at least 1."""
    cfg = model.cfg
    per_layer = n_pos * (12 * cfg.d_model + (0 if cfg.attn_only else 3 * cfg.mlp_dim) + 3 * cfg.n_heads * n_pos)
    per_row = (per_layer * max(cfg.n_layers, 1) if backward else 2 * per_layer) + 2 * cfg.d_vocab + n_pos * cfg.d_model
    return max(1, ROW_BUDGET // per_row)


def integrated_gradients(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                         pos: int = -1, metric: Metric | None = None, baseline: Baseline = "zeros",
                         steps: int = DEFAULT_STEPS, rule: str = "gausslegendre", batch_size: int | None = None,
                         tokenizer=None) -> InputAttribution:
    """Integrated gradients on the straight path from the baseline's embeddings to the input's.

    scores [pos] = Σ_d (x − x')_d · ∫ ∂f/∂x_d (x' + α(x − x')) dα, the integral by `rule` with `steps`
    points. The points run as batched forward/backward passes of `batch_size` (default: as many as fit
    ROW_BUDGET, rows_per_chunk), so memory stays bounded whatever `steps`.
    completeness_error = |Σ scores − (f(x) − f(x'))| / |f(x) − f(x')|: raise steps if it is large.
    baseline: "zeros", a token id (pad / EOS) at every position, a prompt's token ids [pos] or
    embeddings [pos, d_model] (see baseline_embeddings).
    """
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    alphas, weights = path_nodes(steps, rule)
    chunk = COUNT.check(batch_size, "batch_size") if batch_size is not None else rows_per_chunk(model, pos + 1)
    x = model.token_embeddings(tokens).detach()
    base = baseline_embeddings(model, tokens, baseline)
    delta = x - base
    total = torch.zeros_like(x, dtype=torch.float64)
    with torch.enable_grad(), frozen_parameters(model):
        for start in range(0, steps, chunk):
            a = alphas[start:start + chunk].to(x.device, x.dtype)
            e = (base[None] + a[:, None, None] * delta[None]).requires_grad_(True)  # [chunk, pos, d_model]
            (grad,) = torch.autograd.grad(explain(e).sum(), e)
            total += torch.einsum("s,spd->pd", weights[start:start + chunk].to(x.device), grad.double())
    scores = (delta.double() * total).sum(-1)  # [pos]
    with torch.no_grad():
        ends = explain(torch.stack([x, base])).double()
    change = float(ends[0] - ends[1])
    gap = abs(float(scores.sum()) - change)
    error = gap / abs(change) if abs(change) > 1e-12 else (0.0 if gap < 1e-9 else math.inf)
    result = InputAttribution("ig", tokens.tolist(), scores.float().cpu(), pos, target, foil, float(ends[0]),
                              float(ends[1]), error, steps, _baseline_name(baseline))
    result.extra["rule"] = rule
    return _decorate(result, tokenizer)


# ---------------------------------------------------------------------------- occlusion


@torch.no_grad()
def occlusion(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None, pos: int = -1,
              metric: Metric | None = None, replacement: int | None = None, span: int = 1,
              batch_size: int | None = None, tokenizer=None) -> InputAttribution:
    """Leave-one-out (span 1) or span occlusion: each window of `span` tokens among positions 0..pos is
    replaced by the `replacement` token (None: a zero embedding) and the model re-run, all windows in
    batched passes (chunks of batch_size; default as many as fit ROW_BUDGET). A window's effect is f(input) − f(occluded); a position's
    score is the mean effect of the windows covering it. Later positions cannot matter (causal): 0.
    """
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    if isinstance(span, bool) or not isinstance(span, int) or not 1 <= span <= pos + 1:
        raise CircuitlabError(f"span must be an integer from 1 to {pos + 1} (the positions up to pos), got {span!r}")
    x = model.token_embeddings(tokens)  # [pos, d_model]
    if replacement is None:
        fill = torch.zeros_like(x[0])
    else:
        fill = model.token_embeddings(torch.tensor(_check_token(replacement, "the replacement token",
                                                                model.cfg.d_vocab), device=x.device))
    starts = torch.arange(pos + 2 - span, device=x.device)
    offsets = torch.arange(x.shape[0], device=x.device)
    covered = (offsets[None] >= starts[:, None]) & (offsets[None] < starts[:, None] + span)  # [window, pos]
    chunk = COUNT.check(batch_size, "batch_size") if batch_size is not None else rows_per_chunk(model, pos + 1, False)
    drops = []
    value = float(explain(x[None])[0])
    for i in range(0, len(starts), chunk):
        mask = covered[i:i + chunk, :, None]
        occluded = torch.where(mask, fill, x[None])  # [window, pos, d_model]
        drops.append(value - explain(occluded))
    drop = torch.cat(drops)  # [window]
    cov = covered.to(drop.dtype)
    scores = (cov.T @ drop) / cov.sum(0).clamp(min=1)  # [pos]
    result = InputAttribution("occlusion", tokens.tolist(), scores.float().cpu(), pos, target, foil, value)
    result.extra.update(span=span, replacement=replacement)
    return _decorate(result, tokenizer)


# ---------------------------------------------------------------------------- KernelSHAP and LIME


def check_samples(samples: int, n_features: int, name: str = "samples") -> int:
    """The number of coalitions, kept by SAMPLES and by the regression's memory: [samples, positions] float64
    within ROW_BUDGET."""
    SAMPLES.check(samples, name)
    most = ROW_BUDGET // max(n_features, 1)
    if samples > most:
        raise CircuitlabError(f"{name} = {samples} coalitions of {n_features} positions would hold "
                              f"{samples * n_features:,} floats in the regression; at most {most} fit")
    return samples


def _deletes(baseline: Baseline) -> bool:
    return isinstance(baseline, str) and baseline == "delete"  # (a tensor baseline is never a name)


def _check_baseline(model, baseline: Baseline, metric: Metric | None, start_token: int | None) -> None:
    if isinstance(baseline, int) and not isinstance(baseline, bool):
        _check_token(baseline, "the baseline token", model.cfg.d_vocab)
    if isinstance(baseline, str) and baseline not in BASELINE_NAMES:
        raise CircuitlabError(f"unknown baseline {baseline!r}: give 'mean', 'zeros', 'delete', a token id, a "
                              "prompt's token ids or embeddings [pos, d_model]")
    if _deletes(baseline):
        if metric is not None:
            raise CircuitlabError("baseline 'delete' shortens the sequence, so positions move: explain a target "
                                  "(and foil), not a metric function of fixed positions")
        if start_token is None:
            raise CircuitlabError("baseline 'delete' needs start_token= (e.g. the tokenizer's EOS): the coalition "
                                  "with every token deleted runs as that one token, since a model cannot run on none")
        _check_token(start_token, "start_token", model.cfg.d_vocab)


@torch.no_grad()
def coalition_values(model, tokens: torch.Tensor, explain: Explain, pos: int, rows: torch.Tensor,
                     baseline: Baseline = "mean", target: int | None = None, foil: int | None = None,
                     start_token: int | None = None, batch_size: int | None = None, progress: bool = True,
                     desc: str = "coalitions") -> torch.Tensor:
    """The explained value on each coalition of the positions 0..pos: rows [n, pos + 1] (bool; True = the
    token is present) -> values [n] (float64). A removed token takes the baseline's embedding (tokens later
    than pos keep theirs), or with baseline "delete" leaves the sequence (the kept tokens close up; the value
    is read after the last kept one; no token kept: start_token alone). Each distinct coalition runs once, in
    batched passes of batch_size rows (default: as many as fit ROW_BUDGET)."""
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    out = torch.empty(len(unique), dtype=torch.float64)
    chunk = COUNT.check(batch_size, "batch_size") if batch_size is not None else rows_per_chunk(model, pos + 1, False)
    bar = tqdm(total=len(unique), desc=desc, unit="coalition", delay=2.0, disable=not progress)
    device = tokens.device
    if _deletes(baseline):
        # Each row's kept tokens close up at its start; whatever follows a row's last kept token cannot change
        # the logits there (attention is causal), so rows of every length share one batch, sorted by length.
        at_last = logit_metric(target, foil, 0)
        sizes = unique.sum(1)
        order = sizes.argsort()
        for i in range(0, len(order), chunk):
            part = order[i:i + chunk]
            kept = unique[part].to(device)  # [part, pos + 1]
            first = (~kept).to(torch.int8).argsort(dim=1, stable=True)  # kept positions first, in order
            ids = tokens[:pos + 1][first]
            last = (sizes[part].to(device) - 1).clamp(min=0)
            ids[sizes[part].to(device) == 0, 0] = start_token  # nothing kept: the start token alone
            ids = ids[:, :int(last.max()) + 1]
            out[part] = at_last(_logits_at_rows(model, model.token_embeddings(ids), last)).double().cpu()
            bar.update(len(part))
    else:
        x = model.token_embeddings(tokens)  # [pos, d_model]
        base = baseline_embeddings(model, tokens, baseline)
        for i in range(0, len(unique), chunk):
            present = torch.zeros(len(unique[i:i + chunk]), x.shape[0], dtype=torch.bool, device=device)
            present[:, :pos + 1] = unique[i:i + chunk].to(device)
            present[:, pos + 1:] = True
            out[i:i + chunk] = explain(torch.where(present[..., None], x[None], base[None])).double().cpu()
            bar.update(len(present))
    bar.close()
    return out[inverse]


def kernel_shap(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None, pos: int = -1,
                metric: Metric | None = None, baseline: Baseline = "mean", samples: int = DEFAULT_SAMPLES,
                seed: int = 0, exact: bool = False, paired: bool = False, start_token: int | None = None,
                batch_size: int | None = None, progress: bool = True, tokenizer=None) -> InputAttribution:
    """KernelSHAP: Shapley values of the tokens 0..pos for the explained value, scores [pos] (later positions 0).

    Coalitions of present tokens are drawn by the Shapley kernel (`samples` model evaluations, the full and
    the empty coalition among them; `seed` fixes the draws, the same as Captum's KernelShap after
    torch.manual_seed(seed)), every distinct one run once in batched forward passes, and the scores are the
    least-squares fit constrained to sum to f(input) − f(baseline) (efficiency, exact). paired=True draws each
    coalition with its complement (less variance, fewer samples for the same ranking; not Captum's draws).
    exact=True enumerates
    all 2^M coalitions with the Shapley kernel instead: the exact Shapley values (M ≤ EXACT_MAX_POSITIONS).
    baseline: what a removed token becomes: "mean" (the mean token embedding), "zeros", a token id, a prompt's
    token ids [pos], embeddings [pos, d_model], or "delete" (the token leaves the sequence; start_token runs
    for the empty coalition; target/foil only).
    """
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    M = pos + 1  # the players: the tokens up to the explained position (later ones cannot matter)
    SEED.check(seed, "seed")
    for flag, value in (("exact", exact), ("paired", paired)):
        if not isinstance(value, bool):
            raise CircuitlabError(f"{flag} must be True or False, got {value!r}")
    if start_token is None and _deletes(baseline) and tokenizer is not None:
        start_token = getattr(tokenizer, "eos_id", None)
    _check_baseline(model, baseline, metric, start_token)
    if exact:
        if M > EXACT_MAX_POSITIONS:
            raise CircuitlabError(f"exact Shapley values enumerate 2^{M} coalitions of the {M} positions up to pos; "
                                  f"at most {EXACT_MAX_POSITIONS} positions: sample instead (samples=)")
        rows, weights = surrogate.all_coalitions(M)
        rows = torch.cat([torch.ones(1, M, dtype=torch.bool), torch.zeros(1, M, dtype=torch.bool), rows])
        weights = torch.cat([torch.zeros(2, dtype=torch.float64), weights])
    else:
        check_samples(samples, M)
        rows = surrogate.shap_coalitions(M, samples, torch.Generator().manual_seed(seed), paired)
        weights = None
    values = coalition_values(model, tokens, explain, pos, rows, baseline, target, foil, start_token, batch_size,
                              progress, "kernel SHAP")
    v_full, v_empty = float(values[0]), float(values[1])
    phi = surrogate.shapley_fit(rows, values, v_full, v_empty, weights)
    scores = torch.zeros(tokens.shape[0], dtype=torch.float64)
    scores[:M] = phi
    change = v_full - v_empty
    gap = abs(float(phi.sum()) - change)
    error = gap / abs(change) if abs(change) > 1e-12 else (0.0 if gap < 1e-9 else math.inf)
    inner = weights if weights is not None else torch.ones(len(rows), dtype=torch.float64)
    result = InputAttribution("shap", tokens.tolist(), scores.float().cpu(), pos, target, foil, v_full, v_empty, error,
                              baseline=_baseline_name(baseline))
    result.extra.update(samples=len(rows), seed=None if exact else seed, exact=exact, paired=paired and not exact,
                        evaluated=int(torch.unique(rows, dim=0).shape[0]),
                        surrogate_r2=surrogate.weighted_r2(rows[2:], values[2:], inner[2:], phi, v_empty))
    return _decorate(result, tokenizer)


def lime(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None, pos: int = -1,
         metric: Metric | None = None, baseline: Baseline = "mean", samples: int = DEFAULT_SAMPLES, seed: int = 0,
         kernel_width: float = DEFAULT_KERNEL_WIDTH, alpha: float = DEFAULT_ALPHA, start_token: int | None = None,
         batch_size: int | None = None, progress: bool = True, tokenizer=None) -> InputAttribution:
    """LIME: the coefficients of a weighted linear surrogate of the explained value over which tokens 0..pos are
    present, scores [pos] (later positions 0).

    `samples` coalitions, each token present with probability 1/2 (`seed`: the same draws as Captum's Lime
    after torch.manual_seed(seed)), each weighed by exp(−d² / (2·kernel_width²)) with d the cosine distance of
    its presence vector from all-present, every distinct one run once in batched forward passes; the surrogate
    is the weighted Lasso with L1 penalty `alpha` (Captum's default surrogate, sklearn's Lasso(alpha=0.01);
    alpha=0: least squares). baseline: as for kernel_shap. extra holds the intercept and the surrogate's
    weighted R².
    """
    tokens = _sequence(tokens, model)
    explain, target, foil, pos = _resolve(model, tokens, target, foil, pos, metric)
    M = pos + 1  # the players: the tokens up to the explained position (later ones cannot matter)
    SEED.check(seed, "seed")
    KERNEL_WIDTH.check(kernel_width, "kernel_width")
    alpha = NONNEG.check(alpha, "alpha")
    check_samples(samples, M)
    if start_token is None and _deletes(baseline) and tokenizer is not None:
        start_token = getattr(tokenizer, "eos_id", None)
    _check_baseline(model, baseline, metric, start_token)
    rows = surrogate.lime_coalitions(M, samples, torch.Generator().manual_seed(seed))
    ends = torch.stack([torch.ones(M, dtype=torch.bool), torch.zeros(M, dtype=torch.bool)])
    run = torch.cat([ends, rows])  # the two ends too: f(input) and f(baseline) for the result
    values = coalition_values(model, tokens, explain, pos, run, baseline, target, foil, start_token, batch_size,
                              progress, "LIME")
    weights = surrogate.lime_weights(rows, kernel_width)
    coef, intercept = surrogate.lasso_fit(rows, values[2:], weights, alpha)
    scores = torch.zeros(tokens.shape[0], dtype=torch.float64)
    scores[:M] = coef
    result = InputAttribution("lime", tokens.tolist(), scores.float().cpu(), pos, target, foil, float(values[0]),
                              float(values[1]), baseline=_baseline_name(baseline))
    result.extra.update(samples=samples, seed=seed, kernel_width=kernel_width, alpha=alpha, intercept=intercept,
                        evaluated=int(torch.unique(run, dim=0).shape[0]),
                        surrogate_r2=surrogate.weighted_r2(rows, values[2:], weights, coef, intercept))
    return _decorate(result, tokenizer)


# ---------------------------------------------------------------------------- context mixing


@torch.no_grad()
def context_mixing(model, tokens: torch.Tensor, pos: int = -1, tokenizer=None) -> InputAttribution:
    """Norm-based context mixing, rolled out through every layer.

    In layer l, source j moves ‖Σ_h A[h, i, j] · v_h(j) W_O^h‖ into position i (v_h includes ln1 and
    b_V; b_O belongs to no source), and position i keeps its own residual ‖resid_pre(i)‖. Each row,
    normalised to sum to 1, is that layer's mixing matrix M_l [pos, pos]; MLPs act on one position
    and do not mix. scores [pos] = row `pos` of M_{L-1} ··· M_0 (the share of the final residual at
    pos that came from each input token); per_layer [layer, pos] = row `pos` of each M_l.
    """
    tokens = _sequence(tokens, model)
    T = tokens.shape[0]
    if not -T <= pos < T:
        raise CircuitlabError(f"pos {pos} is outside the sequence of length {T}")
    pos %= T
    cfg = model.cfg
    if cfg.n_layers == 0:
        raise CircuitlabError("context mixing reads attention: this model has no layers")
    names = [n for l in range(cfg.n_layers) for n in
             (f"blocks.{l}.hook_resid_pre", f"blocks.{l}.attn.hook_v", f"blocks.{l}.attn.hook_pattern")]
    _, cache = model.run_with_cache(tokens[None], names_filter=names)
    W_O = model.W_O  # [layer, head, d_head, d_model]
    rollout = torch.eye(T, dtype=torch.float64, device=tokens.device)
    rows = []
    for l in range(cfg.n_layers):
        v = cache["v", l][0]  # [pos, kv_head, d_head]
        if v.shape[1] != cfg.n_heads:
            v = v.repeat_interleave(cfg.n_heads // v.shape[1], dim=1)
        written = torch.einsum("jhd,hdm->jhm", v, W_O[l]).double()  # [pos, head, d_model]: what head h moves from j
        gram = torch.einsum("jhm,jgm->jhg", written, written)  # [pos, head, head]
        A = cache["pattern", l][0].double()  # [head, query, key]
        moved = torch.einsum("hij,jhg,gij->ij", A, gram, A).clamp(min=0).sqrt()  # [query, key] norms
        mixing = moved + torch.diag(cache["resid_pre", l][0].double().norm(dim=-1))
        mixing = mixing / mixing.sum(-1, keepdim=True).clamp(min=1e-30)
        rows.append(mixing[pos])
        rollout = mixing @ rollout
    result = InputAttribution("context-mixing", tokens.tolist(), rollout[pos].float().cpu(), pos,
                              per_layer=torch.stack(rows).float().cpu())
    return _decorate(result, tokenizer)


# ---------------------------------------------------------------------------- one entry point


def attribute_inputs(model, tokens: torch.Tensor, method: str = "ig", **kwargs: Any) -> InputAttribution:
    """Dispatch by method name (METHODS): ig, saliency, grad-x-input, occlusion, context-mixing, shap, lime."""
    fns = {"ig": integrated_gradients, "saliency": saliency, "grad-x-input": gradient_x_input,
           "occlusion": occlusion, "context-mixing": context_mixing, "shap": kernel_shap, "lime": lime}
    if method not in fns:
        raise CircuitlabError(f"unknown attribution method {method!r}; choose one of {', '.join(METHODS)}")
    return fns[method](model, tokens, **kwargs)


def attribute_methods(model, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                      methods: tuple[str, ...] = METHODS, steps: int = DEFAULT_STEPS, tokenizer=None,
                      samples: int = DEFAULT_SAMPLES, seed: int = 0, kernel_width: float = DEFAULT_KERNEL_WIDTH,
                      baseline: Baseline = "mean", progress: bool = True) -> dict[str, InputAttribution]:
    """Several methods on the prediction at the last position of tokens [pos]: method -> result. target
    defaults to the model's top prediction there; occlusion replaces tokens by the tokenizer's EOS (a zero
    embedding without one); context mixing reads attention and takes no target; shap and lime draw `samples`
    coalitions from `seed`, a removed token becoming `baseline` (lime weighs them with `kernel_width`)."""
    tokens = _sequence(tokens, model)
    if target is None:
        with torch.no_grad():
            target = int(model(tokens[None])[0, -1].argmax())
    found = {}
    for method in methods:
        kwargs: dict[str, Any] = {"tokenizer": tokenizer}
        if method != "context-mixing":
            kwargs.update(target=target, foil=foil)
        if method == "ig":
            kwargs["steps"] = steps
        if method == "occlusion":
            kwargs["replacement"] = getattr(tokenizer, "eos_id", None)
        if method in ("shap", "lime"):
            kwargs.update(samples=samples, seed=seed, baseline=baseline, progress=progress)
        if method == "lime":
            kwargs["kernel_width"] = kernel_width
        found[method] = attribute_inputs(model, tokens, method, **kwargs)
    return found
