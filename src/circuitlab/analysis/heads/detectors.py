"""Attention heads from their behaviour: every detector in one pass, and the induction test by period.

    scores = detect_heads(cache, tokens)            # every detector, every head, one pass
    sweep = induction_by_period(model, exclude=[eos])   # [r, r] at every period 4..n_ctx/2

Every detector is "the share of a head's attention that lands on the positions the pattern
predicts", averaged over the query rows where such positions exist (so a perfect head scores 1
and a head attending elsewhere scores 0). Query position 0 is never scored: causally it can only
attend to itself, so it says nothing about the head.

TransformerLens's detect_head ("mul" measure) sums the same masked attention but divides by all
query rows, including rows with no target; its score is ours x (rows with a target) / (all rows).
We leave the target-less rows out so that scores of sequences with few duplicates stay comparable.

The induction test of Olsson et al. (2022) and TransformerLens is a random sequence r of `period`
tokens followed by itself, [r, r]: an induction head attends from each token of the second copy to the
token right after its occurrence in the first copy, period - 1 positions back. A head that learned
"attend k positions back" instead passes at one period only; induction_by_period shows it, and
classify_heads (analysis.heads) asks for induction at a short and at the longest period.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.analysis._json import from_rounded, rounded
from circuitlab.data.synthetic import repeated_random_tokens, tiled_random_segments
from circuitlab.errors import CircuitlabError
from circuitlab.model.transformer import lm_loss, model_device
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

DETECTORS = ("previous_token", "current_token", "first_token", "duplicate_token", "induction")



def induction_test_tokens(batch: int, seq_len: int, vocab_size: int, generator: torch.Generator | None = None
                          ) -> torch.Tensor:
    """Default sequences for the detectors: random segments, each tiled a few times, [batch, seq_len].

    Periods vary (seq_len // 8 .. seq_len // 4) along and between rows: with one fixed period a head
    that attends "period - 1 positions back" would pass the induction test without doing induction.
    """
    min_len = max(2, seq_len // 8)
    return tiled_random_segments(batch, seq_len, vocab_size, generator, min_len=min_len,
                                 max_len=max(min_len, seq_len // 4))


# ---------------------------------------------------------------------------- detectors


def attention_patterns(cache) -> torch.Tensor:
    """All attention patterns of a cache, stacked: [layer, batch, head, query_pos, key_pos]."""
    layers: list[torch.Tensor] = []
    while f"blocks.{len(layers)}.attn.hook_pattern" in cache.keys():
        layers.append(cache[f"blocks.{len(layers)}.attn.hook_pattern"])
    if not layers:
        raise CircuitlabError("the cache holds no attention patterns: run model.run_with_cache(tokens) with no "
                              "names_filter, or names_filter=lambda n: n.endswith('hook_pattern')")
    return torch.stack(layers)


def detection_masks(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Where each kind of head should attend: name -> bool [batch, query_pos, key_pos].

    previous_token: key = query - 1.
    current_token:  key = query (query >= 1).
    first_token:    key = 0 (query >= 1); the "attention sink".
    duplicate_token: earlier keys holding the same token as the query.
    induction:      keys right after an earlier occurrence of the query's token (key - 1 holds the query
                    token, key <= query). On [r, r] with distinct tokens in r this is exactly the token
                    after the query token's first occurrence; later repeats count every earlier one.
    """
    B, T = tokens.shape
    q = torch.arange(T, device=tokens.device)[:, None]
    k = torch.arange(T, device=tokens.device)[None, :]
    not_first = (q >= 1).expand(T, T)
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, q, k]: token at q == token at k
    after_same = torch.zeros_like(same)
    after_same[:, :, 1:] = same[:, :, :-1]  # token at q == token at k - 1
    return {
        "previous_token": (k == q - 1).expand(B, T, T),
        "current_token": ((k == q) & not_first).expand(B, T, T),
        "first_token": ((k == 0) & not_first).expand(B, T, T),
        "duplicate_token": same & (k < q),
        "induction": after_same & (k <= q),
    }


