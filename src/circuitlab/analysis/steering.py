"""Steering: add a direction to the residual stream and measure what it does.

    vec = contrast_direction(model, positive_tokens, negative_tokens, layer=1)   # difference of means
    with steering(model, vec, coef=4.0):
        out = model.generate(prompt, 30, temperature=0)                           # steered generation
    sweep = steering_sweep(model, vec, [0, 2, 4, 8], positive_tokens, negative_tokens, neutral_tokens)
    sweep.table()

A SteeringVector is a direction (one position's activation: [d_model] on the residual stream) at a hook (by default blocks.{layer}.hook_resid_pre). It can
come from two sets of prompts (mean activation of the positive set minus that of the negative set: the
activation addition / contrastive activation addition recipe), from any vector (a probe's weight
column, a dictionary feature's decoder row: `feature_direction`). Steering adds coef · direction at
the chosen positions (default all, generated tokens included) through a forward hook; the model's
weights are never changed.
"""
from __future__ import annotations


from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import torch

from circuitlab.analysis._json import rounded
from circuitlab.checks import FINITE
from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class SteeringVector:
    """direction (one position's activation shape at hook_name, [d_model] on the residual stream) added there; norm: its L2 norm (coefficients multiply the vector as it is)."""

    direction: torch.Tensor
    hook_name: str
    source: str = "vector"
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"hook_name": self.hook_name, "source": self.source, "norm": round(float(self.direction.norm()), 6),
                **self.info}


def layer_hook(model: Transformer, layer: int) -> str:
    """blocks.{layer}.hook_resid_pre, checked against the model's layers."""
    n = model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n:
        raise CircuitlabError(f"layer {layer!r} is out of range: the model has layers 0..{n - 1} "
                              "(steering adds to the residual stream before that layer)")
    return f"blocks.{layer}.hook_resid_pre"


@torch.no_grad()
def hook_shape(model: Transformer, hook_name: str) -> torch.Size:
    """Shape of one position's activation at hook_name: [d_model] on the residual stream, [d_mlp] at
    mlp.hook_post, [n_heads, d_head] at attn.hook_z. One 1-token forward; an unknown name is a one-line error."""
    device = model_device(model)
    _, cache = model.run_with_cache(torch.zeros(1, 1, dtype=torch.long, device=device), names_filter=hook_name)
    return cache[hook_name].shape[2:]


def _token_sets(prompts: Sequence[torch.Tensor] | torch.Tensor, what: str) -> list[torch.Tensor]:
    if isinstance(prompts, torch.Tensor):
        prompts = list(prompts) if prompts.dim() == 2 else [prompts]
    prompts = [torch.as_tensor(p).long().flatten() for p in prompts]
    prompts = [p for p in prompts if p.numel()]
    if not prompts:
        raise CircuitlabError(f"the {what} prompt set is empty: give at least one non-empty prompt")
    return prompts


@torch.no_grad()
def mean_activation(model: Transformer, prompts: Sequence[torch.Tensor], hook_name: str,
                    last_only: bool = False) -> torch.Tensor:
    """Mean activation (one position's shape, [d_model] on the residual stream) at hook_name over every position of every prompt (or their last tokens)."""
    device = model_device(model)
    total, count = None, 0
    for p in prompts:
        _, cache = model.run_with_cache(p[None, -model.cfg.n_ctx:].to(device), names_filter=hook_name)
        act = cache[hook_name][0]  # [pos, *shape]
        act = act[-1:] if last_only else act
        total = act.sum(0) if total is None else total + act.sum(0)
        count += act.shape[0]
    assert total is not None  # at least one prompt (checked before)
    return total / count


def contrast_direction(model: Transformer, positive: Sequence[torch.Tensor] | torch.Tensor,
                       negative: Sequence[torch.Tensor] | torch.Tensor, layer: int | None = None,
                       hook_name: str | None = None, last_only: bool = False) -> SteeringVector:
    """Difference of means: mean activation over the positive prompts minus over the negative prompts,
    at hook_name (default: blocks.{layer}.hook_resid_pre). Prompts: token id tensors [pos] (any lengths)."""
    if hook_name is None:
        if layer is None:
            raise CircuitlabError("give a layer (or a hook_name) to take the direction at")
        hook_name = layer_hook(model, layer)
    pos, neg = _token_sets(positive, "positive"), _token_sets(negative, "negative")
    direction = mean_activation(model, pos, hook_name, last_only) - mean_activation(model, neg, hook_name, last_only)
    return SteeringVector(direction.detach(), hook_name, "contrast",
                          {"n_positive": len(pos), "n_negative": len(neg), "last_only": last_only})


