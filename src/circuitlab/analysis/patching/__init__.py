"""Activation patching: run the model on one prompt with an activation taken from another.

    clean, corrupt = tokens_a, tokens_b                     # [batch, pos], same shape
    metric = logit_diff(answer=12, wrong=7)                 # any fn(logits [batch, pos, d_vocab]) -> scalar
    res = activation_patching(model, clean, corrupt, metric, "head_out_by_pos")
    res.values        # [layer, pos, head]: the metric of the corrupted run with that one piece clean
    res.recovery()    # (patched - corrupted) / (clean - corrupted)

The corrupted run can also be the clean prompt with some positions' token embeddings noised
(patching/noise.py: `activation_patching(model, clean, Noised([3, 4]), metric, "resid_pre")`): every patch
then runs in each noise run (runs x patches in the batch) and the metric is their mean.

Directions: "denoise" (default) runs the corrupted prompt and patches in clean activations, so a
high value means "this piece is enough to restore the answer"; "noise" runs the clean prompt with
corrupted activations, so a low value means "the answer needs this piece".

Speed. Patches go in the batch dimension: a chunk of C patches is one forward pass over C copies
of the batch, each copy with its own patch (a boolean mask picks the source values), in chunks
sized to bound memory. Sweeps over layers run as one staggered pass per position (grid.py): each patch
joins the batch at its own layer. Work whose result is known is skipped: a patch at layer l starts from the
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

The package: this module (results, sweeps: what most callers import) over engine.py (the batched
engine), metrics.py, targets.py, checks.py and noise.py (noise corruption), which import each other by
full module path, never this facade. path.py (path patching), attribution_patching.py and the
restoration sweeps of causal tracing (Meng et al.) stand on them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis._json import rounded  # noqa: F401 (also imported from here)
# The pieces, one module per concern; their public names are importable from here too.
from circuitlab.analysis.patching.checks import (DIRECTIONS, as_tokens, check_direction, check_layers,  # noqa: F401
                                                 check_metric, check_pair, check_patching_request)
from circuitlab.analysis.patching.engine import (CHUNK_BUDGET, BaseRun, Site, chunk_size, grid_index,  # noqa: F401
                                                 logits_buffer, patched_logits, patched_run, sweep, sweep_estimate)
from circuitlab.analysis.patching.grid import grid_sweep  # noqa: F401
from circuitlab.analysis.patching.work import grid_flops, naive_flops  # noqa: F401
from circuitlab.analysis.patching.noise import Noise, Noised, averaged_over_runs, corrupt_positions  # noqa: F401
from circuitlab.analysis.patching.metrics import (GAP_FLOOR, Metric, gap_noise, gap_within_noise,  # noqa: F401
                                                  kl_to_clean, logit_diff, logprob, metric_value, next_token_loss,
                                                  normalized_metric, probability, read_positions)
from circuitlab.analysis.patching.targets import (DEFAULT_TARGETS, TARGETS, Target, available_targets,  # noqa: F401
                                                  default_targets, get_target)
from circuitlab.display import Displayed
from circuitlab.model import model_device  # noqa: F401
from circuitlab.model.hooks import act_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.model.hooks import ActivationCache


@dataclass
class PatchResult(Displayed):
    """Metric after each patch of one target.

    values [layer, *axes]: e.g. [layer, pos, head] for head_out_by_pos (layers as in `layers`);
    clean_value / corrupt_value: the metric on the unpatched clean and corrupted runs;
    method: "activation" (real patching) or "attribution" (its linear approximation).
    gap_noise: two standard errors of the per-prompt clean - corrupted gap (0.0 when unknown); with
    GAP_FLOOR it decides `gap_within_noise`, when recovery fractions mean nothing (patching/metrics.py).
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
    gap_noise: float = 0.0

    @property
    def gap_within_noise(self) -> bool:
        """The clean - corrupted gap is below max(GAP_FLOOR, gap_noise): recovery() is not meaningful."""
        return gap_within_noise(self.clean_value, self.corrupt_value, self.gap_noise)

    def noise_note(self) -> str | None:
        """A sentence saying the recovery fractions are meaningless, or None when the gap is clear of noise."""
        if not self.gap_within_noise:
            return None
        gap = self.clean_value - self.corrupt_value
        bound = f"max({GAP_FLOOR:g}, 2 standard errors = {self.gap_noise:.3g})" if self.gap_noise else f"{GAP_FLOOR:g}"
        return (f"the clean - corrupted gap of the {self.metric} ({gap:+.3g}) is within noise (|gap| < {bound}): "
                "recovery fractions are meaningless; choose prompts the corruption changes more")

    @property
    def base_value(self) -> float:
        """The metric of the run being patched (corrupted when denoising, clean when noising)."""
        return self.corrupt_value if self.direction == "denoise" else self.clean_value

    def effect(self) -> torch.Tensor:
        """values - base_value [layer, *axes]: how much each patch moved the metric."""
        return self.values - self.base_value

    def recovery(self) -> torch.Tensor:
        """(values - corrupt) / (clean - corrupt) [layer, *axes]: 1 = clean behaviour, 0 = corrupted.
        Computed even when gap_within_noise, where it is meaningless (see noise_note)."""
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
                "metric": self.metric, "gap_noise": round(self.gap_noise, 6),
                "gap_within_noise": self.gap_within_noise, "top": [{**w, "effect": round(e, 6)} for w, e in self.top()]}


