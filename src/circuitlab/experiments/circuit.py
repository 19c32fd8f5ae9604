"""`circuitlab circuit`'s files: results.json, report.md, report.html (offline), circuit.svg, scores and circuit
JSON, and the MIB layout, from a CircuitResult (analysis.edges.discovery, re-exported here).

    data = induction_rows(model.cfg.d_vocab)                       # or rows_from_texts(tokenizer, clean, corrupt)
    result = find_circuit(model, data, metric="logit-diff", method="eap-ig")
    write_circuit_outputs(result, "runs/circuit")                  # results.json, report.md, report.html, SVGs
"""
from __future__ import annotations

from pathlib import Path

from circuitlab.analysis.edges.discovery import (INDUCTION_CORRUPTIONS, METRICS, TASKS, CircuitData, CircuitResult,
                                                 find_circuit, induction_rows, make_metric, rows_from_texts)
from circuitlab.analysis.edges.io import save_circuit, save_mib, save_scores
from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.viz.edges import circuit_svg, faithfulness_figure


def write_circuit_outputs(result: CircuitResult, out: str | Path) -> Path:
    """out/results.json, report.md, report.html, circuit.svg, scores.json, circuit.json and, when the graph
    allows, scores_mib.json (the MIB / EAP-IG layout)."""
    from circuitlab.report.html import Section, bullet_list, write_html_report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    svg = circuit_svg(result.circuit)
    atomic_write_text(out / "circuit.svg", svg)
    atomic_write_text(out / "results.json", json_text(result.to_dict(), indent=1))
    atomic_write_text(out / "report.md", result.markdown())
    save_scores(result.scores, out / "scores.json")
    save_circuit(result.circuit, out / "circuit.json")
    if result.scores.graph.n_kv_heads == result.scores.graph.n_heads:
        save_mib(result.scores, out / "scores_mib.json", result.circuit)
    sections = [Section("summary", "Circuit", [bullet_list(result.summary()), f'<div class="figure">{svg}</div>'],
                        intro="Inputs at the bottom, logits on top; edge colour = the reader input (query, key, "
                              "value, MLP, logits), width = |score|, dashed = negative score."),
                Section("faithfulness", "Faithfulness", [faithfulness_figure({result.scores.method: result.curve})],
                        intro="f = (m(C) - m(empty)) / (m(model) - m(empty)) for the top edges by |score|, run with "
                              "every other edge patched.")]
    write_html_report(out, sections, title="circuitlab circuit", subtitle=result.data)
    return out


__all__ = ["CircuitData", "CircuitResult", "INDUCTION_CORRUPTIONS", "METRICS", "TASKS", "find_circuit",
           "induction_rows", "make_metric", "rows_from_texts", "write_circuit_outputs"]
