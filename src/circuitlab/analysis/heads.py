"""Attention heads from their behaviour: detectors, the induction test by period, classification.

    scores = detect_heads(cache, tokens)            # every detector, every head, one pass
    classes = classify_heads(model)                 # behaviour + weights -> labels with evidence
    classes.heads_with("induction")                 # [(1, 2)]
    sweep = induction_by_period(model, exclude=[eos])   # [r, r] at every period 4..n_ctx/2
    attention_view(model, tokens, tok, classes)     # every head's pattern, interactive in Jupyter

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
classify_heads asks for induction at a short and at the longest period.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from circuitlab.analysis._json import rounded
from circuitlab.analysis.circuits import (CompositionScores, CopyingScores, composition_scores,
                                         copying_scores)
from circuitlab.analysis.folding import weights_model
from circuitlab.analysis.patching_checks import one_sequence
from circuitlab.data.synthetic import repeated_random_tokens, tiled_random_segments
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError
from circuitlab.model.transformer import lm_loss, model_device
from circuitlab.names import head_name

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
    layers = []
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
    token after the first occurrence, as circuitlab.analysis.heads.detect_heads scores it);
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

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{p}</td><td>{h}</td><td>{float(s):.3f}</td><td>{float(a):.2f}</td>"
                       f"<td>{float(b):.2f}</td></tr>"
                       for p, h, s, a, b in zip(self.periods, self.best_head, self.best, self.loss_first,
                                                self.loss_second))
        return ("<table><tr><th>period</th><th>best head</th><th>induction score</th><th>loss on first copy</th>"
                f"<th>loss on second copy</th></tr>{rows}</table>")


@torch.no_grad()
def induction_by_period(model, periods: Sequence[int] | None = None, batch: int = 16, seed: int = 0,
                        exclude: Sequence[int] = ()) -> PeriodSweep:
    """Run [r, r] (tokens [batch, 2 * period]) at each period; r is drawn uniformly from the token ids
    other than `exclude` (pass the tokenizer's special tokens), with a generator seeded by `seed`.

    periods default: default_periods(model.cfg.n_ctx), i.e. every period from 4 to half the context.
    """
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
    for p in periods:
        tokens = repeated_random_tokens(batch, p, cfg.d_vocab, gen, exclude=exclude).to(device)
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        losses = lm_loss(logits[:, :-1].float(), tokens[:, 1:], per_token=True)  # [batch, 2p - 1]; i predicts i + 1
        scores.append(torch.nan_to_num(detect_heads(cache, tokens)["induction"]).float().cpu())
        first.append(losses[:, : p - 1].mean().item())
        second.append(losses[:, p:].mean().item())
    return PeriodSweep(periods, torch.stack(scores), torch.tensor(first), torch.tensor(second), batch)


# ---------------------------------------------------------------------------- classification

# Detector thresholds (share of attention) and normalised-entropy cut-offs; override per call.
THRESHOLDS = {"previous_token": 0.4, "current_token": 0.4, "first_token": 0.5, "duplicate_token": 0.3,
              "induction": 0.4, "copying": 0.5, "low_entropy": 0.3, "diffuse": 0.8}


@dataclass
class Evidence:
    """One check behind a label: `value` compared with `threshold` (above, unless `below`)."""

    name: str
    value: float
    threshold: float
    below: bool = False

    @property
    def passed(self) -> bool:
        return self.value <= self.threshold if self.below else self.value >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.name, "value": round(self.value, 6), "threshold": round(self.threshold, 6),
                "passed": self.passed}

    def __str__(self) -> str:
        rel = "<=" if self.below else ">="
        mark = "ok" if self.passed else "FAILS"
        return f"{self.name} {self.value:.3f} ({mark}: {rel} {self.threshold:.3f})"


@dataclass
class HeadLabel:
    """A label of head (layer, head) with the checks behind it; assigned when all pass."""

    layer: int
    head: int
    label: str
    evidence: list[Evidence]

    @property
    def assigned(self) -> bool:
        return all(e.passed for e in self.evidence)

    @property
    def name(self) -> str:
        return head_name(self.layer, self.head)

    def to_dict(self) -> dict[str, Any]:
        return {"head": self.name, "layer": self.layer, "index": self.head, "label": self.label,
                "assigned": self.assigned, "evidence": [e.to_dict() for e in self.evidence]}

    def __str__(self) -> str:
        return f"{self.name} {self.label}: " + "; ".join(str(e) for e in self.evidence)


@dataclass
class HeadClasses:
    """Labels of every head. `labels` holds the assigned ones; `rejected` the heads that passed some
    induction test but not all its checks (e.g. an induction-like pattern at one period only, as a
    head attending a fixed distance back shows, or with no previous-token head to compose with)."""

    labels: list[HeadLabel]
    rejected: list[HeadLabel]
    scores: HeadScores
    copying: CopyingScores
    composition: CompositionScores | None
    thresholds: dict[str, float] = field(default_factory=dict)
    periods: PeriodSweep | None = None  # the induction test [r, r] at a short and the longest period

    def labels_of(self, layer: int, head: int) -> list[str]:
        return [lab.label for lab in self.labels if (lab.layer, lab.head) == (layer, head)]

    def heads_with(self, label: str) -> list[tuple[int, int]]:
        return [(lab.layer, lab.head) for lab in self.labels if lab.label == label]

    def summary(self) -> list[str]:
        return [str(lab) for lab in self.labels] + [f"not assigned: {lab}" for lab in self.rejected]

    def to_dict(self) -> dict[str, Any]:
        return {"labels": [lab.to_dict() for lab in self.labels],
                "rejected": [lab.to_dict() for lab in self.rejected],
                "scores": self.scores.to_dict(), "copying": self.copying.to_dict(),
                "composition": self.composition.to_dict() if self.composition is not None else None,
                "thresholds": dict(self.thresholds),
                "periods": self.periods.to_dict() if self.periods is not None else None}


@torch.no_grad()
def classify_heads(model, tokens: torch.Tensor | None = None, thresholds: dict[str, float] | None = None,
                   seed: int = 0, batch: int = 16, seq_len: int | None = None) -> HeadClasses:
    """Label every head from its behaviour on tokens [batch, pos] and from the weights.

    tokens default: induction_test_tokens(batch, seq_len) with generator seed; seq_len default
    min(n_ctx, 64). The [r, r] tests use seq_len default min(n_ctx, 256): the whole context of small models.
    Each label is checked on its own (a head may carry several):

    - previous-token / current-token / first-token / duplicate-token: detector score >= threshold;
    - induction: induction score >= threshold on tokens AND on [r, r] at a short and at the longest
      period (detector_periods: seq_len // 8 and seq_len // 2, 8 and 32 for a context of 64; a head
      that attends a fixed distance back passes at one period at most), AND a positive copying score
      (its OV circuit raises the attended token's logit), AND K-composition above the random baseline
      (mean + 3 std) with an earlier head labelled previous-token;
    - copying: copying score >= threshold (weights only);
    - low-entropy / diffuse: normalised attention entropy <= / >= its cut-off.

    Weight evidence is computed on fold_layer_norm(model) when the model has norms (a copy; the
    model is not changed).
    """
    unknown = set(thresholds or {}) - set(THRESHOLDS)
    if unknown:
        raise CircuitlabError(f"unknown threshold(s) {', '.join(sorted(unknown))}; known: {', '.join(THRESHOLDS)}")
    th = {**THRESHOLDS, **(thresholds or {})}
    cfg = model.cfg
    if cfg.n_layers == 0:
        raise CircuitlabError("this model has no layers, so no attention heads to classify")
    if tokens is None:
        gen = torch.Generator().manual_seed(seed)
        tokens = induction_test_tokens(batch, seq_len or min(cfg.n_ctx, 64), cfg.d_vocab, gen)
    device = model_device(model)
    tokens = (tokens[None] if tokens.dim() == 1 else tokens).to(device)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    scores = detect_heads(cache, tokens)
    periods = induction_by_period(model, detector_periods(seq_len or min(cfg.n_ctx, 256)), batch, seed)

    folded = weights_model(model)
    copying = copying_scores(folded, th["copying"])
    composition = composition_scores(folded) if cfg.n_layers > 1 else None

    labels: list[HeadLabel] = []
    rejected: list[HeadLabel] = []
    behaviour = {"previous_token": "previous-token", "current_token": "current-token",
                 "first_token": "first-token", "duplicate_token": "duplicate-token"}
    prev_heads = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)
                  if float(scores["previous_token"][l, h]) >= th["previous_token"]]
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            candidates = [HeadLabel(layer, head, label, [_score_evidence(scores, key, layer, head, th)])
                          for key, label in behaviour.items()]
            candidates.append(_induction_label(layer, head, scores, periods, copying, composition, prev_heads, th))
            candidates.append(HeadLabel(layer, head, "copying",
                                        [Evidence("copying score", float(copying.scores[layer, head]),
                                                  th["copying"])]))
            entropy = float(scores["entropy"][layer, head])
            candidates.append(HeadLabel(layer, head, "low-entropy",
                                        [Evidence("attention entropy", entropy, th["low_entropy"], below=True)]))
            candidates.append(HeadLabel(layer, head, "diffuse",
                                        [Evidence("attention entropy", entropy, th["diffuse"])]))
            for cand in candidates:
                if cand.assigned:
                    labels.append(cand)
                elif cand.label == "induction" and any(e.passed for e in cand.evidence[:1 + len(periods.periods)]):
                    rejected.append(cand)  # attends like one somewhere, but not at every period or not by its weights
    return HeadClasses(labels, rejected, scores, copying, composition, th, periods)


def _score_evidence(scores: HeadScores, key: str, layer: int, head: int, th: dict[str, float]) -> Evidence:
    value = float(torch.nan_to_num(scores[key][layer, head], nan=0.0))
    return Evidence(f"{key.replace('_', '-')} score", value, th[key])


def detector_periods(seq_len: int) -> list[int]:
    """The periods of classify_heads' [r, r] tests: a short one and the longest that fits seq_len."""
    if seq_len < 4:
        raise CircuitlabError(f"the induction test needs sequences of at least 4 tokens, got {seq_len}")
    return sorted({max(2, seq_len // 8), seq_len // 2})


def _induction_label(layer: int, head: int, scores: HeadScores, periods: PeriodSweep, copying: CopyingScores,
                     composition: CompositionScores | None, prev_heads: list[tuple[int, int]],
                     th: dict[str, float]) -> HeadLabel:
    evidence = [_score_evidence(scores, "induction", layer, head, th)]
    evidence += [Evidence(f"induction score on [r, r] with period {p}", float(periods.scores[i, layer, head]),
                          th["induction"]) for i, p in enumerate(periods.periods)]
    evidence.append(Evidence("copying score", float(copying.scores[layer, head]), 1e-6))  # i.e. positive
    earlier = [(l, h) for l, h in prev_heads if l < layer]
    if composition is None or not earlier:
        # Nothing to compose with: a check that fails (scores are at most 1), kept so the reason shows.
        evidence.append(Evidence("K-composition with an earlier previous-token head (none found)", 0.0,
                                 composition.threshold if composition is not None else 1.0))
    else:
        best = max(earlier, key=lambda lh: float(composition.k[lh[0], lh[1], layer, head]))
        evidence.append(Evidence(f"K-composition with previous-token head L{best[0]}H{best[1]}",
                                 float(composition.k[best[0], best[1], layer, head]), composition.threshold))
    return HeadLabel(layer, head, "induction", evidence)


# ---------------------------------------------------------------------------- interactive view


@dataclass
class AttentionPatterns(Displayed):
    """Every head's attention on one sequence: patterns [layer, head, query_pos, key_pos], the token
    strings [pos] and optional labels (head name "L{l}H{h}" -> label). In Jupyter it displays as the
    interactive viewer of the HTML report (choose the head; hover shows query, key and weight)."""

    tokens: list[str]
    patterns: torch.Tensor
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def head_names(self) -> list[str]:
        return [head_name(l, h) for l in range(self.patterns.shape[0]) for h in range(self.patterns.shape[1])]



@torch.no_grad()
def attention_view(model, tokens: torch.Tensor | list[int] | str, tokenizer=None,
                   labels: dict[str, str] | HeadClasses | None = None) -> AttentionPatterns:
    """All attention patterns of model on one sequence, ready to display.

    tokens: [pos] or [1, pos] ids, or text (needs tokenizer, anything with encode/decode); tokenizer
    also names the tokens (else their ids). labels: head name -> label, or a HeadClasses.
    """
    if isinstance(tokens, str):
        if tokenizer is None:
            raise CircuitlabError("attention_view needs a tokenizer to read text")
        tokens = tokenizer.encode(tokens)
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    tokens = one_sequence(model, tokens[..., -model.cfg.n_ctx:], "attention_view")  # the last n_ctx tokens
    _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_pattern"))
    patterns = attention_patterns(cache)[:, 0].float().cpu()  # [layer, head, q, k]
    if isinstance(labels, HeadClasses):
        labels = {head_name(l, h): ", ".join(labels.labels_of(l, h))
                  for l in range(patterns.shape[0]) for h in range(patterns.shape[1]) if labels.labels_of(l, h)}
    ids = tokens.tolist()
    strs = [tokenizer.decode([t]) for t in ids] if tokenizer is not None else [str(t) for t in ids]
    return AttentionPatterns(strs, patterns, dict(labels or {}))
