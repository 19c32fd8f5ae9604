"""The shared ground rules every command uses: one number validator, one text reader, one output-folder
policy, one metrics log that survives SIGKILL."""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from circuitlab.checks import COUNT, FRACTION, POSITIVE, Number, check_fields
from circuitlab.errors import CircuitlabError, ConfigError, InputError
from circuitlab.textfile import read_lines, read_text
from circuitlab.training.outputs import MARKER, default_out, output_folder, output_kind
from circuitlab.training.run_log import MetricsLog, read_metrics

BAD_FOR_ANY = [True, False, math.nan, math.inf, -math.inf, "1", None, [1]]


@pytest.mark.parametrize("rule", [COUNT, POSITIVE, FRACTION, Number(int, low=0, high=10), Number(float)])
@pytest.mark.parametrize("value", BAD_FOR_ANY)
def test_a_rule_refuses_booleans_nonfinite_and_non_numbers(rule, value):
    with pytest.raises(InputError, match=r"^x must be"):
        rule.check(value, "x")
    assert rule.problem(value) is not None


def test_whole_numbers_and_ranges():
    assert COUNT.check(3, "n") == 3 and isinstance(COUNT.check(3, "n"), int)
    for bad in (0, -1, 2.0, 2.5):
        with pytest.raises(InputError, match="n must be a whole number >= 1"):
            COUNT.check(bad, "n")
    assert POSITIVE.check(2, "lr") == 2.0 and isinstance(POSITIVE.check(2, "lr"), float)
    with pytest.raises(InputError, match="lr must be a finite number > 0, got 0"):
        POSITIVE.check(0, "lr")
    assert FRACTION.check(1, "f") == 1.0 and FRACTION.check(0, "f") == 0.0
    with pytest.raises(InputError, match="from 0 to 1"):
        FRACTION.check(1.0001, "f")
    capped = Number(int, low=1, high=10, why="each step holds a copy of the model")
    with pytest.raises(InputError, match=r"from 1 to 10 \(each step holds a copy of the model\), got 11"):
        capped.check(11, "steps")
    half_open = Number(float, low=0.0, high=1.0, high_open=True)
    assert half_open.rule() == "a number from 0 to below 1"
    with pytest.raises(InputError):
        half_open.check(1.0, "beta")


def test_cli_parse_and_check_agree_value_by_value():
    """The CLI's argparse type and the Python check accept and refuse the same values."""
    for rule in (COUNT, POSITIVE, FRACTION, Number(int, low=0, high=100)):
        for text in ("0", "1", "5", "-3", "0.5", "1e-3", "nan", "inf", "-inf", "abc", "", "1e400", "100", "101"):
            try:
                via_cli = rule.arg(text)
            except argparse.ArgumentTypeError:
                via_cli = "refused"
            try:
                via_parse = rule.parse(text, "x")
            except InputError:
                via_parse = "refused"
            assert via_cli == via_parse, (rule, text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a whole number >= 1, got '0'"):
        COUNT.arg("0")


def test_check_fields_names_the_field_and_reads_yaml_numbers():
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        lr: float = 1e-3
        steps: int = 10

    cfg = Cfg(lr="3e-4", steps=5)
    check_fields(cfg, {"lr": POSITIVE, "steps": COUNT}, "train")
    assert cfg.lr == 3e-4
    with pytest.raises(ConfigError, match=r"train.steps must be a whole number >= 1, got True"):
        check_fields(Cfg(steps=True), {"steps": COUNT}, "train")
    with pytest.raises(ConfigError, match=r"train.lr must be a finite number > 0, got inf"):
        check_fields(Cfg(lr=math.inf), {"lr": POSITIVE}, "train")


def test_schema_fragment():
    assert COUNT.schema() == {"type": "integer", "minimum": 1}
    assert POSITIVE.schema() == {"type": "number", "exclusiveMinimum": 0.0}


# ---------------------------------------------------------------------------- text


def test_text_reader_names_file_and_byte_offset(tmp_path):
    good = tmp_path / "good.txt"
    good.write_bytes(b"\xef\xbb\xbfhello\n\nw\xc3\xb6rld\n")  # BOM dropped, UTF-8 kept
    assert read_text(good) == "hello\n\nwörld\n"
    assert read_lines(good) == ["hello", "wörld"]
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"line one\ncaf\xe9\n")
    with pytest.raises(InputError, match=r"prompt file .*latin1.txt is not UTF-8 text: byte 12 \(line 2\) is 0xe9"):
        read_lines(bad, "prompt file")
    with pytest.raises(InputError, match="answer file not found"):
        read_text(tmp_path / "missing.txt", "answer file")
    with pytest.raises(InputError, match="is a folder"):
        read_text(tmp_path, "text file")


# ---------------------------------------------------------------------------- output folders


def _fake_checkpoint(folder):
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "config.json").write_text("{}")


def test_output_folder_policy(tmp_path):
    out = tmp_path / "circ"
    assert output_folder(out, "circuit") is None and output_kind(out) == "circuit"
    (out / "results.json").write_text("1")
    kept = output_folder(out, "circuit")  # an earlier output of the same kind: set aside, nothing lost
    assert kept is not None and (kept / "results.json").read_text() == "1" and output_kind(out) == "circuit"
    assert not (out / "results.json").exists()
    (out / "results.json").write_text("2")
    with pytest.raises(CircuitlabError, match="pass --overwrite"):
        output_folder(out, "circuit", keep_previous=False)
    output_folder(out, "circuit", keep_previous=False, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [MARKER]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    for overwrite in (False, True):  # not ours: refused even with --overwrite
        with pytest.raises(CircuitlabError, match="already holds other files"):
            output_folder(other, "circuit", overwrite=overwrite)
    with pytest.raises(CircuitlabError, match="holds other files"):  # another command's output is not ours
        output_folder(out, "steer")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CircuitlabError, match="is a file"):
        output_folder(tmp_path / "file", "circuit")


def test_never_inside_a_checkpoint_folder(tmp_path):
    ckpt = tmp_path / "run" / "checkpoint"
    _fake_checkpoint(ckpt)
    assert default_out(tmp_path / "run", "circuit") == tmp_path / "run" / "circuit"
    assert default_out(ckpt, "circuit") == tmp_path / "run" / "checkpoint-circuit"
    with pytest.raises(CircuitlabError, match="inside the checkpoint folder"):
        output_folder(ckpt / "circuit", "circuit")
    output_folder(default_out(ckpt, "circuit"), "circuit")


# ---------------------------------------------------------------------------- metrics log

_WRITER = """
import sys, time
from circuitlab.training.run_log import MetricsLog
with MetricsLog(sys.argv[1], resume_step=int(sys.argv[2])) as log:
    for step in range(int(sys.argv[2]) + 1, 10**6):
        log.write({"step": step, "loss": 1.0 / step})
        if step == int(sys.argv[3]):
            print("ready", flush=True)
            time.sleep(60)
"""


def _run_until_killed(tmp_path, resume_step, kill_after):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(resume_step), str(kill_after)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_metrics_log_survives_sigkill_and_resume_keeps_each_step_once(tmp_path):
    _run_until_killed(tmp_path, 0, 7)
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 8))
    # a torn last line as a kill during a write leaves it
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "lo')
    with pytest.warns(UserWarning, match="torn last line"):  # read once to be cut off, and said
        assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 8))
    _run_until_killed(tmp_path, 5, 9)  # resumed from a checkpoint at step 5
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 10))
    with MetricsLog(tmp_path, resume_step=0) as log:  # a fresh start empties it
        log.write({"step": 1})
    assert read_metrics(tmp_path) == [{"step": 1}]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1}
