"""TransformerLens 4 (no HookedTransformer): to_transformer_lens gives a TransformerBridge over the exported
model, with our logits and hook values on every family. Slow: it builds its own environment once,
~/.cache/circuitlab-peers/transformer-lens-4 (a venv holding transformer-lens 4.3.0 alone, seeing this
environment's other packages through a .pth file), then runs the bridge tests there.

    pytest -m slow tests/pretrained/test_bridges_transformer_lens4.py
"""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

VERSION = "4.3.0"
ROOT = Path(__file__).resolve().parents[2]


def tl4_python() -> Path:
    """The peer environment's python, built when missing (needs the package index)."""
    venv = Path(os.environ.get("CIRCUITLAB_PEERS", Path.home() / ".cache" / "circuitlab-peers")) / "transformer-lens-4"
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import importlib.metadata as m; assert m.version('transformer-lens') == {VERSION!r}"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages (torch, transformers, ...) come after the venv's own transformer-lens 4
    Path(purelib, "circuitlab-dev.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", f"transformer-lens=={VERSION}"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        pytest.skip(f"could not install transformer-lens {VERSION}: {pip.stderr.strip().splitlines()[-1:]}")
    subprocess.run(check, check=True)
    return python


def run(python: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=ROOT, env=env)


def test_transformer_lens_4_bridges_every_family():
    python = tl4_python()
    result = run(python, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                 "tests/pretrained/test_families.py",
                 "-k", "transformer_bridge")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "6 passed" in result.stdout


def test_to_transformer_lens_returns_a_bridge_on_4_and_says_what_it_cannot_do():
    python = tl4_python()
    code = """
import torch
from circuitlab import ModelConfig, Transformer
from circuitlab.pretrained import BridgeError, to_transformer_lens, transformer_lens_major
assert transformer_lens_major() == 4
model = Transformer(ModelConfig.from_preset("llama-tiny", d_vocab=64, n_ctx=16)).eval()
bridge = to_transformer_lens(model)
assert type(bridge).__name__ == "TransformerBridge"
tokens = torch.randint(0, 64, (2, 9))
assert (bridge(tokens) - model(tokens)).abs().max() < 1e-4
for bad, words in ((ModelConfig.from_preset("attn-only-2l", d_vocab=64), "cannot be exported"),):
    try:
        to_transformer_lens(Transformer(bad))
    except BridgeError as e:
        assert words in str(e) and "\\n" not in str(e), str(e)
    else:
        raise AssertionError("an attention-only model crossed to TransformerLens 4")
try:
    to_transformer_lens(model, use_attn_result=True)
except BridgeError as e:
    assert "use_attn_result" in str(e)
print("ok")
"""
    result = run(python, "-c", code)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout[-2000:] + result.stderr[-3000:]
