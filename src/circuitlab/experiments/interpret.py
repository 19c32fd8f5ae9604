"""Run named analyses on a checkpoint: the engine behind `circuitlab interpret` and the demo report.

Experiments come from circuitlab.experiments.interpret_circuits (circuits, heads, logit_lens,
attribution) and circuitlab.experiments.interpret_causal (patching, ablation, probing).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from circuitlab.errors import CircuitlabError


def available_experiments() -> dict[str, Callable[..., dict]]:
    from circuitlab.experiments import interpret_causal, interpret_circuits

    table: dict[str, Callable[..., dict]] = {}
    for name, fn in interpret_circuits.EXPERIMENTS.items():
        table[name] = lambda model, tok, out, opts, fn=fn: fn(model, tok, out, opts.get("prompt"))
    for name, fn in interpret_causal.EXPERIMENTS.items():
        table[name] = lambda model, tok, out, opts, fn=fn: fn(model, tok, out, opts.get("clean"), opts.get("corrupt"))
    return table


def run_interpret(checkpoint: str | Path, out: str | Path, experiments: list[str] | None = None,
                  **opts: Any) -> dict[str, Any]:
    """Run experiments (default: all) on a checkpoint; writes out/results.json, out/report.md and
    out/report.html (interactive, self-contained)."""
    from circuitlab.training import load_checkpoint

    table = available_experiments()
    names = experiments or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise CircuitlabError(f"unknown experiment(s) {', '.join(unknown)}; available: {', '.join(table)}")
    if bool(opts.get("clean")) != bool(opts.get("corrupt")):
        raise CircuitlabError("--clean and --corrupt go together: give both or neither")
    model, tokenizer, meta = load_checkpoint(checkpoint)
    if tokenizer is None:
        raise CircuitlabError(f"{checkpoint} has no tokenizer saved with it")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"checkpoint": str(checkpoint), "experiments": names, "model": model.cfg.to_dict()}
    for name in names:
        results[name] = table[name](model, tokenizer, out, opts)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "report.md").write_text(_report(results))
    from circuitlab.report import write_interpret_report

    write_interpret_report(out, results, model, tokenizer)  # out/report.html
    return results


def _report(results: dict[str, Any]) -> str:
    lines = [f"# circuitlab interpret: {results['checkpoint']}", ""]
    for name in results["experiments"]:
        found = results[name]
        lines += [f"## {name}", ""]
        summary = found.get("summary") if isinstance(found, dict) else None
        if summary:
            lines += [summary if isinstance(summary, str) else "\n".join(f"- {s}" for s in summary), ""]
        for fig in (found.get("figures", []) if isinstance(found, dict) else []):
            fig = fig if isinstance(fig, str) else fig.get("file", "")
            lines.append(f"![{name}]({fig})")
        lines.append("")
    return "\n".join(lines)