def mask_score(patterns: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Share of attention on the masked keys, averaged over query rows with at least one masked key.

    patterns [layer, batch, head, query_pos, key_pos]; mask bool [batch, query_pos, key_pos].
    Returns (scores [layer, head], number of scored (batch, query) rows). No rows -> NaN scores.
    """
    rows = mask.any(dim=-1)  # [batch, q]
    n_rows = int(rows.sum())
    total = (patterns * mask[None, :, None]).sum(dim=(1, 3, 4))  # rows without a target add 0
    return total / n_rows if n_rows else torch.full_like(total, float("nan")), n_rows


def attention_entropy(patterns: torch.Tensor) -> torch.Tensor:
    """Mean normalised entropy of each head's attention rows: [layer, head] in [0, 1].

    Row q's entropy H = -Σ p log p is divided by log(q + 1), the entropy of uniform attention over
    the q + 1 keys it may see; query 0 is skipped. 0 = all attention on one key, 1 = uniform.
    """
    T = patterns.shape[-1]
    plogp = torch.where(patterns > 0, patterns * patterns.clamp(min=1e-30).log(), torch.zeros_like(patterns))
    entropy = -plogp.sum(dim=-1)[..., 1:]  # [layer, batch, head, q >= 1]
    uniform = torch.arange(2, T + 1, dtype=patterns.dtype, device=patterns.device).log()
    return (entropy / uniform).mean(dim=(1, 3))


@dataclass
class HeadScores:
    """Detector scores [layer, head] by name (DETECTORS plus "entropy", see attention_entropy),
    and how many (sequence, query) rows each detector scored."""

    scores: dict[str, torch.Tensor]
    n_rows: dict[str, int]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.scores:
            raise CircuitlabError(f"unknown head score {name!r}; available: {', '.join(self.scores)}")
        return self.scores[name]

    def top(self, name: str, n: int = 3) -> list[tuple[int, int, float]]:
        """The n highest-scoring heads for one detector: (layer, head, score)."""
        s = torch.nan_to_num(self[name], nan=-1.0)
        order = s.flatten().argsort(descending=True)[:n].tolist()
        H = s.shape[1]
        return [(i // H, i % H, float(s.flatten()[i])) for i in order]

    def to_dict(self) -> dict[str, Any]:
        return {"scores": {k: rounded(v) for k, v in self.scores.items()}, "n_rows": dict(self.n_rows)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadScores":
        """to_dict() read back (float64, None as NaN: the written values exactly)."""
        return cls({k: from_rounded(v) for k, v in d["scores"].items()}, dict(d.get("n_rows") or {}))


def detect_heads(cache, tokens: torch.Tensor) -> HeadScores:
    """Run every detector on every head at once.

    cache: an ActivationCache holding blocks.{l}.attn.hook_pattern [batch, head, query_pos, key_pos]
    for all layers; tokens [batch, pos]: the tokens that produced it (needed for duplicate/induction).
    """
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.shape[1] < 2:
        raise CircuitlabError("head detectors need sequences of at least 2 tokens")
    patterns = attention_patterns(cache)
    if patterns.shape[1] != tokens.shape[0] or patterns.shape[-1] != tokens.shape[1]:
        raise CircuitlabError(f"tokens {tuple(tokens.shape)} do not match the cached patterns "
                              f"[batch {patterns.shape[1]}, pos {patterns.shape[-1]}]")
    scores, n_rows = {}, {}
    for name, mask in detection_masks(tokens.to(patterns.device)).items():
        scores[name], n_rows[name] = mask_score(patterns, mask)
    scores["entropy"] = attention_entropy(patterns)
    n_rows["entropy"] = tokens.shape[0] * (tokens.shape[1] - 1)
    return HeadScores(scores, n_rows)


# ---------------------------------------------------------------------------- [r, r] at every period

MIN_PERIOD = 4


def default_periods(n_ctx: int, most: int = 32) -> list[int]:
    """Every period from 4 to n_ctx // 2 (the longest [r, r] that fits), thinned to at most `most`
    evenly spaced ones (always keeping both ends) for long contexts."""
    longest = n_ctx // 2
    if longest < MIN_PERIOD:
        raise CircuitlabError(f"a context of {n_ctx} tokens cannot hold [r, r] with r of at least {MIN_PERIOD} tokens")
    if longest - MIN_PERIOD + 1 <= most:
        return list(range(MIN_PERIOD, longest + 1))
    return sorted({int(round(x)) for x in np.linspace(MIN_PERIOD, longest, most)})


@dataclass
class PeriodSweep:
    """The induction test [r, r] at several periods.

    scores [period, layer, head]: each head's induction score (attention from the second copy to the
    token after the first occurrence, as detect_heads scores it);
    loss_first / loss_second [period]: mean loss (nats) on the first copy's tokens 1..p-1 (nothing
    earlier predicts them: about ln(vocab) for a model that does no induction) and on the second
    copy's tokens p+1..2p-1 (predictable by copying; the second copy's first token is not).
    """

    periods: list[int]
    scores: torch.Tensor
    loss_first: torch.Tensor
    loss_second: torch.Tensor
    batch: int

    @property
    def best(self) -> torch.Tensor:
        """[period] the highest induction score of any head at each period."""
        return self.scores.flatten(1).max(dim=1).values

    @property
    def best_head(self) -> list[str]:
        """[period] the name "L{l}H{h}" of the best head at each period."""
        n_heads = self.scores.shape[2]
        return [head_name(i // n_heads, i % n_heads) for i in self.scores.flatten(1).argmax(dim=1).tolist()]

    def passes(self, min_score: float = 0.6, max_loss: float = 2.0) -> bool:
        """Whether the best head scores >= min_score and the second copy's loss is <= max_loss at
        every period (the demo's target)."""
        return bool((self.best >= min_score).all() and (self.loss_second <= max_loss).all())

    def table(self) -> list[str]:
        """The sweep as a Markdown table (one row per period)."""
        lines = ["| period | best head | induction score | loss on first copy | loss on second copy |",
                 "|---|---|---|---|---|"]
        for i, p in enumerate(self.periods):
            lines.append(f"| {p} | {self.best_head[i]} | {float(self.best[i]):.3f} | "
                         f"{float(self.loss_first[i]):.2f} | {float(self.loss_second[i]):.2f} |")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"periods": list(self.periods), "batch": self.batch, "best": rounded(self.best),
                "best_head": self.best_head, "scores": rounded(self.scores),
                "loss_first": rounded(self.loss_first), "loss_second": rounded(self.loss_second)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PeriodSweep":
        """to_dict() read back (float64; best and best_head are derived)."""
        return cls(list(d["periods"]), from_rounded(d["scores"]), from_rounded(d["loss_first"]),
                   from_rounded(d["loss_second"]), d["batch"])

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{p}</td><td>{h}</td><td>{float(s):.3f}</td><td>{float(a):.2f}</td>"
                       f"<td>{float(b):.2f}</td></tr>"
                       for p, h, s, a, b in zip(self.periods, self.best_head, self.best, self.loss_first,
                                                self.loss_second))
        return ("<table><tr><th>period</th><th>best head</th><th>induction score</th><th>loss on first copy</th>"
                f"<th>loss on second copy</th></tr>{rows}</table>")


