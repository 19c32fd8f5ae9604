"""The typed forms report/ reads a results file through: each JSON object is parsed once, here, by from_dict,
and the sections read attributes (tests/contracts/test_report_keys.py keeps string-keyed reads of results out of report/).

    Findings.from_dict(results["logit_lens"]).summary     any method's entry, read loosely (an older or partial
                                                           results.json; interpret's report.md loop)
    InterpretResults.from_dict(results)                   `circuitlab interpret`'s results.json
    SteeringFindings.from_dict(json.load(steering.json))  a `circuitlab steer` sweep as steering.json holds it
    DictionarySummary.from_dict(dash.summary())           a feature dashboard's dictionary-level numbers
    ForgeComparison.from_dict(results)                    `forge compare`'s results.json (summarize_comparison())
    DemoFindings.from_dict(results)                       the demo's results.json (DemoResult.to_dict()), each
                                                           model's findings, heads, phase change, period sweep and
                                                           the causal evidence typed; absent keys read as empty
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from circuitlab.spec import Result
from circuitlab.training.phase import PhaseChange


@dataclass
class Findings(Result):
    """What every method's results.json entry may hold (unknown keys ignored, absent ones empty): summary (one
    sentence per finding, or one string), figures (file names, or {"file": name}), tables (title -> Markdown
    lines)."""

    summary: list[str] | str = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    tables: dict[str, list[str]] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Findings":
        found = super().from_dict(d)
        found.figures = [f if isinstance(f, str) else f.get("file", "") for f in found.figures]
        return found

    @classmethod
    def of(cls, found: Any) -> "Findings":
        """The entry read back; anything but a JSON object reads as empty findings."""
        return cls.from_dict(dict(found)) if isinstance(found, Mapping) else cls()


@dataclass
class InterpretResults(Result):
    """`circuitlab interpret`'s results.json: the checkpoint, the experiments run (in order), each one's entry
    (name -> its to_dict(), read back by its method), the model's config and the methods skipped (name -> why)."""

    checkpoint: str = ""
    experiments: list[str] = field(default_factory=list)
    entries: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    skipped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InterpretResults":
        found = super().from_dict(d)
        found.checkpoint, found.skipped = str(found.checkpoint), dict(found.skipped or {})
        found.entries = {k: d[k] for k in found.experiments if k in d}
        return found

    @classmethod
    def of(cls, results: "InterpretResults | Mapping[str, Any]") -> "InterpretResults":
        return results if isinstance(results, InterpretResults) else cls.from_dict(dict(results))


@dataclass
class SteeringVectorInfo(Result):
    """SteeringVector.to_dict(): where the direction is added, how it was made, its norm, its prompt counts."""

    hook_name: str | None = None
    source: str | None = None
    norm: float | None = None
    n_positive: int | None = None
    n_negative: int | None = None


@dataclass
class SteeringFindings(Result):
    """A coefficient sweep in its JSON form (SteerResult.to_dict(), steering.json): per-coefficient lists
    [coef] as written (rounded), the direction's facts, and the generations ({str(coef): [text, ...]})."""

    coefs: list[float]
    preference: list[float]
    neutral_loss: list[float]
    neutral_cost: list[float]
    vector: SteeringVectorInfo = field(default_factory=SteeringVectorInfo)
    metric: list[float] | None = None
    metric_name: str | None = None
    prompt: str = ""
    generations: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SteeringFindings":
        found = super().from_dict(d)
        found.vector = SteeringVectorInfo.from_dict(dict(d.get("vector") or {}))
        return found

    @classmethod
    def of(cls, found: "SteeringFindings | Mapping[str, Any]") -> "SteeringFindings":
        return found if isinstance(found, SteeringFindings) else cls.from_dict(dict(found))


@dataclass
class PeriodFindings(Result):
    """PeriodSweep.to_dict() as written (rounded): per period [period] the best head's name and score and the
    loss on each copy of [r, r]; scores [period][layer][head]. Kept as written, so the report prints the
    numbers results.json holds."""

    periods: list[int] = field(default_factory=list)
    batch: int | None = None
    best: list[float] = field(default_factory=list)
    best_head: list[str] = field(default_factory=list)
    scores: list[Any] = field(default_factory=list)
    loss_first: list[float] = field(default_factory=list)
    loss_second: list[float] = field(default_factory=list)


@dataclass
class HeadFindings(Result):
    """One row of a demo model's head table: the head's name, place, scores and labels."""

    head: str = ""
    layer: int | None = None
    index: int | None = None
    induction_score: float = 0.0
    prev_token_score: float = 0.0
    copying_score: float = 0.0
    labels: list[str] = field(default_factory=list)


