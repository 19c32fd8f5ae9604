"""report/ reads results as typed objects: a results file is parsed once, at the boundary (from_dict), and the
sections read attributes. This scan fails when a string-keyed read of a result (x["key"], x.get("key")) comes
back into report/."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

import circuitlab

REPORT = Path(circuitlab.__file__).resolve().parent / "report"

# Mappings that are not results, by the name report/ gives them: a run's configs (rc, cfg, train, meta, state:
# the checkpoint's run/model config and trainer state), a metrics.jsonl row (last), and the rows report/ builds
# for itself (facts: model-card rows; row, r, row_scores: head-table rows).
NOT_RESULTS = {"rc", "cfg", "train", "meta", "state", "last", "facts", "row", "r", "row_scores"}

# Functions that still read a result by key, each with why; remove an entry when its function is typed (the
# test fails on an entry with no such read left, so this list only shrinks).
NOT_YET: set[str] = set()


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


def _json(d: dict) -> dict:
    return json.loads(json.dumps(d))   # as a results file holds it


def test_head_classes_read_back_exactly_and_give_the_same_head_rows():
    """HeadClasses (with its scores, labels and evidence, copying, composition, period sweep) round-trips through
    its JSON, and the report's head rows from the object and from its JSON read back are the same."""
    from circuitlab.analysis.heads import HeadClasses, classify_heads
    from circuitlab.forge import build_induction_model
    from circuitlab.report.runs import head_rows_from_classes

    classes = classify_heads(build_induction_model(d_vocab=20, n_ctx=32).model)
    assert classes.heads_with("induction") == [(1, 0)] and classes.rejected is not None
    stored = _json(classes.to_dict())
    back = HeadClasses.from_dict(stored)
    assert _json(back.to_dict()) == stored
    assert back.heads_with("induction") == [(1, 0)] and back.periods is not None
    rows = head_rows_from_classes(classes)
    assert head_rows_from_classes(back) == rows
    assert any("threshold" in e for row in rows[0] for e in row["evidence"])


def test_evidence_keeps_its_written_verdict():
    """Rounded to 6 decimals, a failing check can read value == threshold: the written verdict stays."""
    from circuitlab.analysis.heads import Evidence

    for e in (Evidence("x", 0.3999999996, 0.4), Evidence("y", 0.2, 0.4, below=True), Evidence("z", 0.5, 0.4, True)):
        back = Evidence.from_dict(_json(e.to_dict()))
        assert back.passed == e.passed and back.to_dict() == e.to_dict()
        assert Evidence.from_dict({**e.to_dict(), "value": 0.9, "passed": True}).below is False


def test_scores_read_back_exactly():
    from circuitlab.analysis.qk_ov import CompositionScores, CopyingScores

    copying = CopyingScores(torch.tensor([[0.25, -0.123456789], [1.0, 0.5]]))
    assert _json(CopyingScores.from_dict(_json(copying.to_dict())).to_dict()) == _json(copying.to_dict())
    k = torch.full((2, 2, 2, 2), float("nan"))
    k[0, :, 1, :] = torch.tensor([[0.5, 0.125], [0.0625, 0.3333333]])
    comp = CompositionScores(k * 0.5, k, k * 2, 0.125, 0.0625, 7)
    stored = _json(comp.to_dict())
    back = CompositionScores.from_dict(stored)
    assert _json(back.to_dict()) == stored and back.k.dtype == torch.float64
    assert torch.equal(back.k.isnan(), k.isnan()) and back.top("k") == [(a, b, round(s, 6)) for a, b, s in comp.top("k")]


