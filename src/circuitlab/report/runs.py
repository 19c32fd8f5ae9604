"""What a run contributes to the report: RunData (model, tokenizer, configs, metrics, head rows) read
from a run directory, and the head rows from a HeadClasses."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.analysis._json import rounded
from circuitlab.errors import CircuitlabError
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.analysis.heads import Evidence, HeadClasses
    from circuitlab.model import Transformer

SCORE_COLUMNS = ("induction", "previous-token", "duplicate-token", "first-token", "current-token", "copying",
                 "entropy")


@dataclass
class RunData:
    """What one model contributes to a report; everything but name is optional.

    heads: rows {"head": "L1H0", "labels": [...], "scores": {column: value}, "evidence": [str]};
    head_scores: detector -> [layer][head] (for the heatmap); classes: the HeadClasses when the
    report labelled the heads itself (their copying and composition scores feed the circuits section).
    """

    name: str
    model: Any = None
    tokenizer: Any = None
    model_config: dict | None = None
    run_config: dict | None = None
    metrics: list[dict] = field(default_factory=list)
    phase_change: dict | None = None
    tokens_seen: int | None = None
    steps: int | None = None
    checkpoint: str | None = None
    heads: list[dict] | None = None
    head_scores: dict[str, Any] | None = None
    classes: Any = None
    facts: dict[str, Any] = field(default_factory=dict)  # more model-card rows
    period_sweep: dict | None = None  # PeriodSweep.to_dict(): the induction test [r, r] at every period
    unlabelled: str | None = None  # why the report left the heads unlabelled (compute_heads on a large model)


def load_run(run_dir: str | Path, name: str | None = None, model: Transformer | None = None, tokenizer=None,
             load_model: bool = True) -> RunData:
    """A run directory (or checkpoint directory) as RunData: metrics.jsonl, the checkpoint's config and
    training state, and (unless model is given or load_model is False) the model and tokenizer."""
    from circuitlab.training import (find_checkpoint, load_checkpoint, read_checkpoint_meta, read_metrics,
                                     read_trainer_state)

    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    if not metrics and run_dir.name in ("checkpoint", "best"):
        metrics = read_metrics(run_dir.parent)
    run = RunData(name or run_dir.name, model=model, tokenizer=tokenizer, metrics=metrics)
    try:
        ckpt = find_checkpoint(run_dir)
    except CircuitlabError:
        ckpt = None
    if ckpt is not None:
        run.checkpoint = str(ckpt)
        meta = read_checkpoint_meta(ckpt)
        run.model_config, run.run_config = meta.get("model"), meta.get("run") or None
        state = read_trainer_state(ckpt)
        if state is not None:
            run.steps, run.tokens_seen = state.get("step"), state.get("tokens_seen")
        if model is None and load_model:
            run.model, loaded_tok, _ = load_checkpoint(ckpt)
            run.tokenizer = tokenizer if tokenizer is not None else loaded_tok
    if run.model is not None and run.model_config is None:
        run.model_config = run.model.cfg.to_dict()
    if metrics:
        last = metrics[-1]
        run.steps = run.steps if run.steps is not None else last.get("step")
        run.tokens_seen = run.tokens_seen if run.tokens_seen is not None else last.get("tokens")
    return run


# ---------------------------------------------------------------------------- head rows


def _evidence_text(e: Evidence) -> str:
    mark = "ok" if e.passed else "fails"
    return f"{e.name} {round(e.value, 6):.3f} (threshold {round(e.threshold, 6):.3f}: {mark})"  # as results.json


def head_rows_from_classes(classes: HeadClasses) -> tuple[list[dict], dict[str, Any]]:
    """Rows and detector scores ({detector: [layer][head]}, the values results.json holds) from a HeadClasses."""
    scores = {k: rounded(v) for k, v in classes.scores.scores.items()}
    copying = rounded(classes.copying.scores) if classes.copying is not None else None
    first = next(iter(scores.values()))
    n_layers, n_heads = len(first), len(first[0]) if first else 0
    rows = []
    for l in range(n_layers):
        for h in range(n_heads):
            name = head_name(l, h)
            row_scores = {k.replace("_", "-"): scores[k][l][h] for k in scores}
            if copying is not None:
                row_scores["copying"] = copying[l][h]
            labels = [lab for lab in classes.labels if lab.name == name]
            rejected = [lab for lab in classes.rejected if lab.name == name]
            evidence = [f"{lab.label}: " + "; ".join(_evidence_text(e) for e in lab.evidence)
                        for lab in labels if lab.label not in ("low-entropy", "diffuse")]
            evidence += [f"not {lab.label}: " + "; ".join(_evidence_text(e) for e in lab.evidence)
                         for lab in rejected]
            rows.append({"head": name, "labels": [lab.label for lab in labels], "scores": row_scores,
                         "evidence": evidence})
    return rows, scores


# The report labels a model's heads itself (classify_heads: behaviour, the [r, r] test, copying and every
# layer pair's composition) only up to this many: about a second for the small models, but some 200 s of a
# report's 220 s for SmolLM2-135M's 270 heads on a loaded 2-core machine. Above it, the heads experiment does it.
MOST_HEADS_LABELLED = 64


def compute_heads(run: RunData) -> None:
    """Label run.model's heads (classify_heads on tiled random tokens) into run.heads / run.head_scores;
    above MOST_HEADS_LABELLED heads, leave them and say why in run.unlabelled."""
    from circuitlab.analysis.heads import classify_heads

    if run.model is None or run.model.cfg.n_layers == 0:
        return
    n = run.model.cfg.n_layers * run.model.cfg.n_heads
    if n > MOST_HEADS_LABELLED:
        run.unlabelled = (f"{run.name}'s {n} heads are not labelled here: the report labels at most "
                          f"{MOST_HEADS_LABELLED} itself (classify_heads takes minutes at this size). Run the heads "
                          "experiment (`circuitlab interpret --experiments heads`) for the labels, the detector "
                          "scores and the induction test; `--experiments circuits` for the induction circuit.")
        return
    run.classes = classify_heads(run.model)
    run.heads, run.head_scores = head_rows_from_classes(run.classes)


def labels_by_head(run: RunData) -> dict[str, str]:
    return {r["head"]: ", ".join(r["labels"]) for r in run.heads or [] if r["labels"]}
