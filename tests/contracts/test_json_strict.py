"""Every JSON file circuitlab writes is strict JSON (no NaN / Infinity, which browsers' JSON.parse and other
strict readers refuse): one encoder, atomic.json_text, writes them all; non-finite numbers become null."""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

from circuitlab.atomic import atomic_write_json, json_text

SRC = Path(__file__).resolve().parents[2] / "src" / "circuitlab"


def strict_loads(text: str):
    def refuse(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def json_encoder_calls(src: Path = SRC) -> list[str]:
    """file:line of every json.dumps / json.dump / JSONEncoder use in the library outside atomic.py."""
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "atomic.py" and path.parent == src:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "json" \
                    and node.attr in ("dumps", "dump", "JSONEncoder"):
                found.append(f"{path.relative_to(src)}:{node.lineno} json.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "json":
                names = {a.name for a in node.names} & {"dumps", "dump", "JSONEncoder"}
                found += [f"{path.relative_to(src)}:{node.lineno} from json import {n}" for n in names]
    return found


def test_every_json_writer_goes_through_the_strict_encoder():
    """The walk: no writer of ours calls json.dumps / json.dump itself (each would write NaN as `NaN`)."""
    assert not json_encoder_calls(), "use circuitlab.atomic.json_text / atomic_write_json:\n" + \
        "\n".join(json_encoder_calls())


def test_the_walk_finds_a_direct_encoder(tmp_path):
    """The walk can fail: a module calling json.dumps is found (so the test above is not vacuous)."""
    fake = tmp_path / "circuitlab"
    fake.mkdir()
    (fake / "writer.py").write_text("import json\n\ndef w(p, x):\n    p.write_text(json.dumps(x))\n")
    (fake / "atomic.py").write_text("import json\nJ = json.dumps\n")   # the one home is allowed
    assert json_encoder_calls(fake) == ["writer.py:4 json.dumps"]


@pytest.mark.parametrize("value, expected", [
    (float("nan"), None), (math.inf, None), (-math.inf, None), (1.5, 1.5),
    ({"a": [1.0, float("nan"), (math.inf, 2)]}, {"a": [1.0, None, [None, 2]]}),
    ({"deep": {"er": [{"x": -math.inf, "ok": "NaN"}]}}, {"deep": {"er": [{"x": None, "ok": "NaN"}]}}),
])
def test_non_finite_numbers_become_null(value, expected):
    assert strict_loads(json_text(value)) == expected


def test_objects_through_default_are_checked_too():
    """Values a `default` turns into floats (numpy scalars, arrays) are made finite as well."""
    text = json_text({"x": np.float32("nan"), "arr": np.array([1.0, np.inf])},
                     default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    assert strict_loads(text) == {"x": None, "arr": [1.0, None]}


def test_finite_data_is_encoded_exactly_as_json_dumps():
    """Hashes and cache keys built from json_text stay what they were for finite data."""
    data = {"b": [1, 2.5, "x", None, True], "a": {"n": -0.0}}
    for kw in ({}, {"indent": 2}, {"sort_keys": True}):
        assert json_text(data, **kw) == json.dumps(data, **kw)


def test_other_encoding_errors_still_raise():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        json_text(loop)


def test_writers_of_a_diverged_run_write_strict_json(tmp_path):
    """Real writers with non-finite values: the metrics log (a diverged loss), a results file, a
    checkpoint's trainer state (best validation loss before any evaluation), read back by their readers."""
    from circuitlab.config import ModelConfig
    from circuitlab.model import Transformer
    from circuitlab.training.checkpoint import read_trainer_state, save_checkpoint
    from circuitlab.training.run_log import MetricsLog, read_metrics

    with MetricsLog(tmp_path / "run") as log:
        log.write({"step": 1, "loss": float("nan"), "grad_norm": math.inf})
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert strict_loads(text.strip()) == {"step": 1, "loss": None, "grad_norm": None}
    assert read_metrics(tmp_path / "run") == [{"step": 1, "loss": None, "grad_norm": None}]

    atomic_write_json(tmp_path / "results.json", {"ce_recovered": float("nan")}, indent=1)
    assert strict_loads((tmp_path / "results.json").read_text()) == {"ce_recovered": None}

    cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=11, n_ctx=8)
    folder = save_checkpoint(tmp_path / "ckpt", Transformer(cfg), state={"step": 0, "tokens_seen": 0,
                                                                          "best_val_loss": math.inf})
    for name in ("config.json", "trainer_state.json"):
        strict_loads((folder / name).read_text())
    assert read_trainer_state(folder)["best_val_loss"] is None