def test_report_forms_read_back():
    from circuitlab.report.results import Findings, InterpretResults, SteeringFindings

    assert Findings.of({"summary": ["a"], "figures": ["x.png", {"file": "y.png"}], "other": 1}).figures == [
        "x.png", "y.png"]
    assert Findings.of(None).summary == [] and Findings.of({"summary": "one line"}).summary == "one line"
    sweep = {"coefs": [0.0, 1.0], "preference": [0.0, 0.5], "neutral_loss": [3.0, 3.25], "neutral_cost": [0.0, 0.25],
             "unsteered_neutral_loss": 3.0, "vector": {"hook_name": "blocks.1.hook_resid_pre", "source": "contrast",
                                                       "norm": 1.5, "n_positive": 2, "n_negative": 3, "last_only": False},
             "metric": None, "metric_name": None, "prompt": "Once", "generations": {"0.0": ["a"], "1.0": ["b"]}}
    found = SteeringFindings.from_dict(sweep)
    assert found.vector.n_negative == 3 and found.generations["1.0"] == ["b"] and SteeringFindings.of(found) is found
    results = InterpretResults.from_dict({"checkpoint": "runs/x/checkpoint", "experiments": ["heads"], "model": {},
                                          "skipped": {"probing": "why"}, "heads": {"summary": ["s"]}, "stray": {}})
    assert results.entries == {"heads": {"summary": ["s"]}} and results.skipped == {"probing": "why"}


def test_demo_findings_read_partial_and_full_entries():
    """The demo's results.json reads back typed: a full phase change round-trips, partial model entries (as tests
    pass them) read as empty, an empty phase change as None, unknown keys are ignored."""
    from circuitlab.report.results import DemoFindings
    from circuitlab.training.phase import PhaseChange

    pc = {"step": 4, "tokens": 64, "induction_before": 0.1, "induction_after": 0.9, "repeat_loss_before": 5.0,
          "repeat_loss_after": 1.0, "icl_before": None, "icl_after": None}
    found = DemoFindings.from_dict({"models": {"2l": {"steps": 6, "phase_change": pc, "heads": [{"induction_score": 0.5}]},
                                               "1l": {"phase_change": {}}},
                                    "causal_evidence": {"ablation": {"heads": ["L1H0"], "repeated_loss": [1, 2],
                                                                     "first_half_loss": [3, 3], "extra": 1}}})
    two, one = found.model("2l"), found.model("1l")
    assert two is not None and one is not None and found.model("3l") is None
    assert two.phase_change == PhaseChange.from_dict(pc) and two.phase_change.to_dict() == pc
    assert two.heads[0].induction_score == 0.5 and two.heads[0].labels == [] and two.induction_heads == []
    assert one.phase_change is None and one.induction_by_period is None
    ablation = found.causal_evidence.ablation
    assert ablation is not None and ablation.heads == ["L1H0"] and not found.causal_evidence.empty
    assert DemoFindings.from_dict({}).causal_evidence.empty and DemoFindings.of(found) is found


def test_forge_comparison_reads_nested_entries():
    """`forge compare`'s results read back typed: nested cells, profiles and shares; a missing held-out accuracy
    and training read as None."""
    from circuitlab.report.results import ForgeComparison

    found = ForgeComparison.from_dict({
        "digits": [2, 2], "accuracy": {"hand": {"correct": 9, "total": 10, "accuracy": 0.9}, "trained_heldout": None},
        "ov": {"input": [[{"rank_hand": 1, "rank_other": 2, "digits_vs_eos_baseline": 0.5}]], "output": [],
               "digit_value_share": {"hand": {"L0H0": 0.25}, "trained": {"L0H0": None}}},
        "attention": {"hand": {"L0H0": {"mass": {"EOS": 0.5}, "top_keys": [{"query": "s1", "keys": [["a0", 0.5]]}]}}},
        "example": {"a": 19, "b": 1, "tokens": [1]}})
    assert found.accuracy["hand"] is not None and found.accuracy["hand"].correct == 9
    assert found.accuracy["trained_heldout"] is None and found.training is None
    assert found.ov.input[0][0].digits_vs_eos_baseline == 0.5 and found.ov.digit_value_share.trained == {"L0H0": None}
    assert found.attention["hand"]["L0H0"].top_keys[0].keys == [["a0", 0.5]] and found.example.b == 1
