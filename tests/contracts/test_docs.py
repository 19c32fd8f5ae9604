"""Every ```python block in docs/*.md runs as written, as the README's do (tests/contracts/test_readme.py): a doc's blocks
run in order in one namespace (as a reader pastes them into one session), in a fresh folder holding what the doc
says it reads (`runs/demo/2l` as `circuitlab demo` writes it, ...): tiny stand-ins made here, in that layout.

A doc whose examples need names (`model`, `tokenizer`, ...) defines them in a first block a reader can run
too. A block that cannot run here says so where a reader sees it, in its info string: ```python no-run
(with the reason in the text around it); there are few, and this file counts them.
"""
import functools
import re
from pathlib import Path

import pytest
import torch

import helpers

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))

# What each doc reads besides itself (made by the fixtures below, in the layout the commands write).
NEEDS: dict[str, tuple[str, ...]] = {
    "analysis.md": ("demo", "mlp-4l"), "causal.md": ("mlp-4l",), "circuits.md": ("demo",), "forge.md": ("forge-compare",),
    "induction.md": ("demo",), "lens.md": ("demo",), "pretrained.md": ("hf-model",), "report.md": ("demo", "mine"),
    "serve.md": ("demo",), "steering.md": ("demo",), "graphs.md": ("graphs",), "studies.md": ("demo",),
    "dictionaries.md": ("clt-demo",)}
# Docs whose blocks take longer than a few seconds: run by `make test-slow` only, with the reason.
SLOW: dict[str, str] = {}
# Docs whose blocks do not run yet (issue 32): expected to fail, strictly, so that a doc made runnable must
# leave this list. Empty it, do not grow it.
NOT_YET: set[str] = set()
# The most no-run blocks each doc may have (a block that cannot run here must be the exception).
NO_RUN: dict[str, int] = {"pretrained.md": 1,  # GPT-2 small from the hub
                          "studies.md": 1}    # the kjv text needs Debian's bible-kjv


def blocks(doc: Path) -> list[tuple[int, str, str]]:
    """(line, info string, code) of every ```python block."""
    return helpers.python_blocks(doc.read_text())


@functools.lru_cache(maxsize=None)
def story_tokenizer():
    """The demo's kind of tokenizer: BPE with 512 tokens, trained on the built-in stories."""
    from circuitlab.data.stories import stories_text
    from circuitlab.data.tokenizers import BPETokenizer

    return BPETokenizer.train([stories_text(200)], vocab_size=512)


def save_run(folder: Path, preset: str, **fields) -> None:
    """A run folder as `circuitlab train` writes it (FOLDER/checkpoint/), holding an untrained model of the
    preset, narrowed (d_model 32) so that every example takes a moment, with the story tokenizer."""
    from circuitlab import ModelConfig, Transformer
    from circuitlab.training import save_checkpoint

    tokenizer = story_tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset(preset, **{"d_model": 32, "n_heads": 4, "d_vocab": tokenizer.vocab_size,
                                             "n_ctx": 64, **fields})
    save_checkpoint(folder / "checkpoint", Transformer(cfg), tokenizer)


def demo_run(folder: Path) -> None:
    """runs/demo/{2l,1l}, the models `circuitlab demo` trains (their presets, 4 heads, BPE tokenizer)."""
    save_run(folder / "runs" / "demo" / "2l", "attn-only-2l")
    save_run(folder / "runs" / "demo" / "1l", "attn-only-1l")


def mlp_run(folder: Path) -> None:
    """runs/mlp-4l, the model `circuitlab train --config mlp-4l` trains: GPT-2 style with MLPs, 4 layers."""
    save_run(folder / "runs" / "mlp-4l", "gpt2-tiny", n_layers=4, d_mlp=128)


def mine_run(folder: Path) -> None:
    """runs/mine, a training run (`circuitlab train --config demo --out runs/mine`)."""
    save_run(folder / "runs" / "mine", "attn-only-2l")


def hf_model(folder: Path) -> None:
    """runs/quick (the LLaMA-style `quick` preset, narrowed) and exports/quick-hf: that model as `circuitlab export
    --checkpoint runs/quick --out exports/quick-hf` writes it (a Hugging Face LLaMA folder: config.json,
    model.safetensors, tokenizer files)."""
    from circuitlab.pretrained import export_hf
    from circuitlab.training import load_checkpoint

    save_run(folder / "runs" / "quick", "quick", n_layers=2, d_mlp=64)
    model, tokenizer, _ = load_checkpoint(folder / "runs" / "quick")
    export_hf(model, folder / "exports" / "quick-hf", tokenizer)


def forge_compare_run(folder: Path) -> None:
    """runs/forge-compare/trained, the adder `circuitlab forge compare` trains (its run config, 1 step)."""
    from circuitlab.experiments.forge_compare import addition_run_config
    from circuitlab.training import train

    train(addition_run_config(2, 2, steps=1), folder / "runs" / "forge-compare" / "trained", progress=False)