@torch.no_grad()
def induction_by_period(model: Transformer, periods: Sequence[int] | None = None, batch: int = 16,
                        seed: int = DEFAULT_SEED,
                        exclude: Sequence[int] = (), progress: bool = False) -> PeriodSweep:
    """Run [r, r] (tokens [batch, 2 * period]) at each period; r is drawn uniformly from the token ids
    other than `exclude` (pass the tokenizer's special tokens), with a generator seeded by `seed`.

    periods default: default_periods(model.cfg.n_ctx), i.e. every period from 4 to half the context.
    progress: a bar over the periods (seconds at a 256-token context, more at real size).
    """
    from tqdm.auto import tqdm

    cfg = model.cfg
    periods = default_periods(cfg.n_ctx) if periods is None else [int(p) for p in periods]
    bad = [p for p in periods if not 2 <= p <= cfg.n_ctx // 2]
    if not periods or bad:
        raise CircuitlabError(f"periods must lie in [2, {cfg.n_ctx // 2}] (two copies must fit the context of "
                              f"{cfg.n_ctx}), got {bad or 'none'}")
    if cfg.n_layers == 0:
        raise CircuitlabError("this model has no layers, so no attention heads to test")
    device = model_device(model)
    gen = torch.Generator().manual_seed(seed)
    scores, first, second = [], [], []
    for p in tqdm(periods, desc="induction by period", unit="period", disable=not progress, leave=False):
        tokens = repeated_random_tokens(batch, p, cfg.d_vocab, gen, exclude=exclude).to(device)
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        losses = lm_loss(logits[:, :-1].float(), tokens[:, 1:], per_token=True)  # [batch, 2p - 1]; i predicts i + 1
        scores.append(torch.nan_to_num(detect_heads(cache, tokens)["induction"]).float().cpu())
        first.append(losses[:, : p - 1].mean().item())
        second.append(losses[:, p:].mean().item())
    return PeriodSweep(periods, torch.stack(scores), torch.tensor(first), torch.tensor(second), batch)
