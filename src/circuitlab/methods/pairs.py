"""The clean and corrupted prompts the causal methods share (patching, ablation, probing: `interpret`'s --clean and
--corrupt), and their check.

Without --clean/--corrupt the methods test the induction circuit on random tokens:
clean = r + r[:k] (n distinct random tokens, then the first k again), whose last token r[k-1]
is followed by r[k] earlier on, so an induction circuit predicts r[k]; corrupt = the same with
the first occurrence of r[k-1] replaced, so nothing earlier says what follows it. The metric is
the log-probability of r[k] at the last position. Denoising then lights up the three places the
information flows through: the residual stream at the replaced position, the previous-token head
at the position after it (where it writes "my previous token is r[k-1]"), and the induction head
at the last position.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.patching import check_pair, logit_diff, logprob
from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device
from circuitlab.spec import Options

if TYPE_CHECKING:
    from circuitlab.model import Transformer

SEED = 0
BATCH = 8


def random_ids(shape: tuple[int, ...], vocab: int, eos: int | None, gen: torch.Generator) -> torch.Tensor:
    """Uniform random token ids that are never the EOS id."""
    if eos is None or not 0 <= eos < vocab:
        return torch.randint(0, vocab, shape, generator=gen)
    ids = torch.randint(0, vocab - 1, shape, generator=gen)
    return ids + (ids >= eos).long()


def _distinct_ids(rows: int, n: int, vocab: int, eos: int | None, gen: torch.Generator) -> torch.Tensor:
    """[rows, n] ids, distinct within each row, never EOS."""
    allowed = torch.tensor([t for t in range(vocab) if t != eos])
    return torch.stack([allowed[torch.randperm(len(allowed), generator=gen)[:n]] for _ in range(rows)])


def induction_pair(model: Transformer, tokenizer, batch: int = BATCH, seed: int = SEED
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Default prompts for patching (see the module docstring).

    Returns clean [batch, n + k], corrupt [batch, n + k], answer [batch] (r[k]) and k.
    """
    vocab, eos = model.cfg.d_vocab, getattr(tokenizer, "eos_id", None)
    n = min(16, vocab - 2, (2 * model.cfg.n_ctx) // 3)
    if n < 3:
        raise CircuitlabError("the default induction prompts need a vocabulary of at least 5 tokens and a context "
                              "of at least 5 positions; pass --clean and --corrupt instead")
    k = max(2, n // 2)
    gen = torch.Generator().manual_seed(seed)
    ids = _distinct_ids(batch, n + 1, vocab, eos, gen)
    r, spare = ids[:, :n], ids[:, n]  # spare: a token not in r, to corrupt with
    clean = torch.cat([r, r[:, :k]], dim=1)
    corrupt = clean.clone()
    corrupt[:, k - 1] = spare
    return clean, corrupt, r[:, k], k


def pair_prompts(model: Transformer, tokenizer, clean: str | None, corrupt: str | None):
    """(clean, corrupt tokens [batch, pos], metric, description, token strings of row 0)."""
    device = model_device(model)
    if clean is None and corrupt is None:
        c, x, answer, k = induction_pair(model, tokenizer)
        c, x = c.to(device), x.to(device)
        metric = logprob(answer.to(device))
        what = (f"{c.shape[0]} random sequences r + r[:{k}] (n={c.shape[1] - k}); corrupted: the first "
                f"occurrence of the last token replaced (position {k - 1}); metric: log-prob of the induction "
                "answer at the last position")
        return c, x, metric, what, [tokenizer.decode([int(t)]) for t in c[0]]
    if clean is None or corrupt is None:
        raise CircuitlabError("--clean and --corrupt go together: give both or neither")
    c, x = check_pair(model, tokenizer.encode(clean), tokenizer.encode(corrupt))
    with torch.no_grad():
        a, w = int(model(c)[0, -1].argmax()), int(model(x)[0, -1].argmax())
    if a != w:
        metric = logit_diff(a, w)
        what = f"logit({tokenizer.decode([a])!r}) - logit({tokenizer.decode([w])!r}) at the last position"
    else:
        metric = logprob(a)
        what = f"log-prob of {tokenizer.decode([a])!r} at the last position (both prompts predict it)"
    return c, x, metric, what, [tokenizer.decode([int(t)]) for t in c[0]]


def check_pairs(model: "Transformer", tokenizer: Any, options: Options, clean: str | None = None,
                corrupt: str | None = None, **_: Any) -> None:
    """The shared check of the causal methods: the default induction pair fits the model, or the given clean and
    corrupted prompts are a pair (same token length, within the context)."""
    if clean is None:
        induction_pair(model, tokenizer)
    else:
        check_pair(model, tokenizer.encode(clean), tokenizer.encode(corrupt))