# ---------------------------------------------------------------------------- activation patching


def _prepare_noised(model: Transformer, clean, noised: Noised, metric: Metric, targets: Sequence[str], direction: str,
                    layers: Sequence[int] | None):
    """_prepare for a noise corruption: the base run and the source hold every noise run of every prompt
    (run-major), and the metric is averaged over the runs."""
    check_direction(direction)
    clean = as_tokens(model, clean, "clean tokens")
    check_metric(model, metric, tuple(clean.shape))
    chosen, layers = [get_target(model, t) for t in targets], check_layers(model, layers)
    positions = noised.check(clean.shape[1], model.cfg.d_vocab)
    hooks = sorted({act_name(t.hook, l) for t in chosen for l in layers})
    corrupted = corrupt_positions(model, clean, positions, noised.noise)
    runs = corrupted.tokens.shape[0] // clean.shape[0]
    over_runs = averaged_over_runs(metric, runs)
    if direction == "denoise":  # the noised runs, with clean activations (the same for every run)
        with model.hooks(corrupted.hooks()):
            base, _ = BaseRun.of(model, corrupted.tokens)
        clean_logits, cache = model.run_with_cache(clean, names_filter=hooks)
        source: dict[str, torch.Tensor] | ActivationCache = {
            h: cache[h].repeat(runs, *[1] * (cache[h].dim() - 1)) for h in hooks}
        noised_logits = base.logits
    else:  # the clean prompts once per run, with each run's noised activations
        base, _ = BaseRun.of(model, clean.repeat(runs, 1))
        clean_logits = base.logits[:clean.shape[0]]
        with model.hooks(corrupted.hooks()):
            noised_logits, source = model.run_with_cache(corrupted.tokens, names_filter=hooks)
    values = (metric_value(metric, clean_logits), metric_value(over_runs, noised_logits), 0.0)
    return chosen, layers, base, source, values, over_runs


def _prepare(model: Transformer, clean, corrupt, metric: Metric, targets: Sequence[str], direction: str,
             layers: Sequence[int] | None):
    """Every check (before any compute), then the two cached runs shared by all targets, and the metric the
    patched runs are measured with."""
    if isinstance(corrupt, Noised):
        return _prepare_noised(model, clean, corrupt, metric, targets, direction, layers)
    chosen, layers, base_tokens, source_tokens, hooks = check_patching_request(model, clean, corrupt, metric,
                                                                               targets, direction, layers)
    base, _ = BaseRun.of(model, base_tokens)
    source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=hooks)
    clean_logits, corrupt_logits = (source_logits, base.logits) if direction == "denoise" else \
        (base.logits, source_logits)
    values = (metric_value(metric, clean_logits), metric_value(metric, corrupt_logits),
              gap_noise(metric, clean_logits, corrupt_logits))
    return chosen, layers, base, source_cache, values, metric