def vector_direction(model: Transformer, vector: torch.Tensor, layer: int | None = None, hook_name: str | None = None,
                     source: str = "vector") -> SteeringVector:
    """Any vector as a steering direction at hook_name (default blocks.{layer}.hook_resid_pre): [d_model] on the
    residual stream (a probe's weight column), or one position's activation shape at other hooks (a dictionary
    feature's decoder row at mlp.hook_post is [d_mlp]; at attn.hook_z [n_heads * d_head] is reshaped)."""
    vector = torch.as_tensor(vector).detach().float()
    if hook_name is None:
        if layer is None:
            raise CircuitlabError("give a layer (or a hook_name) to add the vector at")
        hook_name = layer_hook(model, layer)
    shape = hook_shape(model, hook_name)
    if vector.numel() != shape.numel():
        raise CircuitlabError(f"a steering vector at {hook_name} must have {shape.numel()} entries "
                              f"(one position's activation there is {list(shape)}), got {vector.numel()}")
    vector = vector.reshape(shape)
    return SteeringVector(vector, hook_name, source)


def feature_direction(model: Transformer, dictionary, feature: int) -> SteeringVector:
    """A sparse dictionary's feature (circuitlab.dictionaries.SparseDictionary): its decoder row W_dec[feature]
    ([d_in]), added at the hook the dictionary reconstructs (cfg.out_hook_name for a transcoder, else cfg.hook_name)."""
    W_dec = dictionary.W_dec
    if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < W_dec.shape[0]:
        raise CircuitlabError(f"feature must be an index in 0..{W_dec.shape[0] - 1}, got {feature!r}")
    cfg = dictionary.cfg
    hook = getattr(cfg, "out_hook_name", None) or cfg.hook_name
    vec = vector_direction(model, W_dec[feature], hook_name=hook, source="feature")
    vec.info["feature"] = feature
    return vec


def steering_hook(vector: SteeringVector, coef: float, positions: Sequence[int] | None = None):
    """(hook_name, fn) adding coef · direction at `positions` (absolute; None = all). The hook counts the
    positions it has seen, so with KV-cached generation each new token gets its absolute position."""
    seen = [0]

    def add(x: torch.Tensor, hook) -> torch.Tensor:  # x [batch, pos, *direction.shape]
        delta = (coef * vector.direction).to(x.device, x.dtype)
        start = seen[0]
        seen[0] += x.shape[1]
        if positions is None:
            return x + delta
        idx = [p - start for p in positions if start <= p < start + x.shape[1]]
        if not idx:
            return x
        x = x.clone()
        x[:, idx] += delta
        return x

    return vector.hook_name, add


@contextmanager
def steering(model: Transformer, vector: SteeringVector, coef: float,
             positions: Sequence[int] | None = None) -> Iterator[Any]:
    """Context manager: forward passes and model.generate inside it are steered. Position counting starts
    at the first forward pass inside; use one context per generation when positions are given."""
    with model.hooks(fwd_hooks=[steering_hook(vector, coef, positions)]):
        yield model


@torch.no_grad()
def steered_generate(model: Transformer, tokens: torch.Tensor, vector: SteeringVector, coef: float, max_new_tokens: int,
                     positions: Sequence[int] | None = None, **kwargs: Any) -> torch.Tensor:
    """model.generate with steering: tokens [batch, pos] -> [batch, pos + new]."""
    if positions is not None and tokens.shape[-1] + max_new_tokens > model.cfg.n_ctx:
        raise CircuitlabError("steering at given positions needs the generation to fit the context "
                              f"({model.cfg.n_ctx} tokens)")
    with steering(model, vector, coef, positions):
        return model.generate(tokens, max_new_tokens, **kwargs)


# ---------------------------------------------------------------------------- measuring


def _mean_loss(model: Transformer, prompts: list[torch.Tensor]) -> float:
    device = model_device(model)
    losses = [model.loss(p[None, -model.cfg.n_ctx - 1:].to(device), per_token=True)[0] for p in prompts if p.numel() > 1]
    if not losses:
        raise CircuitlabError("every prompt is a single token: a loss needs at least two")
    return float(torch.cat(losses).mean())


@dataclass
class SteeringSweep:
    """The effect of one direction at several coefficients.

    preference [coef]: mean next-token loss on the negative prompts minus on the positive ones (how much
    more the steered model expects the positive set; what a contrast direction is made for);
    neutral_loss [coef]: mean next-token loss on neutral text (the side effect); metric [coef]: a custom
    metric when one was given (else None)."""

    coefs: list[float]
    preference: torch.Tensor
    neutral_loss: torch.Tensor
    vector: SteeringVector
    metric: torch.Tensor | None = None
    metric_name: str | None = None
    base_loss: float | None = None  # neutral loss of the unsteered model

    def neutral_cost(self) -> torch.Tensor:
        """neutral loss increase over the unsteered model (base_loss, measured whether or not 0 is a
        coefficient of the sweep)."""
        base = self.base_loss if self.base_loss is not None else float(self.neutral_loss[self.coefs.index(0.0)])
        return self.neutral_loss - base

    def table(self) -> str:
        head = f"{'coef':>8}{'preference':>12}{'neutral loss':>14}{'cost':>9}"
        if self.metric is not None:
            head += f"  {self.metric_name or 'metric'}"
        rows = [head]
        for i, c in enumerate(self.coefs):
            row = f"{c:>8g}{float(self.preference[i]):>12.4f}{float(self.neutral_loss[i]):>14.4f}" \
                  f"{float(self.neutral_cost()[i]):>+9.4f}"
            if self.metric is not None:
                row += f"  {float(self.metric[i]):>10.4f}"
            rows.append(row)
        return "\n".join(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"coefs": self.coefs, "preference": rounded(self.preference), "neutral_loss": rounded(self.neutral_loss),
                "neutral_cost": rounded(self.neutral_cost()), "unsteered_neutral_loss": self.base_loss, "vector": self.vector.to_dict(),
                "metric": rounded(self.metric) if self.metric is not None else None, "metric_name": self.metric_name}

    def _repr_html_(self) -> str:
        return f"<pre>{self.table()}</pre>"


