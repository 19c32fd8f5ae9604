"""The other signatures of induction heads, and what a training run tracks to show their phase change.

    in_context_learning_score(model, story_tokens)    # loss late in the context minus early (Olsson)
    train(run, out, track=training_probes())          # tracked while training (circuitlab.training.train)

The induction test itself, [r, r] at every period, is circuitlab.analysis.heads.detectors.induction_by_period.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitlab.analysis.heads.detectors import MIN_PERIOD, detect_heads, induction_by_period, induction_test_tokens
from circuitlab.errors import CircuitlabError
from circuitlab.model.transformer import lm_loss, model_device
from circuitlab.training.tracking import Probe

if TYPE_CHECKING:
    from circuitlab.model import Transformer

# ---------------------------------------------------------------------------- in-context learning

ICL_BATCH = 16   # sequences per forward pass of in_context_learning_score


@dataclass
class ICLScore:
    """In-context learning score: mean loss around a late position minus around an early one (nats).

    Negative means later tokens are predicted better thanks to the context. The losses are averaged
    over the positions [early_pos, early_pos + width) and (late_pos - width, late_pos]."""

    score: float
    early_pos: int
    late_pos: int
    early_loss: float
    late_loss: float
    loss_by_pos: torch.Tensor  # [pos]
    width: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"score": round(self.score, 6), "early_pos": self.early_pos, "late_pos": self.late_pos,
                "width": self.width, "early_loss": round(self.early_loss, 6), "late_loss": round(self.late_loss, 6),
                "loss_by_pos": [round(float(x), 6) for x in self.loss_by_pos]}


@torch.no_grad()
def in_context_learning_score(model: Transformer, tokens: torch.Tensor, early: int | None = None,
                              late: int | None = None,
                              width: int | None = None, batch_size: int = ICL_BATCH) -> ICLScore:
    """Loss of predicting the tokens around position late minus around position early, averaged over
    sequences (Olsson et al. 2022: the 500th token's loss minus the 50th's, contexts of 512).

    tokens [n_seq, pos + 1] (inputs tokens[:, :-1], targets tokens[:, 1:]), run in batches.
    Defaults scale the paper's positions to the context: early = round(pos * 50 / 512),
    late = round(pos * 500 / 512) (6 and 62 for pos 64), each averaged over width = max(1, pos // 32)
    positions (early .. early + width - 1, late - width + 1 .. late) to steady the estimate.
    """
    if tokens.dim() != 2 or tokens.shape[1] < 3:
        raise CircuitlabError(f"in_context_learning_score needs tokens [n_seq, pos + 1] with pos >= 2, "
                              f"got shape {tuple(tokens.shape)}")
    T = tokens.shape[1] - 1
    early = round(T * 50 / 512) if early is None else early
    late = min(T - 1, round(T * 500 / 512)) if late is None else late
    width = max(1, T // 32) if width is None else width
    if not 0 <= early < late < T:
        raise CircuitlabError(f"need 0 <= early < late < {T} (positions in the sequence), "
                              f"got early={early}, late={late}")
    width = max(1, min(width, late - early))
    device = model_device(model)
    total = torch.zeros(T)
    for start in range(0, tokens.shape[0], batch_size):
        chunk = tokens[start:start + batch_size].to(device)
        total += model.loss(chunk, per_token=True).sum(dim=0).float().cpu()
    loss_by_pos = total / tokens.shape[0]
    e = float(loss_by_pos[early:early + width].mean())
    l_ = float(loss_by_pos[late - width + 1:late + 1].mean())
    return ICLScore(l_ - e, early, late, e, l_, loss_by_pos, width)


# ---------------------------------------------------------------------------- tracked while training

def training_probes(batch: int = 16, seed: int = 1234, max_len: int = 128) -> list[Probe]:
    """The metrics the demo and `circuitlab train` track; each probe is (model, data) -> dict.

    - "induction", "prev_token" [layer][head]: detector scores on fixed tiled random segments
      (induction_test_tokens of seq_len = min(n_ctx, max_len), periods seq_len/8..seq_len/4);
    - "repeat_loss": loss on their second half, where every token repeats one a period earlier;
    - "induction_by_period" {period: best head's score} and "repeat_loss_by_period" {period: loss on
      the second copy} on [r, r] at a short, a middle and the longest period that fits seq_len;
    - "icl": the in-context-learning score on the run's validation text (see icl_probe).
    The sequences are fixed (seeded, built at the first call), so the curves compare across steps;
    r avoids the tokenizer's EOS.
    """
    made: dict[str, Any] = {}

    def sequences(model: Transformer, data) -> tuple[torch.Tensor, list[int], list[int]]:
        key = (model.cfg.d_vocab, model.cfg.n_ctx)
        if made.get("key") != key:
            seq_len = min(model.cfg.n_ctx, max_len)
            longest = seq_len // 2
            gen = torch.Generator().manual_seed(seed)
            made.update(key=key, tiled=induction_test_tokens(batch, seq_len, model.cfg.d_vocab, gen),
                        periods=sorted({min(2 * MIN_PERIOD, longest), max(MIN_PERIOD, longest // 2), longest}))
        eos = getattr(getattr(data, "tokenizer", None), "eos_id", None)
        return made["tiled"], made["periods"], [] if eos is None else [eos]

    @torch.no_grad()
    def heads(model: Transformer, data) -> dict[str, Any]:
        tiled, _, _ = sequences(model, data)
        tokens = tiled.to(model_device(model))
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        losses = lm_loss(logits[:, :-1].float(), tokens[:, 1:], per_token=True)
        found: dict[str, Any] = {"repeat_loss": round(losses[:, tokens.shape[1] // 2:].mean().item(), 4)}
        if model.cfg.n_layers:
            scores = detect_heads(cache, tokens)
            found["induction"] = _lists(scores["induction"])
            found["prev_token"] = _lists(scores["previous_token"])
        return found

    def by_period(model: Transformer, data) -> dict[str, Any]:
        _, periods, exclude = sequences(model, data)
        if not model.cfg.n_layers or periods[-1] < 2:
            return {}
        sweep = induction_by_period(model, periods, batch, seed, exclude)
        return {"induction_by_period": {str(p): round(float(s), 4) for p, s in zip(periods, sweep.best)},
                "repeat_loss_by_period": {str(p): round(float(s), 4) for p, s in zip(periods, sweep.loss_second)}}

    return [heads, by_period, icl_probe()]


def icl_probe(n_rows: int = 32, max_len: int = 128) -> Probe:
    """A probe for the in-context-learning score on the run's validation text (natural text only:
    rows cut from data.val, never the synthetic segments), with the default positions of
    circuitlab.analysis.heads.induction.in_context_learning_score (Olsson's 500th and 50th of 512, scaled to
    the context min(n_ctx, max_len)). Data without a val stream (e.g. the addition task) gives {}."""
    rows: dict[int, torch.Tensor | None] = {}

    def icl(model: Transformer, data) -> dict[str, Any]:
        if id(data) not in rows:
            rows.clear()
            rows[id(data)] = validation_rows(data.val, min(model.cfg.n_ctx, max_len) + 1, n_rows)
        held = rows[id(data)]
        if held is None:
            return {}
        found = in_context_learning_score(model, held)
        return {"icl": round(found.score, 4)}

    return icl


def validation_rows(stream, length: int, n_rows: int) -> torch.Tensor | None:
    """n_rows evenly spaced windows of `length` tokens from a 1-D token stream: [n_rows, length]
    (fewer if the stream is short; None if it holds less than one window)."""
    n = len(stream)
    if n < length:
        return None
    starts = np.linspace(0, n - length, min(n_rows, n - length + 1)).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(stream[s:s + length]) for s in starts]).astype(np.int64))


def _lists(t: torch.Tensor) -> list[list[float]]:
    return [[round(float(x), 4) for x in row] for row in torch.nan_to_num(t).cpu()]
