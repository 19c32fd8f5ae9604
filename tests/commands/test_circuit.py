"""`circuitlab circuit` end to end on a tiny checkpoint, and its one-line errors."""
import json
import xml.dom.minidom

import pytest

import helpers

from circuitlab import ModelConfig
from circuitlab.cli import main
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("circuit") / "ck"
    tok = CharTokenizer.from_texts(["abcdefghijklmnopqrstuvwxyz ."])
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64, d_vocab=40, n_ctx=32)
    save_checkpoint(path, helpers.random_model(cfg), tok)
    return path


def test_circuit_command_writes_results_report_and_drawing(checkpoint, tmp_path, capsys):
    (tmp_path / "clean.txt").write_text("the cat sat\nmy dog ran\n")
    (tmp_path / "corrupt.txt").write_text("the hat sat\nmy fog ran\n")
    out = tmp_path / "out"
    rc = main(["circuit", "--checkpoint", str(checkpoint), "--clean", str(tmp_path / "clean.txt"), "--corrupt",
               str(tmp_path / "corrupt.txt"), "--metric", "kl", "--method", "eap", "--edges", "12",
               "--out", str(out)])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert results["scores"]["graph"]["n_edges"] == 110 and 0 < results["circuit"]["n_edges"] <= 12
    assert results["faithfulness"]["n_edges"][-1] == 110
    svg = xml.dom.minidom.parse(str(out / "circuit.svg"))
    assert len(svg.getElementsByTagName("path")) == results["circuit"]["n_edges"]
    html = (out / "report.html").read_text()
    assert "<svg" in html and "Faithfulness" in html and "<script src=" not in html
    assert "## Circuit edges" in (out / "report.md").read_text()
    assert (out / "scores_mib.json").is_file()
    assert "110 edges" in capsys.readouterr().out


def test_a_second_circuit_run_sets_the_first_aside(checkpoint, tmp_path, capsys):
    """The output policy (training.outputs): a second run into the same --out keeps the first, renamed, and says
    where; --overwrite replaces it; a folder holding anything else is refused, even with --overwrite."""
    (tmp_path / "clean.txt").write_text("the cat sat\nmy dog ran\n")
    (tmp_path / "corrupt.txt").write_text("the hat sat\nmy fog ran\n")
    out = tmp_path / "out"
    args = ["circuit", "--checkpoint", str(checkpoint), "--clean", str(tmp_path / "clean.txt"), "--corrupt",
            str(tmp_path / "corrupt.txt"), "--metric", "kl", "--method", "eap", "--no-progress", "--out", str(out)]
    assert main(args + ["--edges", "12"]) == 0
    first = (out / "results.json").read_text()
    capsys.readouterr()
    assert main(args + ["--edges", "10"]) == 0
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out.")]
    assert len(kept) == 1 and (kept[0] / "results.json").read_text() == first
    assert f"kept the earlier circuit as {kept[0]}" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["circuit"]["n_edges"] <= 10
    second = (out / "results.json").read_text()
    assert main(args + ["--edges", "8", "--overwrite"]) == 0
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("out.")]) == 1  # replaced, not kept
    assert (out / "results.json").read_text() != second
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("my notes")
    capsys.readouterr()
    for extra in ([], ["--overwrite"]):
        assert main(args[:-1] + [str(other)] + extra) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert sorted(p.name for p in other.iterdir()) == ["mine.txt"]


@pytest.mark.parametrize("extra, message", [
    (["--task", "induction", "--metric", "ratio"], "unknown metric 'ratio'"),
    (["--task", "induction", "--method", "acdc"], "unknown method 'acdc'"),
    (["--task", "induction", "--method", "eap", "--threshold", "1e9"], "keeps no edge"),
    (["--clean", "CLEAN", "--corrupt", "LONGER"], "same token length"),
    ([], "give --clean and --corrupt"),
    (["--task", "induction", "--corruption", "swap"], "unknown corruption 'swap'"),
    (["--task", "induction", "--method", "eap", "--refine", "greedy"], "unknown refinement 'greedy'"),
    (["--clean", "CLEAN", "--corrupt", "CLEAN", "--corruption", "first-copy"], "--corrupt file is the corruption"),
])
def test_circuit_command_bad_input_is_one_line(checkpoint, tmp_path, capsys, extra, message):
    (tmp_path / "c.txt").write_text("the cat\n")
    (tmp_path / "l.txt").write_text("the cats\n")
    extra = [str(tmp_path / "c.txt") if a == "CLEAN" else str(tmp_path / "l.txt") if a == "LONGER" else a
             for a in extra]
    rc = main(["circuit", "--checkpoint", str(checkpoint), *extra, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1 and "Traceback" not in err
