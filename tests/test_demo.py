"""The demo end to end on a tiny budget, and the causal-evidence summary it writes."""
import json
import re

import pytest

from circuitlab.experiments.demo import DemoOptions, causal_evidence, run_demo
from circuitlab.report.markdown import causal_paragraph


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    run_demo(DemoOptions(out=out, steps_2l=12, steps_1l=4, progress=False))
    return out


def test_demo_writes_checkpoints_results_figures_and_report(demo_dir):
    for name in ("2l", "1l"):
        assert (demo_dir / name / "checkpoint").is_dir()
        assert (demo_dir / name / "metrics.jsonl").stat().st_size > 0
    results = json.loads((demo_dir / "results.json").read_text())
    two, one = results["models"]["2l"], results["models"]["1l"]
    assert (two["n_layers"], one["n_layers"]) == (2, 1)
    assert len(two["heads"]) == 2 * len(one["heads"]) and {"induction_score", "labels"} <= set(two["heads"][0])
    assert {"circuits", "logit_lens", "patching", "ablation"} <= set(results["analysis"])
    assert "causal_evidence" in results
    for fname in results["figures"].values():
        assert (demo_dir / fname).is_file(), fname
    report = (demo_dir / "report.md").read_text()
    assert "## Heads" in report and "**Contrast.**" in report
    html = (demo_dir / "report.html").read_text()
    sections = re.findall(r'<section id="([^"]+)"', html)
    assert sections == ["model-card", "summary", "training", "heads", "induction-by-period", "attention", "circuits",
                        "logit-lens", "patching", "ablation"]
    assert "## Induction by period" in report and "| 32 | " in report  # every period 4..n_ctx/2, both models
    sweep = two["induction_by_period"]
    assert sweep["periods"] == list(range(4, 33)) and len(sweep["best"]) == 29
    wall = results["wall_seconds"]
    rounding = 0.05 + 0.05 * (wall["gflops"] + wall["total"]) / 150  # each of the three is rounded to 0.1
    assert wall["gflops"] > 0 and wall["total_at_150_gflops"] == pytest.approx(wall["total"] * wall["gflops"] / 150,
                                                                                abs=rounding + 1e-9)
    records = [json.loads(line) for line in (demo_dir / "2l" / "metrics.jsonl").read_text().splitlines()]
    assert {"icl", "induction_by_period", "repeat_loss_by_period"} <= set(records[0])
    assert "<script src" not in html and html.count("Plotly.newPlot") >= 5


def test_causal_evidence_reads_recovery_paths_and_ablation():
    found = {"induction_heads": ["L1H0", "L1H1"], "previous_token_heads": ["L0H2"]}
    head_out = {"clean_value": -1.0, "corrupt_value": -5.0,
                "values": [[-5.0, -5.0, -3.0], [-2.0, -4.0, -5.0]]}
    nan = float("nan")
    paths = {inp: {"receiver": "L1H0", "clean_value": -1.0, "corrupt_value": -5.0,
                   "values": [[nan, nan, value], [nan, nan, nan]]}
             for inp, value in (("q", -1.0), ("k", -3.0), ("v", -1.4))}
    analysis = {"patching": {"patching": {"head_out": head_out}, "path_patching": paths},
                "ablation": {"group": {"heads": ["L1H0", "L1H1"], "repeated_loss": [2.0, 5.0],
                                       "first_half_loss": [7.0, 7.1]}}}
    evidence = causal_evidence(found, analysis)
    assert evidence["patching_recovery"] == {"L1H0": 0.75, "L1H1": 0.25, "L0H2": 0.5}
    assert evidence["path_patching"]["fraction_of_gap"] == {"q": 0.0, "k": 0.5, "v": 0.1}
    assert evidence["path_patching"]["other_induction_heads"] == ["L1H1"]
    text = "\n".join(causal_paragraph(evidence))
    assert "L1H0 75%" in text and "K-composition" in text and "from 2.00 to 5.00" in text
    assert causal_paragraph({}) == []
