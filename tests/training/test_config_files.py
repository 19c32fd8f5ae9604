"""training/config_files.py: a run config found by path, by name in ./configs, or among the bundled ones; an
unknown name is one line listing the bundled configs."""
import pytest

from circuitlab.errors import ConfigError
from circuitlab.training.config_files import BUNDLED_CONFIGS, bundled_configs, resolve_config


def test_a_name_finds_the_working_directorys_config_before_the_bundled_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config("demo") == BUNDLED_CONFIGS / "demo.yaml"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.yaml").write_text("model: {}\n")
    assert resolve_config("demo").resolve() == (tmp_path / "configs" / "demo.yaml").resolve()
    (tmp_path / "mine.yaml").write_text("model: {}\n")
    assert resolve_config("mine.yaml").name == "mine.yaml"


def test_an_unknown_name_lists_the_bundled_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "demo" in bundled_configs()
    with pytest.raises(ConfigError, match=r"config not found: nope \(bundled configs: .*demo"):
        resolve_config("nope")
