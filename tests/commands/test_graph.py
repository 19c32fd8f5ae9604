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


def test_the_graph_flags_are_graph_inputs_and_graph_options(capsys):
    """`circuitlab graph`'s flags are GraphInputs' and GraphOptions' (graphs/options.py), in --help's order around
    the shared dtype and memory flags: the command line parses to the classes' defaults and to what a config
    (from_dict) says; a bad value is refused in one line by the command line and by check() with one rule."""
    from circuitlab.cli import build_parser, main
    from circuitlab.errors import InputError
    from circuitlab.graphs.options import GraphInputs, GraphOptions
    from circuitlab.spec import options_of

    def parsed(*argv):
        args = build_parser().parse_args(["graph", *argv])
        return GraphInputs.from_args(args), GraphOptions.from_args(args)

    assert parsed("--planted", "--prompt", "x") == (GraphInputs(planted=True, prompt="x").check(), GraphOptions())
    assert parsed("--planted", "--prompt", "x")[0] == GraphInputs.from_dict({"planted": True, "prompt": "x"})
    inputs, options = parsed("--model", "m", "--transcoders", "t", "--transcoder-set", "s", "--prompt", "p",
                             "--target", "a", "--foil", "b", "--mmap", "--qk", "--partial", "--out", "o",
                             "--overwrite", "--qk-heads", "3", "--node-threshold", "0.5", "--token-nodes", "W_E")
    assert inputs == GraphInputs.from_dict({"checkpoint": "m", "transcoders": "t", "transcoder_set": "s",
                                            "prompt": "p", "target": "a", "foil": "b", "mmap": True, "qk": True,
                                            "partial": True, "out": "o", "overwrite": True})
    assert options == GraphOptions.from_dict({"qk_heads": 3, "node_threshold": 0.5, "token_nodes": "W_E"})
    graph = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith(" graph"))
    dests = [a.dest for a in graph._actions if a.dest not in ("help", "graph_command")]
    given, tuning = ([f.name for f, _ in options_of(cls)] for cls in (GraphInputs, GraphOptions))
    assert dests == [*given[:7], *tuning[:-1], "dtype", "compute_dtype", "mmap", "qk", "qk_heads", "memory",
                     "estimate", "partial", "out", "overwrite"]
    assert set(given) | set(tuning) <= set(dests)   # every declared option is a flag
    for argv, cls, value, said in [
            (["--planted", "--prompt", "x", "--foil", "y"], GraphInputs, {"planted": True, "prompt": "x", "foil": "y"},
             "--foil needs --target (the graph explains target minus foil)"),
            (["--prompt", "x", "--checkpoint", "m"], GraphInputs, {"prompt": "x", "checkpoint": "m"},
             "circuitlab sae train --config transcoders-quick --set model=m --out runs/transcoders-m, then give "
             "--transcoders runs/transcoders-m"),
            (["--prompt", "x"], GraphInputs, {"prompt": "x"},
             "give --checkpoint DIR and --transcoders DIR (or --planted for the built-in model)"),
            (["--planted", "--prompt", "x", "--qk-heads", "0"], GraphOptions, {"qk_heads": 0},
             "must be a whole number >= 1, got "),
            (["--planted", "--prompt", "x", "--logit-prob", "1.5"], GraphOptions, {"desired_logit_prob": 1.5},
             "must be a number from above 0 to 1, got ")]:
        try:
            code = main(["graph", *argv])
        except SystemExit as e:   # the parser's errors
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and said in err, err
        with pytest.raises(InputError) as e:
            cls(**value).check()
        assert said in str(e.value)
