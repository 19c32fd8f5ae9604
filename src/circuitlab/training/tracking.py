"""Interpretability metrics tracked while training: they make the induction-head phase change
visible against tokens seen.

- induction score of each head: on random segments tiled with varying periods, the mean attention
  from each repeated token to the token right after its previous occurrence;
- previous-token score of each head: mean attention to position i-1 (on the same sequences);
- loss on the second half of those sequences (falls sharply when induction heads form);
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


def induction_batch(vocab_size: int, seq_len: int, batch: int = 16, seed: int = 1234) -> torch.Tensor:
    """Random segments tiled with varying periods [batch, seq_len], fixed by seed (so scores compare
    over steps). Varying periods keep a positional "k back" head from passing as induction."""
    from circuitlab.analysis.heads import induction_test_tokens

    return induction_test_tokens(batch, seq_len, vocab_size, torch.Generator().manual_seed(seed))


@torch.no_grad()
def head_scores(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """tokens [batch, pos] -> (induction [layer, head], prev_token [layer, head], repeat loss).

    Scores are circuitlab.analysis.heads.detect_heads's; the repeat loss is the mean loss over the
    second half of the positions, where every token repeats one a period earlier."""
    from circuitlab.analysis.heads import detect_heads

    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    losses = lm_loss(logits[:, :-1], tokens[:, 1:], per_token=True)
    repeat_loss = losses[:, tokens.shape[1] // 2:].mean().item()
    if model.cfg.n_layers == 0:
        empty = torch.zeros(0, model.cfg.n_heads)
        return empty, empty, repeat_loss
    scores = detect_heads(cache, tokens)
    return (torch.nan_to_num(scores["induction"]).cpu(), torch.nan_to_num(scores["previous_token"]).cpu(),
            repeat_loss)


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
