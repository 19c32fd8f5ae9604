"""The one check of token ids given to a model: shape, integer dtype, inside the vocabulary, inside the
context. Every entry point (forward, loss, generate, run_with_cache, the analyses) goes through it, so a
bad input is one InputError line instead of an IndexError from the embedding (or, on a GPU, a
device-side assert that kills the process)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import InputError


def check_tokens(tokens: torch.Tensor | Sequence, cfg: ModelConfig, what: str = "tokens", *,
                 offset: int = 0, allow_empty: bool = False) -> torch.Tensor:
    """tokens [batch, pos] or [pos] -> the same ids as a tensor [batch, pos], or an InputError naming
    what was wrong. offset: positions already in a KV cache (they count against n_ctx).
    allow_empty: accept pos == 0 (the forward pass does: it returns empty logits)."""
    if isinstance(tokens, torch.Tensor):
        t = tokens
    else:
        try:
            t = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"{what} must be integer token ids [batch, pos] or [pos] (a tensor or nested lists), "
                             f"got {type(tokens).__name__} ({e})") from None
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2 or (t.shape[1] == 0 and not allow_empty) or t.shape[0] == 0:
        raise InputError(f"{what} must be token ids shaped [batch, pos] or [pos] with at least one token, "
                         f"got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise InputError(f"{what} must be integer token ids (torch.long), got {t.dtype}; "
                         "use tokenizer.encode(text) or tensor.long()")
    if t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))  # one reduction; a sync, cheap next to the forward pass
        if lo < 0 or hi >= cfg.d_vocab:
            bad = lo if lo < 0 else hi
            raise InputError(f"{what} hold id {bad}, outside the vocabulary [0, {cfg.d_vocab}) of the model; "
                             "encode text with the model's own tokenizer")
    if offset + t.shape[1] > cfg.n_ctx:
        held = f" (after {offset} cached)" if offset else ""
        raise InputError(f"{what} have {t.shape[1]} positions{held}: that exceeds the model's context "
                         f"n_ctx={cfg.n_ctx}; shorten the input")
    return t
