"""What every input-attribution method shares: the result (InputAttribution), what is explained (a metric of
the logits, by default a target's logit at one position; _resolve), the baselines a removed token becomes,
the forward passes on replaced embeddings, and the budget of rows one batched pass may hold."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import torch

import circuitlab.memory as memory
from circuitlab.analysis._json import rounded
from circuitlab.analysis.input_attribution.options import DEFAULT_POS
from circuitlab.analysis.patching.checks import one_sequence
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

Metric = Callable[[torch.Tensor], torch.Tensor]  # logits [batch, pos, d_vocab] -> [batch]
Explain = Callable[[torch.Tensor], torch.Tensor]  # token embeddings [batch, pos, d_model] -> explained value [batch]
Baseline = Union[str, int, torch.Tensor]
# Floats of activations a chunk of path points (or occluded copies) may hold: 256 MB, a size for speed (larger
# chunks are no faster on a CPU), or a pass's share of the memory budget (circuitlab.memory) where that is less.
ROW_BUDGET = 2 ** 26
DEFAULT_ALPHA = 0.01  # LIME's L1 penalty: Captum's default surrogate, sklearn's Lasso(alpha=0.01)
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


def _sequence(tokens: torch.Tensor, model: Transformer) -> torch.Tensor:
    return one_sequence(model, tokens, "input attribution")


def _check_token(t: int, name: str, d_vocab: int) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < d_vocab:
        raise CircuitlabError(f"{name} must be a token id in [0, {d_vocab}), got {t!r}")
    return t


def logit_metric(target: int, foil: int | None = None, pos: int = DEFAULT_POS) -> Metric:
    """logits [batch, pos, d_vocab] -> logits[:, pos, target] (- logits[:, pos, foil]) [batch]."""
    if foil is not None and foil == target:
        raise CircuitlabError(f"the foil is the target ({target}): a logit difference with itself is always 0")

    def metric(logits: torch.Tensor) -> torch.Tensor:
        out = logits[:, pos, target]
        return out - logits[:, pos, foil] if foil is not None else out

    return metric


def _resolve(model: Transformer, tokens: torch.Tensor, target: int | None, foil: int | None, pos: int,
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


def _run_embeds(model: Transformer, tokens: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """Forward with the token embeddings replaced: embeds [batch, pos, d_model] -> logits [batch, pos, d_vocab]."""

    def replace(_: torch.Tensor, hook) -> torch.Tensor:
        return embeds

    return model.run_with_hooks(tokens[None].expand(embeds.shape[0], -1), fwd_hooks=[("hook_embed", replace)])


def _logits_at(model: Transformer, embeds: torch.Tensor, pos: int) -> torch.Tensor:
    """Logits [batch, 1, d_vocab] at position pos alone, the token embeddings being embeds [batch, ≥ pos+1,
    d_model]. model.forward's steps (and hook points), with two savings: positions after pos are not run
    (attention is causal, they cannot change pos) and the unembedding reads pos alone (it would cost as much
    as the blocks for a small model with a large vocabulary)."""
    x = model.resid_from_embeds(embeds[:, :pos + 1])
    for block in model.blocks:
        x = block(x)
    return model.readout(x[:, pos:])


def _logits_at_rows(model: Transformer, embeds: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Logits [batch, 1, d_vocab] of each row at its own position last [batch], the token embeddings being
    embeds [batch, > max(last), d_model]: the blocks on every position, the unembedding at last alone."""
    x = model.resid_from_embeds(embeds)
    for block in model.blocks:
        x = block(x)
    return model.readout(x[torch.arange(len(last), device=x.device), last][:, None])


def _metric_of(model: Transformer, tokens: torch.Tensor, embeds: torch.Tensor, metric: Metric) -> torch.Tensor:
    out = metric(_run_embeds(model, tokens, embeds))
    if out.shape != (embeds.shape[0],):
        raise CircuitlabError(f"the metric must map logits [batch, pos, d_vocab] to [batch]; got shape "
                              f"{tuple(out.shape)} for a batch of {embeds.shape[0]}")
    return out


def baseline_embeddings(model: Transformer, tokens: torch.Tensor, baseline: Baseline) -> torch.Tensor:
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


def row_budget() -> int:
    """Floats a chunk of rows may hold: ROW_BUDGET, or a pass's share of the memory budget if less."""
    return min(ROW_BUDGET, memory.floats(memory.PASS_SHARE))


def rows_per_chunk(model: Transformer, n_pos: int, backward: bool = True) -> int:
    """How many copies of a sequence of n_pos positions one batched pass may run so that the activations it
    holds (all layers' when backward: autograd keeps them) stay within row_budget() floats; at least 1."""
    return max(1, row_budget() // _row_floats(model, n_pos, backward))


def _row_floats(model: Transformer, n_pos: int, backward: bool = True) -> int:
    """Floats one copy of a sequence of n_pos positions holds in a batched pass, as the chunks are sized (all
    layers' activations when backward: autograd keeps them; two layers' otherwise), with its logits."""
    cfg = model.cfg
    per_layer = n_pos * (12 * cfg.d_model + (0 if cfg.attn_only else 3 * cfg.mlp_dim) + 3 * cfg.n_heads * n_pos)
    return (per_layer * max(cfg.n_layers, 1) if backward else 2 * per_layer) + 2 * cfg.d_vocab + n_pos * cfg.d_model
