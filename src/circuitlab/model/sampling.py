"""Next-token sampling: temperature, top-k, top-p (nucleus), and the one check of those options that
`Transformer.generate`, `circuitlab generate` and `circuitlab steer` share."""
from __future__ import annotations

import torch

from circuitlab.checks import Number
from circuitlab.errors import InputError

# The temperature's rule (the options classes that take one declare it); check_sampling says it with what 0 means.
TEMPERATURE = Number(float, low=0.0)


def check_sampling(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                   cli: bool = False) -> None:
    """An InputError naming the first option out of range. cli: name the options as the command line
    spells them (--top-k instead of top_k)."""
    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if cli else option

    if TEMPERATURE.problem(temperature) is not None:
        raise InputError(f"{name('temperature')} must be a finite number >= 0 (0 = greedy decoding), "
                         f"got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"{name('top_k')} must be a whole number >= 1 (or left out for no limit), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0 < top_p <= 1):  # NaN fails the comparison too
        raise InputError(f"{name('top_p')} must be in (0, 1] (or left out for no limit), got {top_p!r}")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [batch, d_vocab] -> token ids [batch]. temperature 0 means greedy (argmax)."""
    check_sampling(temperature, top_k, top_p)
    if not bool(torch.isfinite(logits).all()):
        raise InputError("the model's logits are not finite (NaN or inf): its weights or its inputs (e.g. a "
                         "steering vector) hold NaN or inf values")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (always keep the first)
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
