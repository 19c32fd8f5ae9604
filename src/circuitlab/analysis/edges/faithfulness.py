"""Faithfulness of circuits of growing size, measured by running them.

    curve = faithfulness_curve(model, clean, corrupt, metric, scores)
    curve.faithfulness        # f at 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100 % of the edges
    curve.cpr, curve.cmd      # area under f (higher is better), under |1 - f| (lower is better)
    curve.size_for[0.9]       # fewest edges (top by |score|) recovering 90 % of the gap

f(C) = (m(C) − m(∅)) / (m(M) − m(∅)): m(C) is the metric with every edge outside C patched, m(∅) with
every edge patched, m(M) the full model. The circuit of size n is the top n edges by |score|, unpruned
(as in the MIB benchmark). CPR and CMD are trapezoid areas over the fraction of edges from 0 (f = 0) to 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis._json import rounded
from circuitlab.analysis.edges.circuit import _run_circuits
from circuitlab.analysis.edges.forward import graph_forward
from circuitlab.analysis.edges.scoring import EdgeScores, check_edge_request, reference
from circuitlab.analysis.patching import Metric
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
LEVELS = (0.8, 0.9)


@dataclass
class Faithfulness:
    """fractions [k] of the edges; n_edges [k]; values [k]: m(C); faithfulness [k]: f(C). full_value m(M),
    empty_value m(∅); cpr, cmd: areas; size_for: {level: fewest edges with f >= level, or None}."""

    fractions: list[float]
    n_edges: list[int]
    values: torch.Tensor
    faithfulness: torch.Tensor
    full_value: float
    empty_value: float
    cpr: float
    cmd: float
    size_for: dict[float, int | None] = field(default_factory=dict)
    total_edges: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"fractions": self.fractions, "n_edges": self.n_edges, "values": rounded(self.values),
                "faithfulness": rounded(self.faithfulness), "full_value": round(self.full_value, 6),
                "empty_value": round(self.empty_value, 6), "cpr": round(self.cpr, 6), "cmd": round(self.cmd, 6),
                "size_for": {str(k): v for k, v in self.size_for.items()}, "total_edges": self.total_edges}

    def summary(self) -> str:
        sizes = "; ".join(f"{int(k * 100)}% of the gap needs "
                          + (f"{v} edges ({100 * v / self.total_edges:.3g}%)" if v is not None else "more than all")
                          for k, v in self.size_for.items())
        return f"CPR {self.cpr:.3f} (higher is better), CMD {self.cmd:.3f} (lower is better); {sizes}"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{100 * x:g}%</td><td>{n}</td><td>{float(f):.3f}</td></tr>"
                       for x, n, f in zip(self.fractions, self.n_edges, self.faithfulness))
        return (f"<b>Faithfulness</b>: {self.summary()}<table><tr><th>edges</th><th>n</th><th>f</th></tr>"
                f"{rows}</table>")


def faithfulness_curve(model: Transformer, clean, corrupt, metric: Metric, scores: EdgeScores, *,
                       fractions=FRACTIONS, levels=LEVELS, intervention: str | None = None,
                       batch_size: int | None = None) -> Faithfulness:
    """Run the top-n circuits at each fraction of the edges, and on a finer grid for the sizes that reach
    each level. clean, corrupt [batch, pos]; intervention: default the one the scores were made with."""
    intervention = intervention or scores.intervention
    clean, corrupt = check_edge_request(model, clean, corrupt, metric, "exact", intervention)
    graph, order = scores.graph, scores.order()
    E = graph.n_edges
    sizes = [min(E, max(0, round(f * E))) for f in fractions]
    grid = list(range(E + 1)) if E <= 256 else sorted({0, E, *torch.logspace(0, torch.log10(torch.tensor(E)).item(),
                                                                             64).round().long().tolist()})
    wanted = sorted(set(sizes) | set(grid) | {0, E})

    def top(n: int) -> torch.Tensor:
        keep = torch.zeros(E, dtype=torch.bool)
        keep[order[:n]] = True
        return keep

    with torch.no_grad():
        clean_run = graph_forward(model, graph, clean)
        ref = reference(model, graph, clean, corrupt, intervention, clean_run)
    values = dict(zip(wanted, _run_circuits(model, graph, clean, metric, ref, [top(n) for n in wanted],
                                           batch_size).tolist()))
    full, empty = values[E], values[0]
    if full == empty:
        raise CircuitlabError(f"the metric is {full:.6g} both with the full model and with every edge patched, so "
                              "faithfulness is undefined; choose prompts or a metric that tell them apart")
    f = {n: (v - empty) / (full - empty) for n, v in values.items()}
    xs = [0.0, *[n / E for n in sizes]]
    ys = [0.0, *[f[n] for n in sizes]]
    cpr = sum((xs[i + 1] - xs[i]) * (ys[i + 1] + ys[i]) / 2 for i in range(len(xs) - 1))
    dev = [abs(1 - y) for y in ys]
    cmd = sum((xs[i + 1] - xs[i]) * (dev[i + 1] + dev[i]) / 2 for i in range(len(xs) - 1))
    size_for = {lv: next((n for n in wanted if f[n] >= lv), None) for lv in levels}
    return Faithfulness(list(fractions), sizes, torch.tensor([values[n] for n in sizes], dtype=torch.float64),
                        torch.tensor([f[n] for n in sizes], dtype=torch.float64), full, empty, cpr, cmd, size_for, E)


__all__ = ["FRACTIONS", "Faithfulness", "faithfulness_curve"]
