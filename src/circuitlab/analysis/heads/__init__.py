"""Attention heads labelled from behaviour and weights, and every head's pattern to look at.

    classes = classify_heads(model)                 # behaviour + weights -> labels with evidence
    classes.heads_with("induction")                 # [(1, 2)]
    attention_view(model, tokens, tok, classes)     # every head's pattern, interactive in Jupyter

The package: this module (labels, attention view) over detectors.py (detect_heads, induction_by_period,
...; importable from here too); induction.py (induction scores and the probes `circuitlab train` tracks)
and induction_circuit.py stand on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.analysis.qk_ov import (CompositionScores, CopyingScores, composition_scores,
                                         copying_scores)
from circuitlab.analysis.folding import weights_model
from circuitlab.analysis.heads.detectors import (DETECTORS, MIN_PERIOD, HeadScores, PeriodSweep,  # noqa: F401
                                                attention_entropy, attention_patterns, default_periods,
                                                detect_heads, detection_masks, induction_by_period,
                                                induction_test_tokens, mask_score)
from circuitlab.analysis.patching.checks import one_sequence
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError
from circuitlab.model.assumptions import ASSUMPTIONS, unmet
from circuitlab.model.transformer import model_device
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

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
    # the verdict as written, when read back from JSON: rounding to 6 decimals can make value equal threshold
    written: bool | None = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        if self.written is not None:
            return self.written
        return self.value <= self.threshold if self.below else self.value >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.name, "value": round(self.value, 6), "threshold": round(self.threshold, 6),
                "passed": self.passed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Evidence":
        """to_dict() read back; below (not written) is what makes the written verdict follow from the numbers."""
        value, threshold, passed = d["value"], d["threshold"], bool(d["passed"])
        return cls(d["check"], value, threshold, below=passed != (value >= threshold), written=passed)

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadLabel":
        return cls(d["layer"], d["index"], d["label"], [Evidence.from_dict(e) for e in d["evidence"]])

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
    copying: CopyingScores | None       # None where heads do not add into the stream (weights_unread says why)
    composition: CompositionScores | None
    thresholds: dict[str, float] = field(default_factory=dict)
    periods: PeriodSweep | None = None  # the induction test [r, r] at a short and the longest period
    weights_unread: str | None = None   # why the weight checks were left out (post-norms), else None

    def labels_of(self, layer: int, head: int) -> list[str]:
        return [lab.label for lab in self.labels if (lab.layer, lab.head) == (layer, head)]

    def heads_with(self, label: str) -> list[tuple[int, int]]:
        return [(lab.layer, lab.head) for lab in self.labels if lab.label == label]

    def summary(self) -> list[str]:
        note = [f"weight checks left out (copying score, K-composition): {self.weights_unread}"] if self.weights_unread else []
        return [str(lab) for lab in self.labels] + [f"not assigned: {lab}" for lab in self.rejected] + note

    def to_dict(self) -> dict[str, Any]:
        return {"labels": [lab.to_dict() for lab in self.labels],
                "rejected": [lab.to_dict() for lab in self.rejected],
                "scores": self.scores.to_dict(), "copying": self.copying.to_dict() if self.copying is not None else None,
                "composition": self.composition.to_dict() if self.composition is not None else None,
                "thresholds": dict(self.thresholds),
                "periods": self.periods.to_dict() if self.periods is not None else None,
                "weights_unread": self.weights_unread}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadClasses":
        """to_dict() read back (scores as float64: the written values exactly)."""
        return cls([HeadLabel.from_dict(x) for x in d["labels"]], [HeadLabel.from_dict(x) for x in d["rejected"]],
                   HeadScores.from_dict(d["scores"]),
                   CopyingScores.from_dict(d["copying"]) if d.get("copying") is not None else None,
                   CompositionScores.from_dict(d["composition"]) if d.get("composition") is not None else None,
                   dict(d.get("thresholds") or {}),
                   PeriodSweep.from_dict(d["periods"]) if d.get("periods") is not None else None,
                   d.get("weights_unread"))


@torch.no_grad()
def classify_heads(model: Transformer, tokens: torch.Tensor | None = None, thresholds: dict[str, float] | None = None,
                   seed: int = DEFAULT_SEED, batch: int = 16, seq_len: int | None = None) -> HeadClasses:
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
    model is not changed). Where a head's output does not add into the residual stream by itself (post- or
    sandwich norms: Gemma-2, OLMo-2) its OV circuit is not defined: the weight checks (copying score,
    K-composition) are left out, no head is labelled copying, induction rests on behaviour alone, and
    `weights_unread` says why.
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

    broken = unmet(model, "additive_heads")
    weights_unread = None
    if broken:
        weights_unread = f"this model has {ASSUMPTIONS['additive_heads'][2](cfg)}, so a head's OV circuit is not defined"
        copying = composition = None
    else:
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
            if copying is not None:
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
    return HeadClasses(labels, rejected, scores, copying, composition, th, periods, weights_unread)


def _score_evidence(scores: HeadScores, key: str, layer: int, head: int, th: dict[str, float]) -> Evidence:
    value = float(torch.nan_to_num(scores[key][layer, head], nan=0.0))
    return Evidence(f"{key.replace('_', '-')} score", value, th[key])


def detector_periods(seq_len: int) -> list[int]:
    """The periods of classify_heads' [r, r] tests: a short one and the longest that fits seq_len."""
    if seq_len < 4:
        raise CircuitlabError(f"the induction test needs sequences of at least 4 tokens, got {seq_len}")
    return sorted({max(2, seq_len // 8), seq_len // 2})


def _induction_label(layer: int, head: int, scores: HeadScores, periods: PeriodSweep, copying: CopyingScores | None,
                     composition: CompositionScores | None, prev_heads: list[tuple[int, int]],
                     th: dict[str, float]) -> HeadLabel:
    evidence = [_score_evidence(scores, "induction", layer, head, th)]
    evidence += [Evidence(f"induction score on [r, r] with period {p}", float(periods.scores[i, layer, head]),
                          th["induction"]) for i, p in enumerate(periods.periods)]
    if copying is None:  # no OV circuit to read (post-norms): behaviour alone
        return HeadLabel(layer, head, "induction", evidence)
    evidence.append(Evidence("copying score", float(copying.scores[layer, head]), 1e-6))  # i.e. positive
    earlier = [(l, h) for l, h in prev_heads if l < layer]
    if composition is None or not earlier:
        # Nothing to compose with: a check that fails (scores are at most 1), kept so the reason shows.
        evidence.append(Evidence("K-composition with an earlier previous-token head (none found)", 0.0,
                                 composition.threshold if composition is not None else 1.0))
    else:
        best = max(earlier, key=lambda lh: float(composition.k[lh[0], lh[1], layer, head]))
        evidence.append(Evidence(f"K-composition with previous-token head {head_name(*best)}",
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
def attention_view(model: Transformer, tokens: torch.Tensor | list[int] | str, tokenizer=None,
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
