"""The narrowing options of interpret's sweeps, from the command line: what each leaves out is left out of
results.json, and on a small model the defaults are the full sweeps as before (the old settings, given explicitly,
give the same results)."""
import json

import pytest

from circuitlab.cli import main
from helpers import save_char_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("narrow")
    save_char_checkpoint(root / "model", n_layers=2, d_model=16, n_ctx=32)
    return root / "model"


def _results(ckpt, out, *flags: str) -> dict:
    assert main(["interpret", "--checkpoint", str(ckpt), "--out", str(out), *flags]) == 0
    return json.loads((out / "results.json").read_text())


def test_narrowed_sweeps_leave_out_what_they_say(ckpt, tmp_path):
    found = _results(ckpt, tmp_path / "narrow", "--experiments", "patching", "ablation", "causal_tracing", "heads",
                     "--patch-targets", "resid_pre", "head_out", "--patch-layers", "1", "--no-path-patching",
                     "--ablation-layers", "1", "--no-mlp-ablation",
                     "--trace-kinds", "hidden", "--trace-layers", "0", "--trace-positions", "-1", "--periods", "4", "8")
    assert list(found["patching"]["patching"]) == ["resid_pre", "head_out"]
    assert all(r["layers"] == [1] for r in found["patching"]["patching"].values())
    assert found["patching"].get("path_patching") is None
    assert found["ablation"]["heads"]["layers"] == [1] and found["ablation"].get("mlps") is None
    trace = found["causal_tracing"]["trace"]
    assert list(trace["values"]) == ["hidden"]
    grid = trace["values"]["hidden"]
    assert grid[0][-1] is not None and sum(v is not None for row in grid for v in row) == 1   # one cell traced
    assert found["heads"]["induction_by_period"]["periods"] == [4, 8]


def test_the_defaults_on_a_small_model_are_the_full_sweeps(ckpt, tmp_path):
    """A 2-layer model: every default target and layer, path patching, heads and MLPs, four traced kinds, every
    position; given explicitly, the same results."""
    default = _results(ckpt, tmp_path / "default", "--experiments", "patching", "ablation", "causal_tracing")
    assert list(default["patching"]["patching"]) == ["resid_pre", "attn_out", "mlp_out", "head_out",
                                                     "head_out_by_pos"]
    assert default["patching"].get("path_patching") or default["patching"].get("gap_within_noise")
    assert default["ablation"]["mlps"]["layers"] == [0, 1]
    assert list(default["causal_tracing"]["trace"]["values"]) == ["hidden", "mlp", "attn", "hidden_no_mlp"]
    given = _results(ckpt, tmp_path / "given", "--experiments", "patching", "ablation", "causal_tracing",
                     "--patch-targets", "resid_pre", "attn_out", "mlp_out", "head_out", "head_out_by_pos",
                     "--patch-layers", "0", "1", "--ablation-layers", "0", "1",
                     "--trace-kinds", "hidden", "mlp", "attn", "hidden_no_mlp", "--trace-layers", "0", "1",
                     "--trace-positions", *map(str, range(len(default["causal_tracing"]["trace"]["tokens"]))))
    for name in ("patching", "ablation", "causal_tracing"):
        assert given[name] == default[name], name


@pytest.mark.parametrize("flags, said", [
    (["--patch-layers", "2"], "--patch-layers 2: the model has 2 layers"),
    (["--ablation-layers", "5"], "--ablation-layers 5: the model has 2 layers"),
    (["--trace-positions", "99"], "position(s) 99 out of range"),
    (["--periods", "17"], "--periods 17: two copies of r must fit the context of 32 tokens"),
])
def test_a_bad_narrowing_is_one_line(ckpt, tmp_path, capsys, flags, said):
    assert main(["interpret", "--checkpoint", str(ckpt), "--out", str(tmp_path / "bad"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "bad").exists()
