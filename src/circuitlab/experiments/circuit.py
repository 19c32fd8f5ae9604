"""`circuitlab circuit`'s options and files: CircuitOptions (every flag of the command, declared once:
circuitlab.spec), and results.json, report.md, report.html (offline), circuit.svg, scores and circuit JSON, and the
MIB layout, from a CircuitResult (analysis.edges.discovery, re-exported here).

    data = induction_rows(model.cfg.d_vocab)                       # or rows_from_texts(tokenizer, clean, corrupt)
    result = find_circuit(model, data, metric="logit-diff", method="eap-ig")
    write_circuit_outputs(result, "runs/circuit")                  # results.json, report.md, report.html, SVGs
    add_arguments(parser, CircuitOptions); CircuitOptions.from_args(args)     # the command's flags
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from circuitlab.analysis.edges.discovery import (INDUCTION_CORRUPTIONS, METRICS, TASKS, CircuitData,
                                                 CircuitResult, check_circuit_options, find_circuit, induction_rows,
                                                 make_metric, rows_from_texts)
from circuitlab.analysis.edges.io import save_circuit, save_mib, save_scores
from circuitlab.analysis.edges.options import DiscoveryOptions
from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.spec import Options, option, same
from circuitlab.viz.edges import circuit_svg, faithfulness_figure


@dataclass(frozen=True)
class CircuitOptions(Options):
    """What `circuitlab circuit` takes, declared once: each flag's default, rule and help (find_circuit's
    defaults are analysis.edges': the metric, method, intervention and EAP-IG steps read the same constants).
    The rows: a built-in task, or clean and corrupt prompt files (answers optional). check() adds what no field's
    rule holds: one source of rows, and the metric, method, intervention and refinement in check_circuit_options'
    words (the Python API's too)."""

    checkpoint: str | Path = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    task: str | None = option(None, choices=TASKS, help="built-in rows instead of files: induction = repeated "
                                                        "random tokens")
    corruption: str | None = option(None, help="for --task induction, the corrupted rows: no-repeat (default; other "
                                               "random tokens: the whole circuit), first-copy (only the first copy "
                                               "replaced: the K-composition path) or other-repeat (other tokens "
                                               "repeated: values and outputs only)")
    clean: str | Path | None = option(None, help="file with one clean prompt per line")
    corrupt: str | Path | None = option(None, help="file with one corrupted prompt per line (same token length)")
    answers: str | Path | None = option(None, help="file with one line per row: the answer token, or answer<TAB>wrong "
                                                   "(default: the model's own predictions on the clean / corrupted "
                                                   "prompts)")
    # How the circuit is found: declared by analysis/edges/options.py (the explorer's discovery reads them too)
    metric: str = same(DiscoveryOptions, "metric")
    method: str = same(DiscoveryOptions, "method")
    intervention: str = same(DiscoveryOptions, "intervention")
    steps: int = same(DiscoveryOptions, "steps")
    edges: int | None = same(DiscoveryOptions, "edges")
    threshold: float | None = same(DiscoveryOptions, "threshold")
    greedy: bool = same(DiscoveryOptions, "greedy")
    refine: str | None = same(DiscoveryOptions, "refine")
    out: str | Path | None = option(None, help="output directory (default: <run>/circuit, or <checkpoint>-circuit "
                                               "beside a checkpoint folder); an earlier circuit there is kept, renamed "
                                               "(or replaced with --overwrite)")
    overwrite: bool = option(False, help="replace an earlier circuit in --out instead of keeping it")
    progress: bool = option(True, flag="--no-progress", help="no progress bars (and no estimate before the work)")

    def check(self, error: type[Exception] = InputError) -> CircuitOptions:
        """One line before anything is read, run or moved: where the rows come from, then the metric, method,
        intervention and refinement by name, then every field's rule."""
        if self.task is None and not (self.clean and self.corrupt):
            raise error("give --clean and --corrupt prompt files, or a built-in --task (induction)")
        if self.task is not None and (self.clean or self.corrupt):
            raise error("--task and --clean/--corrupt are alternatives: give one of them")
        if self.corruption is not None and self.task is None:
            raise error("--corruption chooses the built-in task's corrupted rows; with prompt files, the --corrupt "
                        "file is the corruption")
        try:
            check_circuit_options(self.metric, self.method, self.intervention, self.refine or False)
        except CircuitlabError as e:   # a config's error class (from_dict) where one is asked for
            raise error(str(e)) from None
        return super().check(error)


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


__all__ = ["CircuitData", "CircuitOptions", "CircuitResult", "INDUCTION_CORRUPTIONS", "METRICS", "TASKS", "find_circuit",
           "induction_rows", "make_metric", "rows_from_texts", "write_circuit_outputs"]
