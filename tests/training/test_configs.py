"""training/configs.py, the deprecated name of training/config_files.py: it still imports for one release,
warns, and gives config_files.py's functions themselves."""
import importlib
import sys

import pytest


def test_the_old_name_warns_and_resolves_to_config_files(monkeypatch):
    import circuitlab.training.config_files as config_files

    monkeypatch.delitem(sys.modules, "circuitlab.training.configs", raising=False)
    with pytest.warns(DeprecationWarning, match=r"circuitlab\.training\.configs is renamed circuitlab\.training\.config_files"):
        old = importlib.import_module("circuitlab.training.configs")
    assert old.resolve_config is config_files.resolve_config and old.bundled_configs is config_files.bundled_configs
    assert old.resolve_config("demo") == config_files.resolve_config("demo")
