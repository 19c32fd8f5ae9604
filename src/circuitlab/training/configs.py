"""Find a run config by path or by name (configs/NAME.yaml in the working directory or the repo)."""
from __future__ import annotations

from pathlib import Path

from circuitlab.errors import ConfigError

REPO_CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def resolve_config(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for folder in (Path("configs"), REPO_CONFIGS):
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    available = sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml")) if REPO_CONFIGS.is_dir() else []
    raise ConfigError(f"config not found: {name_or_path}" +
                      (f" (bundled configs: {', '.join(available)})" if available else ""))
