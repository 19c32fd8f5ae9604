"""Report sections from what a run has.

A run contributes a RunData (report/runs.py: model, tokenizer, configs, metrics, head labels); an
analysis contributes the findings of the ready-made experiments in their to_dict() form
(MethodResult.to_dict(), as in results.json), so a report written at the end of a run and one
rebuilt from disk are the same.
build_sections turns them into sections (report/sections.py for what a run has, each method's own section for
its findings: circuitlab.methods), in this order, each only when there is data:

    model card · summary · training curves · heads · induction by period · attention viewer · QK/OV circuits · logit lens ·
    tuned lens · direct logit attribution · input attribution · patching · causal tracing · ablation · probes

Entry points: report_for_run(dir) (a training run, an interpret output or a demo directory),
write_demo_report, write_interpret_report.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.errors import CircuitlabError
from circuitlab.report.html import Section, bullet_list, paragraph, write_html_report
from circuitlab.report.results import DemoFindings, Findings, InterpretResults
from circuitlab.report.runs import RunData, compute_heads, head_rows_from_classes, load_run
from circuitlab.methods import REGISTRY, REPORT_ORDER
from circuitlab.report.sections import (attention_section, circuits_section, heads_section, induction_period_section,
                                        model_card_section, summary_section, training_section)

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def build_sections(runs: Sequence[RunData], analysis: Mapping[str, Any] | None = None, *, analyse: bool = True,
                   view: str | None = None, summary: Sequence[str] | str = ()) -> list[Section]:
    """Sections for the runs and the analysis findings (experiment name -> findings dict).

    analyse: label the heads of runs that have a model but no head rows (classify_heads, about a second
    for small models). view: the run whose attention patterns and circuits are shown (default: the first
    with a model, preferring the deepest).
    """
    analysis = dict(analysis or {})
    runs = list(runs)
    heads, circuits, lens = (_typed(name, analysis) for name in ("heads", "circuits", "logit_lens"))
    for run in runs:
        if run.heads is None and heads is not None and heads.classes is not None and len(runs) == 1:
            run.heads, run.head_scores = head_rows_from_classes(heads.classes)
        if run.heads is None and analyse:
            compute_heads(run)
    with_model = [r for r in runs if r.model is not None]
    shown = next((r for r in runs if r.name == view), None) if view else None
    if shown is None and with_model:
        shown = max(with_model, key=lambda r: r.model.cfg.n_layers)
    prompt = lens.prompt if lens is not None else None
    if heads is not None and heads.induction_by_period and len(runs) == 1:
        runs[0].period_sweep = runs[0].period_sweep or heads.induction_by_period
    sections = [model_card_section(runs), summary_section(summary), training_section(runs), heads_section(runs),
                induction_period_section(runs)]
    if heads is not None and heads.summary:
        sections.append(Section("head-findings", "Head findings", [bullet_list(heads.summary)]))
    if shown is not None:
        sections.append(attention_section(shown))
        sections.append(circuits_section(shown, circuits, prompt))
    for name in REPORT_ORDER:   # each method's section, from its typed result read back
        found = analysis.get(name)
        if isinstance(found, Mapping) and found:
            try:
                sections.append(REGISTRY[name].report_section(found))
            except (KeyError, TypeError, IndexError, ValueError) as e:  # an older or partial results.json
                sections.append(Section(name.replace("_", "-"), name.replace("_", " ").capitalize(),
                                        [bullet_list(Findings.of(found).summary),
                                         paragraph(f"(figure unavailable: {type(e).__name__}: {e})")]))
    return [s for s in sections if s is not None]


def _typed(name: str, analysis: Mapping[str, Any]) -> Any:
    """The method's typed result read back from its results.json entry, or None (absent, or an older layout)."""
    found = analysis.get(name)
    if not isinstance(found, Mapping) or not found:
        return None
    try:
        return REGISTRY[name].result.from_dict(dict(found))
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- entry points


