"""The output policy of every command that writes (docs/architecture.md, "One output policy"), held as a class:

- a refused run changes nothing on disk: each command, given a bad argument or input (past argparse) and an
  --out holding an earlier output, exits 2 with one line and leaves every file and folder as it was (names,
  sizes, modification times), the earlier output included, and creates nothing (no empty output folder);
- an unwritable --out is refused in one line before any work;
- every command that sets earlier output aside says where, and the earlier output is there.

Commands run in-process (circuitlab.cli.main) on tiny models, from inside the test folder so default paths
land there too."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.cli import main
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.training import save_checkpoint
from circuitlab.training.outputs import MARKER

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "Once upon a time, Lily saw a cat. The cat was happy. Lily said hello to the cat."
PLANTED = "graph --planted --prompt xAxBxyx --dashboard-tokens 0"
STEER = ("steer --checkpoint {run} --positive {prompts} --negative {prompts} --neutral {prompts} --layer 0 "
         "--samples 1 --max-tokens 2 --coef 0 --no-progress")
CIRCUIT = "circuit --checkpoint {run} --task induction --method eap --no-progress"


def _marked(folder: Path, kind: str, **files: str) -> None:
    """An earlier output of `kind` (what output_folder recognises: its marker) with a file in it."""
    folder.mkdir(parents=True)
    (folder / MARKER).write_text('{"kind": "%s"}\n' % kind)
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    """{run}: a 1-layer MLP model with a char tokenizer; {prompts}: a prompt file; earlier outputs of each
    command: {graph_prev} (a real one), {circuit_prev}, {steer_prev}, {interpret_prev} (and a second,
    {interpret_prev2}, for the window refused before it moves), {import_prev},
    {export_prev}, {sae_prev}; {tmp}: the folder."""
    root = tmp_path_factory.mktemp("policy")
    torch.manual_seed(0)
    char = CharTokenizer.from_texts([TEXT + "\n"])
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=char.vocab_size, n_ctx=24)
    save_checkpoint(root / "run" / "checkpoint", Transformer(cfg), char)
    (root / "prompts.txt").write_text("Lily saw\nthe cat\n")
    (root / "text.txt").write_text((TEXT + "\n") * 20)      # for dashboards: only characters the model knows
    SparseDictionary(DictionaryConfig("relu", d_in=16, d_sae=32, hook_name="blocks.0.hook_resid_post"),
                     seed=0).save(root / "sae")
    assert main(shlex.split(PLANTED) + ["--out", str(root / "graph_prev")]) == 0
    _marked(root / "circuit_prev", "circuit", results_json="{}")
    _marked(root / "steer_prev", "steer", steering_json="{}")
    for name in ("interpret_prev", "interpret_prev2"):
        (root / name).mkdir()
        (root / name / "results.json").write_text('{"experiments": [], "checkpoint": "x"}')
    save_checkpoint(root / "import_prev", Transformer(cfg))
    (root / "export_prev").mkdir()
    (root / "export_prev" / "config.json").write_text("{}")
    _marked(root / "sae_prev", "sae-train", results_json="{}")
    (root / "bad_sae.yaml").write_text("dictionary: 5\n")
    (root / "prev.json").write_text("{}")
    return {"run": str(root / "run"), "prompts": str(root / "prompts.txt"), "tmp": str(root),
            **{k: str(root / k) for k in ("graph_prev", "circuit_prev", "steer_prev", "interpret_prev",
                                          "interpret_prev2", "import_prev", "export_prev", "sae_prev")}}


# (command line, a fragment of its one-line refusal). Each names an --out that holds an earlier output.
REFUSED = [
    # graph
    (PLANTED + " --target y --foil y --out {graph_prev}", "the foil 'y' is the target"),
    (PLANTED + " --foil y --out {graph_prev}", "--foil needs --target"),
    ("graph --planted --prompt '' --out {graph_prev}", "the prompt is empty"),
    (PLANTED + " --target yy --out {graph_prev}", "is not one token"),
    ("graph --checkpoint {run} --transcoders {tmp}/none --prompt Lily --out {graph_prev}",
     "transcoder folder not found"),
    ("graph --checkpoint {run} --transcoders {steer_prev} --prompt Lily --out {graph_prev}", "holds no transcoders"),
    (PLANTED + " --out {run}/checkpoint/graph", "inside the checkpoint folder"),
    (PLANTED + " --out {run}", "already holds other files"),
    (PLANTED + " --out {prompts}", "is a file"),
    # circuit: an unknown method, metric, intervention or refinement, before the earlier circuit is moved
    (CIRCUIT.replace("eap ", "nope ") + " --out {circuit_prev}", "unknown method 'nope'"),
    (CIRCUIT + " --metric nope --out {circuit_prev}", "unknown metric 'nope'"),
    (CIRCUIT + " --intervention nope --out {circuit_prev}", "unknown intervention 'nope'"),
    (CIRCUIT + " --refine nope --out {circuit_prev}", "unknown refinement 'nope'"),
    (CIRCUIT + " --out {interpret_prev}", "already holds other files"),
    # attribute
    ("attribute --checkpoint {run} --prompt Lily --target L --foil L --out {tmp}/prev.json", "the foil 'L' is the target"),
    ("attribute --checkpoint {run} --prompt '' --out {tmp}/prev.json", "the prompt is empty"),
    # steer
    (STEER + " --layer 7 --out {steer_prev}", "layer 7 is out of range"),
    (STEER + " --temperature -1 --out {steer_prev}", "--temperature must be a finite number >= 0"),
    (STEER + " --out {run}/checkpoint/steer", "inside the checkpoint folder"),
    # interpret
    ("interpret --checkpoint {run} --experiments nope --out {interpret_prev}", "unknown experiment(s) nope"),
    ("interpret --checkpoint {run} --experiments causal_tracing --prompt 'Lily saw' --subject Lily --window 2 "
     "--out {interpret_prev2}", "wider than the model"),
    # import, export
    ("import {tmp}/nothing --out {import_prev}", "checkpoint folder not found"),
    ("import {run} --out {import_prev}", "has no config.json"),
    ("export --checkpoint {tmp}/nothing --out {export_prev}", "checkpoint not found"),
    ("export --checkpoint {run} --out {circuit_prev}", "already holds other files"),
    # train, sae train, lens train
    ("train --config demo --set train.lr=0 --no-progress --out {tmp}/train_new", "train.lr must be a finite number > 0"),
    ("train --config demo --no-progress --out {import_prev}", "already holds other files"),
    ("sae train --config {tmp}/bad_sae.yaml --out {sae_prev}", "bad_sae.yaml: dictionary"),
    ("sae train --config sae-demo --set nope=1 --out {sae_prev}", "nope"),
    ("sae train --config sae-demo --out {sae_prev}", "already holds a sae-train output"),
    ("sae train --config sae-demo --out {tmp}/sae_new", "checkpoint not found"),
    ("sae dashboards --dictionary {tmp}/none --checkpoint {run} --out {tmp}/dash_new", "not found"),
    ("sae dashboards --dictionary {tmp}/sae --checkpoint {run} --data nope --out {tmp}/dash_new", "nope"),
    ("lens train --checkpoint {tmp}/nothing --out {tmp}/lens_new", "not found"),
    # forge compare
    ("forge compare --steps 0 --out {tmp}/fc_new", "steps must be a positive whole number"),
]


def _argv(command: str, where: dict[str, str]) -> list[str]:
    return [part.format(**where) for part in shlex.split(command)]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and folder under root: (kind, size, modification time in ns)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = ("d" if p.is_dir() else "f", st.st_size if p.is_file() else 0,
                                             st.st_mtime_ns)
    st = root.stat()
    out["."] = ("d", 0, st.st_mtime_ns)
    return out


def _one_line(code: int, err: str, fragment: str) -> None:
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in err, err
    assert fragment in lines[0], err


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("command, fragment", REFUSED,
                         ids=[c.split(" --")[0] + f" [{i}]" for i, (c, _) in enumerate(REFUSED)])
def test_a_refused_run_changes_nothing_on_disk(where, command, fragment, capsys, monkeypatch):
    root = Path(where["tmp"])
    monkeypatch.chdir(root)
    before = snapshot(root)
    code = _run(_argv(command, where))
    _one_line(code, capsys.readouterr().err, fragment)
    after = snapshot(root)
    assert after == before, {"created": sorted(set(after) - set(before)), "gone": sorted(set(before) - set(after)),
                             "changed": sorted(k for k in set(after) & set(before) if after[k] != before[k])}


UNWRITABLE = ["/proc/circuitlab-x", "/proc/circuitlab-x/deeper"]
WRITERS = [PLANTED, CIRCUIT, STEER, "attribute --checkpoint {run} --prompt Lily", "train --config demo --no-progress",
           "sae train --config sae-demo --set model={run}", "sae dashboards --dictionary {tmp}/sae --checkpoint {run}",
           "lens train --checkpoint {run}", "interpret --checkpoint {run} --experiments heads", "export --checkpoint {run}",
           "import {run}", "forge compare", "demo", "sae demo", "graph demo"]


@pytest.mark.parametrize("command", WRITERS, ids=[c.split(" --")[0].split(" {")[0] for c in WRITERS])
@pytest.mark.parametrize("out", UNWRITABLE)
def test_an_unwritable_out_is_refused_before_any_work(where, command, out, capsys, monkeypatch):
    """/proc takes no new files even for root (permission bits do not tell): one line naming --out, exit 2,
    and no work done (the model is not even read)."""
    import circuitlab.training as training
    import circuitlab.training.checkpoint as checkpoint

    def no_work(*_, **__):
        raise AssertionError("the model was read before the output path was checked")

    for module in (training, checkpoint):
        monkeypatch.setattr(module, "load_checkpoint", no_work)
    target = out + (".json" if command.startswith("attribute") else "")
    code = _run(_argv(command, where) + ["--out", target])
    _one_line(code, capsys.readouterr().err, "give another --out")


# ---------------------------------------------------------------------------- set aside, and said where

SET_ASIDE = [
    (PLANTED + " --out {tmp}/again_graph", "kept the earlier graph as"),
    (CIRCUIT + " --out {tmp}/again_circuit", "kept the earlier circuit as"),
    (STEER + " --out {tmp}/again_steer", "kept the earlier steer output as"),
    ("interpret --checkpoint {run} --experiments logit_lens --prompt Lily --out {tmp}/again_interpret",
     "moved the previous results to"),
    ("export --checkpoint {run} --out {tmp}/again_export", "kept the previous export as"),
    ("sae dashboards --dictionary {tmp}/sae --checkpoint {run} --tokens 256 --data file:{tmp}/text.txt "
     "--no-progress --out {tmp}/again_dashboards", "kept the earlier dashboards as"),
]


@pytest.mark.parametrize("command, said", SET_ASIDE, ids=[c.split(" --")[0] for c, _ in SET_ASIDE])
def test_every_command_setting_earlier_output_aside_says_where(where, command, said, capsys, monkeypatch):
    monkeypatch.chdir(where["tmp"])
    argv = _argv(command, where)
    assert _run(argv) == 0
    first = snapshot(Path(argv[-1]))
    capsys.readouterr()
    assert _run(argv) == 0
    out = capsys.readouterr().out
    line = next((x for x in out.splitlines() if said in x), None)
    assert line is not None, out
    kept = Path(re.search(re.escape(said) + r" (\S+)", line).group(1))
    assert kept.is_dir() and kept.name.startswith(Path(argv[-1]).name + ".")
    assert snapshot(kept) == first       # the earlier output, whole, where the message says


def test_the_demos_fresh_out_says_where(tmp_path, capsys):
    """demo, sae demo and graph demo set an earlier demo aside through demo_budget.fresh_out."""
    from circuitlab.experiments.demo_budget import fresh_out

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "report.md").write_text("earlier")
    fresh_out(tmp_path / "d", lambda p: True, "graphs demo")
    said = capsys.readouterr().out
    kept = Path(said.strip().removeprefix("moved the previous graphs demo to "))
    assert (kept / "report.md").read_text() == "earlier" and not any((tmp_path / "d").iterdir())
