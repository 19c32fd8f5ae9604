"""Deprecated name of circuitlab.training.config_files (the run-config finder: resolve_config, bundled_configs),
kept for one release: beside training/config.py (RunConfig) the two names read as one. Importing it warns; every
name resolves to config_files.py's."""
from __future__ import annotations

import warnings
from typing import Any

from circuitlab.training import config_files as _config_files

warnings.warn("circuitlab.training.configs is renamed circuitlab.training.config_files (resolve_config, "
              "bundled_configs); the old name goes in the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_config_files, name)