def kv_floats(model: Transformer, samples: int, length: int | None = None) -> int:
    """Floats of the keys and values a batch of `samples` generations of `length` tokens (default: the context)
    holds in its KV cache."""
    cfg = model.cfg
    return samples * 2 * cfg.n_layers * min(length or cfg.n_ctx, cfg.n_ctx) * cfg.kv_heads * cfg.head_dim


def check_kv(model: Transformer, samples: int) -> None:
    """Refuse, in one line, more generations in one batch than a pass's share of the memory budget holds the keys
    and values of (at the full context)."""
    import circuitlab.memory as memory

    kv, budget = kv_floats(model, samples), memory.floats(memory.PASS_SHARE)
    if kv > budget:
        fit = max(1, budget // kv_floats(model, 1))
        raise CircuitlabError(f"--samples {samples}: the keys and values of {samples} generations of this model need "
                              f"{kv * 4 / 2**30:.1f} GiB (limit {memory.describe(memory.PASS_SHARE)}); give at most {fit}")


def steer_estimate(model: Transformer, samples: int, prompt_len: int, max_tokens: int, n_coefs: int, loss_tokens: int,
                   longest: int | None = None) -> Any:
    """What a steering sweep with generations holds at its peak and computes (circuitlab.memory.Estimate): a batch
    of `samples` generations of prompt_len + max_tokens tokens (their KV cache, the prompt's logits) and the
    logits of the longest loss prompt; per coefficient, the generations and a loss pass over loss_tokens tokens
    of the positive, negative and neutral prompts."""
    import circuitlab.memory as memory
    from circuitlab.model import model_dtype
    from circuitlab.perf import transformer_step_flops

    cfg = model.cfg
    size = model_dtype(model).itemsize
    length = min(prompt_len + max_tokens, cfg.n_ctx)
    longest = min(longest or cfg.n_ctx, cfg.n_ctx)
    parts = {"keys and values of the generations": kv_floats(model, samples, length) * size,
             "the generations' prompt logits": samples * prompt_len * cfg.d_vocab * size,
             "a loss prompt's logits": 2 * longest * cfg.d_vocab * 4}
    flops = n_coefs * (transformer_step_flops(cfg, samples * length, length, backward=False)
                       + transformer_step_flops(cfg, loss_tokens, longest, backward=False))
    return memory.Estimate(f"steering ({n_coefs} coefficient{'s' if n_coefs != 1 else ''}, {samples} generations of "
                           f"{max_tokens} tokens each)", parts, held=memory.tensor_bytes(model), flops=flops,
                           efficiency=0.3)


@torch.no_grad()
def steering_sweep(model: Transformer, vector: SteeringVector, coefs: Sequence[float], positive: Sequence[torch.Tensor],
                   negative: Sequence[torch.Tensor], neutral: Sequence[torch.Tensor],
                   metric: Callable[[Any], float] | None = None, metric_name: str | None = None,
                   progress: bool = False) -> SteeringSweep:
    """For each coefficient (steering at every position): the preference for the positive prompts over the
    negative ones, the loss on neutral text, and metric(model) -> float if given (run inside the steering).
    The unsteered model's neutral loss is measured too (the cost's zero), whether or not 0 is a coefficient.
    progress: a bar over the coefficients."""
    from tqdm.auto import tqdm

    if isinstance(coefs, (str, bytes)):
        raise CircuitlabError(f"steering coefficients must be a list of numbers, got {coefs!r}")
    coefs = [c.item() if isinstance(c, torch.Tensor) else c for c in coefs]
    if not coefs:
        raise CircuitlabError("give at least one steering coefficient")
    coefs = [FINITE.check(c, f"steering coefficient {i + 1}") for i, c in enumerate(coefs)]
    pos, neg, neu = _token_sets(positive, "positive"), _token_sets(negative, "negative"), _token_sets(neutral, "neutral")
    pref, loss, custom = [], [], []
    base_loss = None if 0.0 in coefs else _mean_loss(model, neu)
    for c in tqdm(coefs, desc="steering", unit="coef", disable=not progress):
        with steering(model, vector, c):
            pref.append(_mean_loss(model, neg) - _mean_loss(model, pos))
            loss.append(_mean_loss(model, neu))
            if metric is not None:
                custom.append(float(metric(model)))
    if base_loss is None:
        base_loss = loss[coefs.index(0.0)]
    return SteeringSweep(coefs, torch.tensor(pref), torch.tensor(loss), vector,
                         torch.tensor(custom) if metric is not None else None, metric_name, base_loss)