def features_model(folder: Path) -> None:
    """runs/features/model, the model `circuitlab sae demo` trains: GPT-2 style, 1 layer with an MLP."""
    save_run(folder / "runs" / "features" / "model", "gpt2-tiny", n_layers=1, d_mlp=64)


def graph_inputs(folder: Path) -> None:
    """runs/features/model and runs/transcoder-demo as `circuitlab sae train --config transcoder-demo` writes it: its
    one `kind: transcoders` entry expanded to the model's one layer (dictionaries/transcoders-0: a TopK skip
    transcoder reading blocks.0.ln2.hook_normalized, writing blocks.0.hook_mlp_out), random."""
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary, base_model_id
    from circuitlab.training import load_checkpoint

    features_model(folder)
    model, _, _ = load_checkpoint(folder / "runs" / "features" / "model")
    SparseDictionary(DictionaryConfig("topk", d_in=32, d_sae=64, k=4, skip=True, hook_name="blocks.0.ln2.hook_normalized",
                                      out_hook_name="blocks.0.hook_mlp_out", base_model=base_model_id(model),
                                      metadata={"name": "transcoders-0"}),
                     seed=0).save(folder / "runs" / "transcoder-demo" / "dictionaries" / "transcoders-0")


def clt_demo(folder: Path) -> None:
    """runs/mlp-4l and runs/clt-demo/dictionaries/clt-batchtopk: a cross-layer transcoder for that model, as
    `circuitlab sae train --config clt-demo` writes it (random)."""
    from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder

    mlp_run(folder)
    cfg = CLTConfig("batchtopk", n_layers=4, d_model=32, d_sae=64, k=8)
    CrossLayerTranscoder(cfg, seed=0).save(folder / "runs" / "clt-demo" / "dictionaries" / "clt-batchtopk")


FIXTURES = {"clt-demo": clt_demo, "graphs": graph_inputs, "forge-compare": forge_compare_run, "demo": demo_run, "mlp-4l": mlp_run, "mine": mine_run, "hf-model": hf_model}

# What each stand-in above is, and the documented command that writes it there: the paths a fixture makes, each
# under that command's output folder (its --out, or its default). test_stand_ins_are_what_documented_commands_write
# checks both, and that the command is in the docs or the README; the slow test runs graphs.md on the commands'
# own output.
MADE_BY: dict[str, dict[str, str]] = {
    "demo": {"runs/demo/2l": "circuitlab demo", "runs/demo/1l": "circuitlab demo"},
    "mlp-4l": {"runs/mlp-4l": "circuitlab train --config mlp-4l"},
    "mine": {"runs/mine": "circuitlab train --config demo --out runs/mine"},
    "hf-model": {"runs/quick": "circuitlab train --config quick --set data.source=stories",
                 "exports/quick-hf": "circuitlab export --checkpoint runs/quick --out exports/quick-hf"},
    "forge-compare": {"runs/forge-compare/trained": "circuitlab forge compare"},
    "graphs": {"runs/features/model": "circuitlab sae demo",
               "runs/transcoder-demo/dictionaries/transcoders-0": "circuitlab sae train --config transcoder-demo"},
    "clt-demo": {"runs/mlp-4l": "circuitlab train --config mlp-4l",
                 "runs/clt-demo/dictionaries/clt-batchtopk": "circuitlab sae train --config clt-demo"},
}


def run_doc(doc: Path, folder: Path) -> int:
    """Runs the doc's blocks in `folder` (the current directory); returns how many ran."""
    for need in NEEDS.get(doc.name, ()):
        FIXTURES[need](folder)
    return helpers.run_blocks(blocks(doc), folder, f"docs/{doc.name}")


def marks(doc: Path) -> list:
    return ([pytest.mark.slow] if doc.name in SLOW else []) + (
        [pytest.mark.xfail(strict=True, reason="not runnable yet (issue 32)")] if doc.name in NOT_YET else [])


