"""Next-token sampling: temperature, top-k, top-p (nucleus)."""
from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [batch, d_vocab] -> token ids [batch]. temperature <= 0 means greedy (argmax)."""
    if temperature <= 0:
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
