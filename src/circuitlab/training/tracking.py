"""Interpretability metrics tracked while training: they make the induction-head phase change
visible against tokens seen.

- induction score of each head: on repeated random tokens [r, r], the mean attention from each
  token in the second repeat to the token right after its first occurrence;
- previous-token score of each head: mean attention to position i-1 (on the same sequences);
- loss on the repeated half of those sequences (falls sharply when induction heads form);
- in-context-learning score on val data: loss at late positions minus loss at early ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitlab.model import Transformer, lm_loss


@dataclass
class TrackedMetrics:
    induction: list[list[float]]   # [layer][head]
    prev_token: list[list[float]]  # [layer][head]
    repeat_loss: float             # mean loss on the second repeat
    icl: float | None              # late-position loss minus early-position loss (negative = learns in context)

    def to_dict(self) -> dict:
        return {"induction": self.induction, "prev_token": self.prev_token,
                "repeat_loss": self.repeat_loss, "icl": self.icl}

    @property
    def max_induction(self) -> float:
        return max((s for layer in self.induction for s in layer), default=0.0)


def induction_batch(vocab_size: int, half_len: int, batch: int = 16, seed: int = 1234) -> torch.Tensor:
    """Repeated random tokens [batch, 2 * half_len], fixed by seed (so scores compare over steps)."""
    from circuitlab.data import repeated_random_tokens

    gen = torch.Generator().manual_seed(seed)
    return repeated_random_tokens(batch, half_len, vocab_size, generator=gen)


@torch.no_grad()
def head_scores(model: Transformer, rep_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """rep_tokens [batch, 2L] -> (induction [layer, head], prev_token [layer, head], repeat loss)."""
    L = rep_tokens.shape[1] // 2
    logits, cache = model.run_with_cache(rep_tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    induction, prev = [], []
    q = torch.arange(L, 2 * L)
    p = torch.arange(1, 2 * L)
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer]  # [batch, head, query_pos, key_pos]
        induction.append(pattern[:, :, q, q - L + 1].mean(dim=(0, 2)))
        prev.append(pattern[:, :, p, p - 1].mean(dim=(0, 2)))
    losses = lm_loss(logits[:, :-1], rep_tokens[:, 1:], per_token=True)
    repeat_loss = losses[:, L:].mean().item()
    empty = torch.zeros(0, model.cfg.n_heads)
    return (torch.stack(induction) if induction else empty, torch.stack(prev) if prev else empty, repeat_loss)


@torch.no_grad()
def icl_score(model: Transformer, batch: torch.Tensor) -> float:
    """batch [batch, pos+1] -> mean loss over the last 10% of positions minus over positions near 10%."""
    losses = model.loss(batch, per_token=True)  # [batch, pos]
    T = losses.shape[1]
    early = max(1, T // 10)
    width = max(1, T // 20)
    return (losses[:, T - width:].mean() - losses[:, early:early + width].mean()).item()


def track(model: Transformer, rep_tokens: torch.Tensor, val_batch: torch.Tensor | None) -> TrackedMetrics:
    was_training = model.training
    model.eval()
    induction, prev, repeat_loss = head_scores(model, rep_tokens)
    icl = icl_score(model, val_batch) if val_batch is not None else None
    model.train(was_training)
    return TrackedMetrics(_rounded(induction), _rounded(prev), round(repeat_loss, 4),
                          None if icl is None else round(icl, 4))


def _rounded(t: torch.Tensor) -> list[list[float]]:
    return [[round(float(x), 4) for x in row] for row in t]
