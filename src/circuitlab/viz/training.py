"""Views of training runs: loss, head scores and in-context learning against tokens seen; induction by period."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from circuitlab.training.phase import best_head_score, phase_band
from circuitlab.viz.figure import FigureSpec, Panel, Rule, Series


def _longest_period(tracked: Sequence[Mapping]) -> str | None:
    """The longest period tracked in "induction_by_period" (keys are periods as strings), if any."""
    periods = {int(p) for r in tracked for p in (r.get("induction_by_period") or {})}
    return str(max(periods)) if periods else None


def training_curves_figure(curves: Mapping[str, Sequence[Mapping]] | Sequence[Mapping],
                           phase_change: Mapping[str, Any] | None = None) -> FigureSpec:
    """Left: train loss, val loss and loss on the repeated half of random sequences; middle: the best
    head's induction and previous-token scores, and the best induction score on [r, r] at the longest
    tracked period; right: the in-context-learning score on natural text (loss late in the context minus
    early: it falls when induction heads form); x: tokens seen.

    curves: run name -> metrics.jsonl records (or one run's records); phase_change: the demo's
    phase_change dict (keys "tokens", "step", ...), or run name -> such a dict: a dashed line on every
    panel inside a shaded band (the best induction score's rise, from the last point below 20% of it to
    the first at 80%)."""
    if not isinstance(curves, Mapping):
        curves = {"run": list(curves)}
    if phase_change is not None and "tokens" in phase_change:
        phase_change = {next(iter(curves), "run"): phase_change}
    phase_change = dict(phase_change or {})
    loss = Panel("Loss", "tokens seen", "loss (nats)")
    scores = Panel("Head scores", "tokens seen", "score", y_range=(0.0, 1.05))
    icl = Panel("In-context learning score", "tokens seen", "late minus early loss (nats)")
    for i, (name, records) in enumerate(curves.items()):
        logged = [r for r in records if "loss" in r]
        if logged:
            loss.series.append(Series([r["tokens"] for r in logged], [r["loss"] for r in logged], f"{name} train loss",
                                      color=i, width=1, opacity=0.5, group=name))
        val = [r for r in records if "val_loss" in r]
        if val:
            loss.series.append(Series([r["tokens"] for r in val], [r["val_loss"] for r in val], f"{name} val loss",
                                      "line+markers", i, "dot", group=name))
        tracked = [r for r in records if "induction" in r]
        if tracked:
            x = [r["tokens"] for r in tracked]
            loss.series.append(Series(x, [r.get("repeat_loss") for r in tracked], f"{name} loss on repeated tokens",
                                      color=i, dash="dash", group=name))
            scores.series.append(Series(x, [best_head_score(r["induction"]) for r in tracked],
                                        f"{name} best induction score", color=i, group=name))
            scores.series.append(Series(x, [best_head_score(r.get("prev_token")) for r in tracked],
                                        f"{name} best previous-token score", color=i, dash="dot", group=name))
            longest = _longest_period(tracked)
            if longest is not None:
                scores.series.append(Series(x, [(r.get("induction_by_period") or {}).get(longest) for r in tracked],
                                            f"{name} best induction score, [r, r] period {longest}", color=i,
                                            dash="dashdot", group=name))
        with_icl = [r for r in records if r.get("icl") is not None]
        if with_icl:
            icl.series.append(Series([r["tokens"] for r in with_icl], [r["icl"] for r in with_icl],
                                     f"{name} in-context learning score", "line+markers", i, group=name))
        pc = phase_change.get(name)
        if pc and pc.get("tokens") is not None:
            band = phase_band(records)
            for panel in (loss, scores, icl):
                if band and band[1] > band[0]:
                    panel.rules.append(Rule(x=band[0], x_to=band[1], color=i))
                label = f"{name} phase change (step {pc.get('step', '?')})" if panel is scores else ""
                panel.rules.append(Rule(x=pc["tokens"], color=i, label=label))
    return FigureSpec([loss, scores, icl], height=450)


def induction_by_period_figure(sweeps: Mapping[str, Mapping[str, Any]], min_score: float = 0.6,
                               max_loss: float = 2.0) -> FigureSpec:
    """sweeps: model name -> PeriodSweep.to_dict(). Left: the best head's induction score on [r, r] by
    period (hover names the head); right: the loss on the first and the second copy; the demo's targets
    as grey dashed lines."""
    score = Panel("Induction score on [r, r] by period", "period of r", "induction score", y_range=(0.0, 1.05),
                  rules=[Rule(y=min_score)])
    loss = Panel("Loss on [r, r] by period", "period of r", "loss (nats)", y_range=(0.0, None),
                 rules=[Rule(y=max_loss)])
    for i, (name, sweep) in enumerate(sweeps.items()):
        score.series.append(Series(sweep["periods"], sweep["best"], f"{name} best head", "line+markers", i,
                                   text=sweep.get("best_head"), group=name))
        loss.series.append(Series(sweep["periods"], sweep["loss_second"], f"{name} loss on the second copy",
                                  "line+markers", i, group=name))
        loss.series.append(Series(sweep["periods"], sweep["loss_first"], f"{name} loss on the first copy", color=i,
                                  dash="dot", group=name))
    return FigureSpec([score, loss], height=400)