@pytest.mark.parametrize("doc", [pytest.param(d, id=d.name, marks=marks(d)) for d in DOCS])
def test_doc_python_blocks_run_as_written(doc, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    run_doc(doc, tmp_path)


def command_out(command: str) -> str:
    """The folder a documented command writes: its --out, or its default (train / sae train: runs/<config name>)."""
    import shlex

    from circuitlab.cli import build_parser

    args = build_parser().parse_args(shlex.split(command)[1:])
    return str(args.out or f"runs/{Path(args.config).stem}")


def test_stand_ins_are_what_documented_commands_write(tmp_path):
    """Each path a doc reads (the stand-ins its fixtures make) is under the output folder of a command the docs or
    the README show, and a fixture makes nothing else: a doc cannot read a folder no documented command writes."""
    shown = "\n".join(p.read_text() for p in [*DOCS, ROOT / "README.md"])
    for fixture, paths in MADE_BY.items():
        made = tmp_path / fixture
        made.mkdir()
        FIXTURES[fixture](made)
        for path, command in paths.items():
            assert command in shown, f"{fixture}: `{command}` is not shown in the docs or README"
            out = command_out(command)
            assert path == out or path.startswith(out + "/"), f"{fixture}: {path} is not under {command}'s {out}"
            assert (made / path).exists(), f"{fixture} does not make {path}"
        stray = [f.relative_to(made).as_posix() for f in made.rglob("*") if f.is_file()
                 and not any(f.relative_to(made).as_posix().startswith(p + "/") for p in paths)]
        assert not stray, f"{fixture} makes {stray[:3]}, which MADE_BY does not name"
    used = {need for needs in NEEDS.values() for need in needs}
    assert used <= set(MADE_BY), f"fixtures without their command: {used - set(MADE_BY)}"


# Each documented command at a small size: (prefix, options appended) for the slow run on the commands' own output.
SMALL = [("circuitlab sae demo", "--model-steps 30 --dictionary-steps 20 --no-progress"),
         ("circuitlab sae train", "--no-progress --set train.steps=20 --set train.batch_size=256 --set train.eval_batches=1 "
                                  "--set train.ckpt_every=0 --set data.n_stories=200 --set store.seqs_per_chunk=16"),
         ("circuitlab train", "--no-progress --set train.steps=20"),
         ("circuitlab export", "")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["graphs.md", "dictionaries.md", "causal.md", "pretrained.md"])
def test_doc_runs_on_what_its_commands_write(name, tmp_path, monkeypatch, one_thread):
    """The doc's Python blocks (and graphs.md's `circuitlab graph` line) on the documented commands' own output,
    each command run at a small step count (SMALL), in the order MADE_BY lists them: what the stand-ins stand for."""
    import shlex

    from circuitlab.cli import main

    monkeypatch.chdir(tmp_path)
    commands = list(dict.fromkeys(c for need in NEEDS[name] for c in MADE_BY[need].values()))
    for command in commands:
        extra = next(opts for prefix, opts in SMALL if command.startswith(prefix))
        assert main([*shlex.split(command)[1:], *shlex.split(extra)]) == 0, command
    doc = ROOT / "docs" / name
    if name == "graphs.md":
        line = next(l for l in doc.read_text().splitlines() if l.startswith("circuitlab graph --checkpoint runs/features"))
        assert main([*shlex.split(line)[1:], "--dashboard-tokens", "0"]) == 0
    found = blocks(doc)
    assert helpers.run_blocks(found, tmp_path, f"docs/{name}") == sum(info != "no-run" for _, info, _ in found)


def test_blocks_that_do_not_run_are_few_and_marked():
    """Only `python` or `python no-run` info strings (a typo would silently skip a block), and no more no-run
    blocks than NO_RUN allows."""
    for doc in DOCS:
        infos = [info for _, info, _ in blocks(doc)]
        assert set(infos) <= {"", "no-run"}, f"docs/{doc.name}: unknown info strings {set(infos) - {'', 'no-run'}}"
        assert infos.count("no-run") <= NO_RUN.get(doc.name, 0), f"docs/{doc.name}: more no-run blocks than NO_RUN"


YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", flags=re.S | re.M)
MODEL_FIXTURES = {"runs/demo/2l": "demo", "runs/mlp-4l": "mlp-4l"}


def test_shown_dictionary_configs_fit_the_model_they_name(tmp_path, monkeypatch):
    """A `sae train` YAML shown in a doc (one with model: and dictionaries:) names hooks its model has: the
    config is read by the command's own loader and every hook is looked up in that model."""
    import yaml

    from circuitlab.experiments.sae_train import load_sae_config
    from circuitlab.training import load_checkpoint

    monkeypatch.chdir(tmp_path)
    shown = [(doc.name, block) for doc in DOCS for block in YAML_BLOCK.findall(doc.read_text())
             if {"model", "dictionaries"} <= set(yaml.safe_load(block) or {})]
    assert shown, "no sae train config shown in the docs"
    for name, block in shown:
        (tmp_path / "shown.yaml").write_text(block)
        data = load_sae_config(str(tmp_path / "shown.yaml"), [])
        FIXTURES[MODEL_FIXTURES[data["model"]]](tmp_path)
        hooks = set(load_checkpoint(data["model"])[0].hook_names())
        for d in data["dictionaries"]:
            for hook in (d.get("hook_name"), d.get("out_hook_name")):
                assert hook is None or hook in hooks, f"docs/{name}: {hook} is not a hook of {data['model']}"


def test_a_block_that_fails_fails_the_test_naming_its_line(tmp_path):
    """The shared runner (helpers.run_blocks, also the README's) runs blocks in one namespace and stops at the
    first that raises, naming its line; a no-run block is left out."""
    text = "# doc\n```python\nx = 1\n```\n\n```python no-run\nraise SystemError\n```\n```python\nassert x == 2\n```\n"
    found = helpers.python_blocks(text)
    assert [(line, info) for line, info, _ in found] == [(2, ""), (6, "no-run"), (9, "")]
    with pytest.raises(pytest.fail.Exception, match="docs/x.md python block at line 9 fails: AssertionError"):
        helpers.run_blocks(found, tmp_path, "docs/x.md")
    assert helpers.run_blocks(found[:2], tmp_path, "docs/x.md") == 1