def _patch_target(model: Transformer, target: Target, layers: list[int], base: BaseRun, source_cache, metric: Metric,
                  values: tuple[float, float, float], direction: str, batch_size: int | None, progress: bool
                  ) -> PatchResult:
    """Every (layer, *axes) patch of `target` in one staggered sweep (grid.grid_sweep): each layer's site takes
    the patches of its layer, and each patch runs from its layer (and position) on."""
    hooks = [act_name(target.hook, l) for l in layers]
    sizes = [source_cache[hooks[0]].shape[1 + d] for d in target.dims]
    index = grid_index(sizes)
    layer_of = torch.tensor(layers, dtype=torch.long).repeat_interleave(len(index))
    index = index.repeat(len(layers), 1)
    sites = [Site(h, source_cache[h], target.dims, index, pos_dim=target.pos_dim, active=layer_of == l)
             for h, l in zip(hooks, layers)]
    positions = index[:, target.pos_axis] if target.pos_axis is not None else None
    swept = grid_sweep(model, base, sites, metric, layer_of, positions, target.local, batch_size, progress,
                       desc=f"patching {target.name}")
    return PatchResult(target.name, target.axes, layers, swept.view(len(layers), *sizes), values[0], values[1],
                       direction, metric=getattr(metric, "__name__", "metric"), gap_noise=values[2])


def activation_patching(model: Transformer, clean_tokens, corrupt_tokens, metric: Metric, target: str = "resid_pre", *,
                        direction: str = "denoise", layers: Sequence[int] | None = None,
                        batch_size: int | None = None, progress: bool = True) -> PatchResult:
    """Patch every piece of `target` one at a time (batched) and record the metric.

    clean_tokens, corrupt_tokens [batch, pos] (same shape; [pos] is one prompt); or corrupt_tokens =
    Noised(positions, Noise(...)): the clean prompts with those positions' token embeddings noised (causal
    tracing's corruption), each patch applied in every noise run and the metric averaged over the runs.
    metric: fn(logits [batch, pos, d_vocab]) -> scalar, e.g. logit_diff(...).
    target: a name in TARGETS. layers: which layers to sweep (default all).
    batch_size: patches per forward pass (default: as many as fit a memory budget); 1 is one at a time.
    Returns PatchResult with values [layer, *target axes], e.g. [layer, pos, head] for head_out_by_pos.
    """
    return patching_sweep(model, clean_tokens, corrupt_tokens, metric, [target], direction=direction,
                          layers=layers, batch_size=batch_size, progress=progress)[target]


def patching_sweep(model: Transformer, clean_tokens, corrupt_tokens, metric: Metric,
                   targets: Sequence[str] | None = None,
                   *, direction: str = "denoise", layers: Sequence[int] | None = None,
                   batch_size: int | None = None, progress: bool = True) -> dict[str, PatchResult]:
    """activation_patching for several targets, sharing the clean and corrupted runs.

    targets: default DEFAULT_TARGETS that the model has; naming one it lacks (mlp_out on an
    attention-only model) is an error; available_targets(model) lists all it has.
    Returns {target: PatchResult}.
    """
    targets = default_targets(model) if targets is None else [targets] if isinstance(targets, str) else targets
    chosen, checked, base, source_cache, values, measure = _prepare(model, clean_tokens, corrupt_tokens, metric,
                                                                    targets, direction, layers)
    return {t.name: _patch_target(model, t, checked, base, source_cache, measure, values, direction, batch_size,
                                  progress) for t in chosen}
