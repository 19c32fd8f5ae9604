"""Attribution graphs against truth: a forged model whose MLPs are planted sparse dictionaries (exact
transcoders: zero errors, scores 1.0, the planted path strongest, decoys pruned), and every edge of a
random model's graph checked as an effect in the frozen replacement model (float64, 1e-8).

(Split out of the flat test_graphs module, issue 38.)"""
import json

import pytest
import torch

from circuitlab.graphs import Graph, Transcoders, attribute

from graphs.test_attribution import real_clt  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def cli(*argv, cwd):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import circuitlab

    env = {**os.environ, "PYTHONPATH": str(Path(circuitlab.__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "circuitlab.cli", "graph", *argv], cwd=cwd, capture_output=True,
                          text=True, env=env)


def test_graph_command_writes_every_file_and_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    from circuitlab.cli import main

    done = cli("--planted", "--prompt", "xAxBxyx", "--out", "g", cwd=tmp_path)   # the real command line, once
    assert done.returncode == 0, done.stderr
    out = tmp_path / "g"
    assert {p.name for p in out.iterdir()} == {"graph", "graph.json", "graph-metadata.json", "graph.svg",
                                               "results.json", "report.md", "report.html", ".circuitlab-output.json"}
    results = json.loads((out / "results.json").read_text())
    assert results["graph"]["replacement_score"] == pytest.approx(1.0)
    assert results["top_paths"][0]["words"].startswith("token 'A' @1 -> L0 F0 @1")
    assert Graph.load(out / "graph").n_features == 29
    viewer = json.loads((out / "graph.json").read_text())
    assert {n["node_id"] for n in viewer["nodes"] if n["feature_type"] == "cross layer transcoder"} == {"0_0_1", "1_0_6"}
    # Again (in process from here): the earlier graph is set aside, not mixed in; another folder is refused.
    monkeypatch.chdir(tmp_path)
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", "g"]) == 0
    assert len(list(tmp_path.glob("g.*"))) == 1 and (out / "results.json").is_file()
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", "w", "--token-nodes", "W_E"]) == 0
    assert Graph.load(tmp_path / "w" / "graph").token_nodes == "W_E"
    assert json.loads((tmp_path / "w" / "results.json").read_text())["token_nodes"] == "W_E"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", "mine"]) == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    capsys.readouterr()
    for bad, message in [(["--node-threshold", "0"], "node-threshold"), (["--edge-threshold", "1.01"], "edge-threshold"),
                         (["--target", "ZZ"], "not one token"), (["--prompt", "xA" + "x" * 20], "context"),
                         (["--token-nodes", "W_pos"], "--token-nodes")]:
        try:
            code = main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", "bad"] + bad)
        except SystemExit as e:  # the parser's errors
            code = e.code
        assert code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad").exists()


def test_graph_command_reads_a_cross_layer_transcoder(tmp_path, monkeypatch, capsys):
    from circuitlab.cli import main
    from helpers import saved_graph_run

    model, tok, tc, _ = saved_graph_run(tmp_path, n_layers=2, d_sae=24)
    dicts = [tc.dictionary(layer).to(torch.float64) for layer in range(2)]
    clt = real_clt(dicts, cross=0.3)
    clt.save(tmp_path / "clt", layout="circuit-tracer")
    monkeypatch.chdir(tmp_path)
    assert main(["graph", "--checkpoint", "model/checkpoint", "--transcoders", "clt", "--prompt", "Lily saw a cat. Lily",
                 "--dashboard-tokens", "0", "--out", "g"]) == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "g" / "results.json").read_text())
    assert "cross-layer transcoder" in results["transcoders"]
    ids = torch.tensor(tok.encode("Lily saw a cat. Lily"))
    want = attribute(model, Transcoders.cross_layer(model, clt.to(torch.float32)), ids)
    saved = Graph.load(tmp_path / "g" / "graph")
    assert torch.equal(saved.active_features, want.active_features)
    torch.testing.assert_close(saved.adjacency, want.adjacency, atol=1e-5 * float(want.adjacency.abs().max()), rtol=0)
