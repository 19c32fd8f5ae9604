"""Bounded work: every count or size option, at the largest values a user could type, under a memory cap
(`ulimit -v` in a subprocess) ends in a clean finish or a clean one-line refusal naming the limit, never an
out-of-memory kill or a traceback. One tiny model (char tokenizer, 1 layer) for all commands."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.training import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Once upon a time, Lily saw a cat. The cat was happy. Lily said hello to the cat. The dog ran. "
CAP_KB = 3_000_000  # 3 GB of address space: torch itself takes ~0.6 GB; an unbounded count asks for far more
HUGE = "1000000000000"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    torch.manual_seed(0)
    tok = CharTokenizer.from_texts([TEXT])
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=tok.vocab_size, n_ctx=64)
    save_checkpoint(root / "run" / "checkpoint", Transformer(cfg), tok)
    (root / "pos.txt").write_text("Lily saw a cat.\nThe cat was happy.\n")
    (root / "neg.txt").write_text("The dog ran.\nLily said hello.\n")
    (root / "clean.txt").write_text("Lily saw a cat\n")
    (root / "corrupt.txt").write_text("Lily saw a dog\n")
    return root


def capped(args: list[str], cwd: Path, cap_kb: int = CAP_KB, timeout: float = 240) -> subprocess.CompletedProcess:
    """`circuitlab ARGS` in a subprocess whose address space is capped at cap_kb (ulimit -v), on one thread."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = f"ulimit -v {cap_kb}; exec {sys.executable} -m circuitlab.cli " + " ".join(f"'{a}'" for a in args)
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def clean_refusal(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for f in fragments:
        assert f in lines[0], lines[0]


def clean_finish(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr


def test_attribute_ig_steps_and_occlusion_are_bounded(where):
    ckpt = str(where / "run")
    long_prompt = (TEXT * 2)[:60]
    # the largest accepted step count, on the longest prompt, runs in chunks within the cap
    clean_finish(capped(["attribute", "--checkpoint", ckpt, "--prompt", long_prompt, "--method", "ig",
                         "--steps", "1024"], where))
    # beyond it: one line naming the limit and why (it used to allocate 18.6 GiB at 50 000)
    clean_refusal(capped(["attribute", "--checkpoint", ckpt, "--prompt", "Lily", "--steps", "50000"], where),
                  "--steps", "from 1 to 1024", "eigenproblem")
    clean_refusal(capped(["attribute", "--checkpoint", ckpt, "--prompt", "Lily", "--steps", HUGE], where), "--steps")
    clean_finish(capped(["attribute", "--checkpoint", ckpt, "--prompt", long_prompt, "--method", "occlusion",
                         "--span", "1"], where))
    clean_refusal(capped(["attribute", "--checkpoint", ckpt, "--prompt", "Lily", "--method", "occlusion",
                          "--span", HUGE], where), "span")
    clean_refusal(capped(["attribute", "--checkpoint", ckpt, "--prompt", "Lily", "--pos", HUGE], where), "pos")


def test_ig_chunks_agree_with_one_pass():
    """Chunked path points give the same scores as one pass (float64)."""
    from circuitlab.analysis.input_attribution import integrated_gradients

    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8)).double()
    tokens = torch.tensor([1, 5, 3, 7])
    one = integrated_gradients(model, tokens, target=2, steps=16, batch_size=16).scores
    chunked = integrated_gradients(model, tokens, target=2, steps=16, batch_size=3).scores
    auto = integrated_gradients(model, tokens, target=2, steps=16).scores
    torch.testing.assert_close(chunked, one)
    torch.testing.assert_close(auto, one)
    riemann = integrated_gradients(model, tokens, target=2, steps=5000, rule="riemann")
    assert riemann.completeness_error < 1e-3
