"""The logit targets of an attribution graph: the likely next tokens, named tokens or directions, a difference.

    targets = top_logit_targets(logits, max_n_logits=10, desired_logit_prob=0.95)   # logits [d_vocab]
    targets = named_logit_targets(logits, [17, ("up - down", direction)])
    target = logit_difference(tokenizer, token, foil, d_vocab)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from circuitlab.errors import InputError
from circuitlab.graphs.options import DEFAULTS


@dataclass
class LogitTarget:
    """One logit node: a label, a direction over the vocabulary [d_vocab] (demeaned when used), its weight
    (the token's probability, or 1 for a named direction) and the token id (-1 for a direction)."""

    label: str
    direction: torch.Tensor
    weight: float
    token: int = -1


def top_logit_targets(logits: torch.Tensor, max_n_logits: int = DEFAULTS.max_n_logits,
                      desired_logit_prob: float = DEFAULTS.desired_logit_prob,
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
        out.append(LogitTarget(token_text(tokenizer, i), onehot, float(p), i))
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
            out.append(LogitTarget(token_text(tokenizer, t), onehot, float(probs[t]), t))
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
    """The direction logit[token] - logit[foil] as one logit node (weight 1); the same token twice is refused
    (the difference is zero: the graph would explain nothing)."""
    if int(token) == int(foil):
        raise InputError(f"the foil {token_text(tokenizer, foil)!r} is the target: give a different token to "
                         "contrast with (or no foil)")
    vec = torch.zeros(d_vocab)
    vec[token], vec[foil] = 1.0, -1.0
    return LogitTarget(f"{token_text(tokenizer, token)} - {token_text(tokenizer, foil)}", vec, 1.0)


def token_text(tokenizer: Any, i: int) -> str:
    if tokenizer is None:
        return f"tok{i}"
    try:
        return tokenizer.decode([i])
    except Exception:  # noqa: BLE001 - a label only
        return f"tok{i}"
