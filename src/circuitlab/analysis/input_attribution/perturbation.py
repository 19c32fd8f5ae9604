"""Methods that remove tokens and run the model again: occlusion (windows replaced by a token), KernelSHAP and
LIME (coalitions of present tokens, fitted by a linear surrogate: analysis/surrogate.py)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.analysis import surrogate
from circuitlab.analysis.input_attribution.base import (BASELINE_NAMES, DEFAULT_ALPHA, Baseline, Explain,
                                                        InputAttribution, Metric, _baseline_name, _check_token,
                                                        _decorate, _logits_at_rows, _resolve, _sequence,
                                                        baseline_embeddings, logit_metric, rows_per_chunk)
from circuitlab.analysis.input_attribution.options import (DEFAULT_KERNEL_WIDTH, DEFAULT_POS, DEFAULT_SAMPLES,
                                                           DEFAULT_SEED, DEFAULT_SPAN, EXACT_MAX_POSITIONS,
                                                           KERNEL_WIDTH, SAMPLES, SEED, LimeOptions, OcclusionOptions,
                                                           ShapOptions)
from circuitlab.analysis.input_attribution.techniques import Technique
from circuitlab.checks import COUNT, NONNEG
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@torch.no_grad()
def occlusion(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
              pos: int = DEFAULT_POS, metric: Metric | None = None, replacement: int | None = None,
              span: int = DEFAULT_SPAN, batch_size: int | None = None, tokenizer=None) -> InputAttribution:
    """Leave-one-out (span 1) or span occlusion: each window of `span` tokens among positions 0..pos is
    replaced by the `replacement` token (None: a zero embedding) and the model re-run, all windows in
    batched passes (chunks of batch_size; default as many as fit row_budget()). A window's effect is f(input) − f(occluded); a position's
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
    within a pass's share of the memory budget."""
    SAMPLES.check(samples, name)
    most = memory.floats(memory.PASS_SHARE) // 2 // max(n_features, 1)
    if samples > most:
        raise CircuitlabError(f"{name} = {samples} coalitions of {n_features} positions would hold "
                              f"{samples * n_features:,} floats in the regression; at most {most} fit")
    return samples


def _deletes(baseline: Baseline) -> bool:
    return isinstance(baseline, str) and baseline == "delete"  # (a tensor baseline is never a name)


def _check_baseline(model: Transformer, baseline: Baseline, metric: Metric | None, start_token: int | None) -> None:
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
def coalition_values(model: Transformer, tokens: torch.Tensor, explain: Explain, pos: int, rows: torch.Tensor,
                     baseline: Baseline = "mean", target: int | None = None, foil: int | None = None,
                     start_token: int | None = None, batch_size: int | None = None, progress: bool = True,
                     desc: str = "coalitions") -> torch.Tensor:
    """The explained value on each coalition of the positions 0..pos: rows [n, pos + 1] (bool; True = the
    token is present) -> values [n] (float64). A removed token takes the baseline's embedding (tokens later
    than pos keep theirs), or with baseline "delete" leaves the sequence (the kept tokens close up; the value
    is read after the last kept one; no token kept: start_token alone). Each distinct coalition runs once, in
    batched passes of batch_size rows (default: as many as fit row_budget())."""
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    out = torch.empty(len(unique), dtype=torch.float64)
    chunk = COUNT.check(batch_size, "batch_size") if batch_size is not None else rows_per_chunk(model, pos + 1, False)
    bar = tqdm(total=len(unique), desc=desc, unit="coalition", delay=2.0, disable=not progress)
    device = tokens.device
    if _deletes(baseline):
        # Each row's kept tokens close up at its start; whatever follows a row's last kept token cannot change
        # the logits there (attention is causal), so rows of every length share one batch, sorted by length.
        assert target is not None and start_token is not None  # _check_baseline refused 'delete' without them
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


def check_exact(n_positions: int) -> None:
    """Exact Shapley values enumerate 2^M coalitions: at most EXACT_MAX_POSITIONS positions up to pos."""
    if n_positions > EXACT_MAX_POSITIONS:
        raise CircuitlabError(f"exact Shapley values enumerate 2^{n_positions} coalitions of the {n_positions} "
                              f"positions up to pos; at most {EXACT_MAX_POSITIONS} positions: sample instead "
                              "(samples=)")


def _check_shap(values: Mapping[str, Any], n_pos: int) -> None:
    check_samples(values["samples"], n_pos)
    if values["exact"]:
        check_exact(n_pos)


def _check_lime(values: Mapping[str, Any], n_pos: int) -> None:
    check_samples(values["samples"], n_pos)


def kernel_shap(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                pos: int = DEFAULT_POS, metric: Metric | None = None, baseline: Baseline = "mean",
                samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED, exact: bool = False, paired: bool = False,
                start_token: int | None = None, batch_size: int | None = None, progress: bool = True,
                tokenizer=None) -> InputAttribution:
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
        check_exact(M)
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


def lime(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
         pos: int = DEFAULT_POS, metric: Metric | None = None, baseline: Baseline = "mean",
         samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED,
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


OCCLUSION = Technique("occlusion", occlusion, OcclusionOptions, label="occlusion", replacement=True,
                      rows=lambda values, n_pos: n_pos)
SHAP = Technique("shap", kernel_shap, ShapOptions, label="KernelSHAP", baseline="mean", removes=True, progress=True,
                 rows=lambda values, n_pos: values["samples"], surrogate=True, check=_check_shap)
LIME = Technique("lime", lime, LimeOptions, label="LIME", baseline="mean", removes=True, progress=True,
                 rows=lambda values, n_pos: values["samples"], surrogate=True, check=_check_lime)
