"""report/ reads results as typed objects: a results file is parsed once, at the boundary (from_dict), and the
sections read attributes. This scan fails when a string-keyed read of a result (x["key"], x.get("key")) comes
back into report/."""
from __future__ import annotations

import ast
from pathlib import Path

import circuitlab

REPORT = Path(circuitlab.__file__).resolve().parent / "report"

# Mappings that are not results, by the name report/ gives them: a run's configs (rc, cfg, train, meta, state:
# the checkpoint's run/model config and trainer state), a metrics.jsonl row (last), and the rows report/ builds
# for itself (facts: model-card rows; row, r, row_scores: head-table rows).
NOT_RESULTS = {"rc", "cfg", "train", "meta", "state", "last", "facts", "row", "r", "row_scores"}

# Functions that still read a result by key, each with why; remove an entry when its function is typed (the
# test fails on an entry with no such read left, so this list only shrinks).
NOT_YET = {
    # the demo's results.json: DemoResult lives in experiments/, above report/; its typed form needs a home here
    "demo_narrative", "contrast_lines", "demo_markdown", "_icl_sentence", "period_lines", "causal_paragraph",
    "write_demo_report",
    # `forge compare`'s results (experiments/forge_compare.py, a plain dict today)
    "forge_compare_markdown",
    # training.phase.phase_change's dict and PeriodSweep.to_dict() held by RunData
    "training_section", "induction_period_section",
    # a feature dashboard's summary() dict
    "dictionary_section",
}


def _root(node: ast.AST) -> str | None:
    """The name a chain of reads starts from: found in found.vector.get("x"), d in (d.get("a") or {})["b"]."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.BoolOp):
            node = node.values[0]
        else:
            return None


def keyed_reads(source: str) -> list[tuple[str, int, str, str]]:
    """(function, line, root name, source) of every x["key"] / x.get("key") read in a module, outside from_dict."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if function == "from_dict":  # the boundary: a results file's JSON parsed into its typed form
            return
        base = None
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)):
            base = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            base = node.func.value
        if base is not None:
            found.append((function, node.lineno, _root(base) or "", ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "")
    return found


def result_reads() -> list[tuple[str, str, int, str]]:
    return [(p.name, fn, line, src) for p in sorted(REPORT.glob("*.py")) for fn, line, root, src in keyed_reads(p.read_text())
            if root not in NOT_RESULTS]


def test_report_reads_no_result_by_key():
    offenders = [f"report/{f}:{line} {fn}: {src}" for f, fn, line, src in result_reads() if fn not in NOT_YET]
    assert not offenders, ("read the typed result's attributes (parse the JSON once with from_dict):\n"
                           + "\n".join(offenders))


def test_not_yet_list_only_shrinks():
    still = {fn for _, fn, _, _ in result_reads()}
    assert not NOT_YET - still, f"typed now, remove from NOT_YET: {sorted(NOT_YET - still)}"


def test_the_scan_sees_reads():
    """The scan catches the forms it is for (else the tests above could not fail)."""
    src = 'def f(found, rc):\n    a = found["x"]\n    b = found.vector.get("y")\n    rc["k"] = 1\n    return rc.get("z")\n'
    assert [(root, s) for _, _, root, s in keyed_reads(src)] == [("found", "found['x']"), ("found", "found.vector.get('y')"), ("rc", "rc.get('z')")]
