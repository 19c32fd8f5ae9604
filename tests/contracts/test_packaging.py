"""The package as users get it: bundled configs inside the package, a wheel that works without the
source tree, and no import that changes a notebook's state (matplotlib's backend) or drags in test tools."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import circuitlab
from circuitlab.training import RunConfig
from circuitlab.training.config_files import bundled_configs, resolve_config

ROOT = Path(__file__).resolve().parents[2]


def test_bundled_configs_live_inside_the_package(tmp_path, monkeypatch):
    """`pip install .` ships only the package folder: the configs must be in it, and found from any directory."""
    monkeypatch.chdir(tmp_path)  # no configs/ here
    package = Path(circuitlab.__file__).resolve().parent
    path = resolve_config("demo")
    assert package in path.resolve().parents
    assert RunConfig.load(path).name
    assert {"demo", "quick", "attn-only-2l"} <= set(bundled_configs())
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"configs/*.yaml"' in pyproject  # package data, so the wheel carries them


def test_configs_in_the_working_directory_come_first(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text("name: mine\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config("demo") == Path("configs/demo.yaml")


def test_importing_the_library_leaves_matplotlib_alone():
    """A notebook displaying our results imports viz/report/experiments: its plotting backend must stay
    what it was (no matplotlib.use), and pyplot (global figure state) must not be loaded, even to write PNGs."""
    code = """
import sys, matplotlib
matplotlib.use("svg")
import circuitlab.viz.qk_ov, circuitlab.viz.heads, circuitlab.viz.lens, circuitlab.viz.patching
import circuitlab.viz.probing, circuitlab.viz.training, circuitlab.viz.interactive, circuitlab.report
import circuitlab.experiments.demo, circuitlab.experiments.interpret, circuitlab.pretrained.importer
import torch, tempfile, pathlib
from circuitlab.viz.qk_ov import copying_scores_figure
path = pathlib.Path(tempfile.mkdtemp()) / "c.png"
copying_scores_figure(torch.zeros(2, 2)).save_png(path)
assert path.stat().st_size > 0
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(circuitlab.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["svg", "False"]


@pytest.mark.slow
def test_wheel_installs_and_runs_without_the_source_tree(tmp_path):
    """Build a wheel, install it into a fresh venv (dependencies borrowed from this one through a .pth,
    offline), and from a directory with no configs/: `circuitlab demo --help` and the demo config load."""
    # No PYTHONPATH: with the source tree on the path, pip would find circuitlab "already installed".
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(wheels), str(ROOT)], check=True, timeout=300, env=env)
    wheel = next(wheels.glob("circuitlab-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True, timeout=300, env=env)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies (torch, ...) from this venv; a path line in a .pth does not run that folder's .pth
    # files, so the editable install of the source tree stays invisible.
    (site / "shared_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import circuitlab; print(circuitlab.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert str(site) in where and str(ROOT) not in where
    help_text = subprocess.run([str(venv / "bin" / "circuitlab"), "demo", "--help"], cwd=work, env=env,
                               capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0, help_text.stderr
    assert "circuitlab demo --out" in help_text.stdout
    load = ("from circuitlab.training import RunConfig; from circuitlab.training.config_files import resolve_config;"
            "p = resolve_config('demo'); print(p); print(RunConfig.load(p).model['preset'])")
    loaded = subprocess.run([str(python), "-c", load], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    path, preset = loaded.stdout.split()
    assert path.startswith(str(site)) and preset.startswith("attn-only")