def write_demo_report(out: str | Path, results: DemoFindings | Mapping[str, Any],
                      runs: Mapping[str, RunData] | None = None, run_dir: str | Path | None = None) -> Path:
    """out/report.html for the demo: both models' cards and curves, head tables, the 2-layer model's
    attention viewer and circuits, and the analyses in results["analysis"].

    results: DemoResult.to_dict() (results.json); runs: name -> RunData (the demo passes its models and
    their HeadClasses); default: loaded from run_dir/<name> (run_dir defaults to out), heads labelled again.
    """
    from circuitlab.report.markdown import demo_narrative

    results = DemoFindings.of(results)
    out = Path(out)
    run_dir = Path(run_dir) if run_dir is not None else out
    data = []
    for name, found in results.models.items():
        run = (runs or {}).get(name) or load_run(run_dir / name, name)
        run.name = name
        run.phase_change = found.phase_change.to_dict() if found.phase_change is not None else None
        run.period_sweep = found.induction_by_period.to_dict() if found.induction_by_period is not None else None
        if run.classes is not None:
            run.heads, run.head_scores = head_rows_from_classes(run.classes)
        else:
            compute_heads(run)
        run.steps = found.steps if found.steps is not None else run.steps
        run.tokens_seen = found.tokens_seen if found.tokens_seen is not None else run.tokens_seen
        run.facts.update({"final train loss": found.final_train_loss, "best val loss": found.best_val_loss,
                          "loss on repeated random tokens": found.repeat_loss,
                          "induction heads": ", ".join(found.induction_heads) or "none",
                          "previous-token heads": ", ".join(found.previous_token_heads) or "none",
                          "training time (s)": found.train_seconds})
        data.append(run)
    summary = "\n".join(demo_narrative(results))
    sections = build_sections(data, results.analysis, analyse=False, view="2l", summary=summary)
    return write_html_report(out, sections, "circuitlab demo: induction heads",
                             "a 2-layer and a 1-layer attention-only transformer")


def write_interpret_report(out: str | Path, results: InterpretResults | Mapping[str, Any],
                           model: Transformer | None = None, tokenizer=None) -> Path:
    """out/report.html for `circuitlab interpret`: the checkpoint's card (and its run's training curves,
    when the checkpoint sits in a run directory) and a section per experiment."""
    results = InterpretResults.of(results)
    ckpt = Path(results.checkpoint)
    name = ckpt.parent.name if ckpt.name in ("checkpoint", "best") else ckpt.name
    if ckpt.exists():
        run = load_run(ckpt, name, model=model, tokenizer=tokenizer, load_model=model is None)
    else:
        run = RunData(name or "model", model=model, tokenizer=tokenizer,
                      model_config=model.cfg.to_dict() if model is not None else results.model)
    analysis = {k: v for k, v in results.entries.items() if isinstance(v, Mapping)}
    sections = build_sections([run], analysis, analyse="heads" not in analysis)
    return write_html_report(out, sections, f"circuitlab interpret: {name or 'model'}",
                             f"experiments: {', '.join(results.experiments)}")


def report_for_run(run_dir: str | Path, out: str | Path | None = None, *, analyse: bool = True,
                   title: str | None = None, model: Transformer | None = None, tokenizer=None) -> Path:
    """Write report.html for a directory: a training run (checkpoint, metrics.jsonl), the output of
    `circuitlab interpret` or of the demo (results.json). out: a directory or .html path (default run_dir).

    analyse: for a training run, label the heads and show attention and circuits from the checkpoint
    (a few seconds for small models); False keeps to what the directory holds. model, tokenizer: the
    run's, when the caller holds them already (saves loading the checkpoint again).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CircuitlabError(f"no such run directory: {run_dir}")
    out = Path(out) if out is not None else run_dir
    results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").is_file() else {}
    if "models" in results and "analysis" in results:
        return write_demo_report(out, results, run_dir=run_dir)
    if "experiments" in results and "checkpoint" in results:
        return write_interpret_report(out, InterpretResults.from_dict(results))
    run = load_run(run_dir, model=model, tokenizer=tokenizer, load_model=analyse)
    if run.model_config is None and not run.metrics:
        raise CircuitlabError(f"{run_dir} holds no checkpoint, metrics.jsonl or results.json to report on")
    sections = build_sections([run], results if results else None, analyse=analyse)
    rc = run.run_config or {}
    return write_html_report(out, sections, title or f"circuitlab run: {rc.get('name') or run.name}",
                             rc.get("description") or "")
