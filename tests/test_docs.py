"""Every ```python block in docs/*.md runs as written, as the README's do (tests/test_readme.py): a doc's blocks
run in order in one namespace (as a reader pastes them into one session), in a fresh folder holding what the doc
says it reads (`runs/demo/2l` as `circuitlab demo` writes it, ...): tiny stand-ins made here, in that layout.

A doc whose examples need names (`model`, `tokenizer`, ...) defines them in a first block a reader can run
too. A block that cannot run here says so where a reader sees it, in its info string: ```python no-run
(with the reason in the text around it); there are few, and this file counts them.
"""
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", flags=re.S | re.M)

# What each doc reads besides itself (made by the fixtures below, in the layout the commands write).
NEEDS: dict[str, tuple[str, ...]] = {}
# Docs whose blocks take longer than a few seconds: run by `make test-slow` only, with the reason.
SLOW: dict[str, str] = {}
# Docs whose blocks do not run yet (issue 32): expected to fail, strictly, so that a doc made runnable must
# leave this list. Empty it, do not grow it.
NOT_YET = {"analysis.md", "causal.md", "circuits.md", "dictionaries.md", "forge.md", "graphs.md", "induction.md",
           "lens.md", "pretrained.md", "report.md", "serve.md", "steering.md"}
# The most no-run blocks each doc may have (a block that cannot run here must be the exception).
NO_RUN: dict[str, int] = {}


def blocks(doc: Path) -> list[tuple[int, str, str]]:
    """(line, info string, code) of every ```python block."""
    text = doc.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1).strip(), m.group(2)) for m in BLOCK.finditer(text)]


def demo_run(folder: Path) -> None:
    """runs/demo/{2l,1l} as `circuitlab demo` writes them: checkpoints of the demo's models (its presets, heads
    and BPE tokenizer), untrained and narrower (d_model 32) so that every example takes a moment."""
    from circuitlab import ModelConfig, Transformer
    from circuitlab.data.stories import stories_text
    from circuitlab.data.tokenizers import BPETokenizer
    from circuitlab.training import save_checkpoint

    tokenizer = BPETokenizer.train([stories_text(200)], vocab_size=512)
    for name, preset in (("2l", "attn-only-2l"), ("1l", "attn-only-1l")):
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset(preset, d_model=32, n_heads=4, d_vocab=tokenizer.vocab_size, n_ctx=64)
        save_checkpoint(folder / "runs" / "demo" / name, Transformer(cfg), tokenizer)


FIXTURES = {"demo": demo_run}


def run_doc(doc: Path, folder: Path) -> int:
    """Runs the doc's blocks in `folder` (the current directory); returns how many ran."""
    for need in NEEDS.get(doc.name, ()):
        FIXTURES[need](folder)
    namespace: dict = {"__name__": f"__{doc.stem}__"}
    ran = 0
    for line, info, code in blocks(doc):
        if "no-run" in info.split():
            continue
        file = folder / f"{doc.stem}_line_{line}.py"  # a real file: nnsight reads its trace's source back
        file.write_text(code)
        try:
            exec(compile(code, str(file), "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - say which block, then fail
            pytest.fail(f"docs/{doc.name} python block at line {line} fails: {type(e).__name__}: {e}\n{code}")
        ran += 1
    return ran


def marks(doc: Path) -> list:
    return ([pytest.mark.slow] if doc.name in SLOW else []) + (
        [pytest.mark.xfail(strict=True, reason="not runnable yet (issue 32)")] if doc.name in NOT_YET else [])


@pytest.mark.parametrize("doc", [pytest.param(d, id=d.name, marks=marks(d)) for d in DOCS])
def test_doc_python_blocks_run_as_written(doc, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    run_doc(doc, tmp_path)


def test_blocks_that_do_not_run_are_few_and_marked():
    """Only `python` or `python no-run` info strings (a typo would silently skip a block), and no more no-run
    blocks than NO_RUN allows."""
    for doc in DOCS:
        infos = [info for _, info, _ in blocks(doc)]
        assert set(infos) <= {"", "no-run"}, f"docs/{doc.name}: unknown info strings {set(infos) - {'', 'no-run'}}"
        assert infos.count("no-run") <= NO_RUN.get(doc.name, 0), f"docs/{doc.name}: more no-run blocks than NO_RUN"