@dataclass
class DemoModelFindings(Result):
    """One demo model's entry in results.json (experiments/demo.py ModelFindings.to_dict()); absent keys read as
    None / empty (tests and older results pass partial entries)."""

    n_layers: int | None = None
    steps: int | None = None
    tokens_seen: int | None = None
    final_train_loss: float | None = None
    best_val_loss: float | None = None
    repeat_loss: float | None = None
    heads: list[HeadFindings] = field(default_factory=list)
    induction_heads: list[str] = field(default_factory=list)
    induction_evidence: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    previous_token_heads: list[str] = field(default_factory=list)
    phase_change: PhaseChange | None = None
    train_seconds: float | None = None
    induction_by_period: PeriodFindings | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DemoModelFindings":
        found = super().from_dict(d)
        found.heads = [HeadFindings.from_dict(dict(h)) for h in d.get("heads") or []]
        found.phase_change = PhaseChange.from_dict(dict(d["phase_change"])) if d.get("phase_change") else None
        sweep = d.get("induction_by_period")
        found.induction_by_period = PeriodFindings.from_dict(dict(sweep)) if sweep else None
        for name in ("induction_heads", "induction_evidence", "rejected", "previous_token_heads"):
            setattr(found, name, list(d.get(name) or []))
        return found


@dataclass
class PathEvidence(Result):
    """Path patching from the previous-token head (sender) into an induction head (receiver): the share of the
    clean - corrupted gap each of its inputs ("q", "k", "v") carries, and the other induction heads."""

    sender: str = ""
    receiver: str = ""
    fraction_of_gap: dict[str, float] = field(default_factory=dict)
    other_induction_heads: list[str] | None = None


@dataclass
class AblationEvidence(Result):
    """Mean-ablating a group of heads: the loss on the repeated half and on the first half of random
    sequences, each [before, after]."""

    heads: list[str] = field(default_factory=list)
    repeated_loss: list[float] = field(default_factory=list)
    first_half_loss: list[float] = field(default_factory=list)


