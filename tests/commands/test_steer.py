"""`circuitlab steer` end to end: the files it writes, an earlier output kept or replaced, one line per bad input
(its options: tests/experiments/test_steer.py)."""
import json

import pytest
from tiny_trained import induction_model

from circuitlab.cli import main
from circuitlab.data import CharTokenizer
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def test_steer_command(tmp_path, capsys):
    tok = CharTokenizer("abcdefghijklmnopqrstuvw")
    save_checkpoint(tmp_path / "ckpt", induction_model(), tok)
    (tmp_path / "pos.txt").write_text("dddddddd\nddddcdddd\n")
    (tmp_path / "neg.txt").write_text("kkkkkkkk\n\nkkkkkk\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    args = ["steer", "--checkpoint", str(tmp_path / "ckpt"), "--positive", str(tmp_path / "pos.txt"),
            "--negative", str(tmp_path / "neg.txt"), "--neutral", str(tmp_path / "pos.txt")]
    assert main(args + ["--layer", "1", "--coef", "0", "2", "--count", "d", "--samples", "2", "--max-tokens", "5",
                        "--prompt", "abc", "--out", str(tmp_path / "out")]) == 0
    assert "preference" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out" / "steering.json").read_text())
    assert saved["coefs"] == [0.0, 2.0] and len(saved["generations"]["2.0"]) == 2
    assert (tmp_path / "out" / "steering.png").read_bytes()[:4] == b"\x89PNG"
    # a second run into the same --out keeps the first, renamed; --overwrite replaces it (training.outputs policy)
    first = (tmp_path / "out" / "steering.json").read_text()
    assert main(args + ["--layer", "1", "--coef", "0", "1", "--samples", "1", "--max-tokens", "2", "--prompt", "abc",
                        "--out", str(tmp_path / "out")]) == 0
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out.")]
    assert len(kept) == 1 and (kept[0] / "steering.json").read_text() == first
    assert f"kept the earlier steer output as {kept[0]}" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "steering.json").read_text())["coefs"] == [0.0, 1.0]
    assert main(args + ["--layer", "1", "--coef", "0", "3", "--samples", "1", "--max-tokens", "2", "--prompt", "abc",
                        "--out", str(tmp_path / "out"), "--overwrite"]) == 0
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("out.")]) == 1
    assert json.loads((tmp_path / "out" / "steering.json").read_text())["coefs"] == [0.0, 3.0]
    capsys.readouterr()
    assert main(args + ["--layer", "5"]) == 2
    args[4] = str(tmp_path / "empty.txt")
    assert main(args + ["--layer", "1"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 2