@dataclass
class CausalEvidence(Result):
    """experiments/demo.py causal_evidence(): why patching recoveries are not reported (patching_noise) or each
    labelled head's recovery (head -> fraction), the path patching, the ablation (each None when not run)."""

    patching_noise: str | None = None
    patching_recovery: dict[str, float] | None = None
    path_patching: PathEvidence | None = None
    ablation: AblationEvidence | None = None

    @property
    def empty(self) -> bool:
        """No intervention was reported (causal_evidence() wrote no key)."""
        return all(getattr(self, f.name) is None for f in fields(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CausalEvidence":
        found = super().from_dict(d)
        found.patching_recovery = dict(d["patching_recovery"]) if d.get("patching_recovery") is not None else None
        found.path_patching = PathEvidence.from_dict(dict(d["path_patching"])) if d.get("path_patching") else None
        found.ablation = AblationEvidence.from_dict(dict(d["ablation"])) if d.get("ablation") else None
        return found

    @classmethod
    def of(cls, evidence: "CausalEvidence | Mapping[str, Any] | None") -> "CausalEvidence":
        return evidence if isinstance(evidence, CausalEvidence) else cls.from_dict(dict(evidence or {}))


@dataclass
class DemoFindings(Result):
    """The demo's results.json (DemoResult.to_dict()) read back: each model's findings (name -> entry, in order),
    each analysis's entry (name -> its to_dict(), read by Findings or its method), the causal evidence, the
    figures (title -> file) and the wall-clock seconds."""

    models: dict[str, DemoModelFindings] = field(default_factory=dict)
    analysis: dict[str, Any] = field(default_factory=dict)
    causal_evidence: CausalEvidence = field(default_factory=CausalEvidence)
    figures: dict[str, str] = field(default_factory=dict)
    wall_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DemoFindings":
        found = super().from_dict(d)
        found.models = {k: DemoModelFindings.from_dict(dict(m)) for k, m in (d.get("models") or {}).items()}
        found.analysis = dict(d.get("analysis") or {})
        found.causal_evidence = CausalEvidence.of(d.get("causal_evidence"))
        found.figures = dict(d.get("figures") or {})
        return found

    def model(self, name: str) -> DemoModelFindings | None:
        """One model's findings ("2l", "1l"), or None when the demo did not train it."""
        return self.models.get(name)

    @classmethod
    def of(cls, results: "DemoFindings | Mapping[str, Any]") -> "DemoFindings":
        return results if isinstance(results, DemoFindings) else cls.from_dict(dict(results))


@dataclass
class DictionarySummary(Result):
    """FeatureDashboards.summary(): the hook read, the dictionary's width, the tokens the dashboards saw, the
    features shown, the dead (never fired) and dense (> 10% of tokens) fractions, the median density and the
    dictionary's own facts (None when unknown)."""

    hook_name: str = ""
    d_sae: int = 0
    n_tokens: int = 0
    features_shown: int = 0
    dead_fraction: float = 0.0
    dense_fraction: float = 0.0
    median_density: float = 0.0
    dictionary: dict[str, Any] | None = None


@dataclass
class AdderAccuracy(Result):
    """One adder's answers checked: correct of total (exhaustive or sampled), the share, the first failures."""

    correct: int = 0
    total: int = 0
    accuracy: float = 0.0
    exhaustive: bool | None = None
    failures: list[Any] = field(default_factory=list)


@dataclass
class AdderTraining(Result):
    """How `forge compare`'s trained model was made: reused or trained (seconds), its final losses, steps, seed,
    batch, data source, folder and shape, and the loss floor the unpredictable operand digits set."""

    reused: bool = False
    seconds: float | None = None
    final_loss: float | None = None
    final_val_loss: float | None = None
    steps: int | None = None
    seed: int | None = None
    batch_size: int | None = None
    source: str = ""
    out: str = ""
    model: str = ""
    loss_floor: float = 0.0


@dataclass
class QueryKeys(Result):
    """One answer position's most attended keys: query (its label), keys [[key label, weight], ...]."""

    query: str = ""
    keys: list[list[Any]] = field(default_factory=list)


@dataclass
class HeadAttention(Result):
    """One head's attention profile: mass per key category, the mean top weight, the variability across inputs
    and each query's most attended keys."""

    mass: dict[str, float] = field(default_factory=dict)
    top_weight: float = 0.0
    variability: float = 0.0
    top_keys: list[QueryKeys] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadAttention":
        found = super().from_dict(d)
        found.top_keys = [QueryKeys.from_dict(dict(t)) for t in d.get("top_keys") or []]
        return found


@dataclass
class HeadAgreement(Result):
    """Attention agreement: agreement [hand-built head][trained head] (1 - total variation), both head lists."""

    heads_a: list[str] = field(default_factory=list)
    heads_b: list[str] = field(default_factory=list)
    agreement: list[list[float]] = field(default_factory=list)


@dataclass
class OvCell(Result):
    """One (hand-built head, trained head) pair's OV alignment on one side: ranks, full and top similarity, the
    chance levels, and (input side) what a digits-vs-EOS head would score (None where not measured)."""

    rank_hand: int = 0
    rank_other: int = 0
    similarity: float | None = None
    chance: float | None = None
    top_similarity: float | None = None
    top_chance: float | None = None
    digits_vs_eos_baseline: float | None = None


@dataclass
class DigitValueShare(Result):
    """Each head's share of its digit rows along the digit value (head -> share; None: reads nothing)."""

    hand: dict[str, float | None] = field(default_factory=dict)
    trained: dict[str, float | None] = field(default_factory=dict)


@dataclass
class OvAlignment(Result):
    """OV alignment of every head pair: cells [hand-built head][trained head] on the input and output side, and
    the digit-value shares."""

    input: list[list[OvCell]] = field(default_factory=list)
    output: list[list[OvCell]] = field(default_factory=list)
    digit_value_share: DigitValueShare = field(default_factory=DigitValueShare)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OvAlignment":
        found = super().from_dict(d)
        found.input, found.output = ([[OvCell.from_dict(dict(c)) for c in row] for row in d.get(side) or []]
                                     for side in ("input", "output"))
        found.digit_value_share = DigitValueShare.from_dict(dict(d.get("digit_value_share") or {}))
        return found


@dataclass
class ExampleProblem(Result):
    """The problem the example figure shows: a + b."""

    a: int = 0
    b: int = 0


@dataclass
class ForgeComparison(Result):
    """`forge compare`'s results.json (experiments/forge_compare.py summarize_comparison(), with training and
    figures) as report.md reads it: the digit counts, samples, position labels, key categories, accuracy (name ->
    AdderAccuracy or None), head agreement, OV alignment, attention (model -> head -> profile), the example
    problem, the findings in words and the training."""

    digits: list[int] = field(default_factory=list)
    samples: int = 0
    positions: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    accuracy: dict[str, AdderAccuracy | None] = field(default_factory=dict)
    agreement: HeadAgreement = field(default_factory=HeadAgreement)
    ov: OvAlignment = field(default_factory=OvAlignment)
    attention: dict[str, dict[str, HeadAttention]] = field(default_factory=dict)
    example: ExampleProblem = field(default_factory=ExampleProblem)
    findings: list[str] = field(default_factory=list)
    training: AdderTraining | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ForgeComparison":
        found = super().from_dict(d)
        found.accuracy = {k: AdderAccuracy.from_dict(dict(a)) if a else None for k, a in (d.get("accuracy") or {}).items()}
        found.agreement = HeadAgreement.from_dict(dict(d.get("agreement") or {}))
        found.ov = OvAlignment.from_dict(dict(d.get("ov") or {}))
        found.attention = {model: {h: HeadAttention.from_dict(dict(v)) for h, v in heads.items()}
                           for model, heads in (d.get("attention") or {}).items()}
        found.example = ExampleProblem.from_dict(dict(d.get("example") or {}))
        found.training = AdderTraining.from_dict(dict(d["training"])) if d.get("training") else None
        return found

    @classmethod
    def of(cls, results: "ForgeComparison | Mapping[str, Any]") -> "ForgeComparison":
        return results if isinstance(results, ForgeComparison) else cls.from_dict(dict(results))
