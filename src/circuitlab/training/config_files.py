"""Find a run config by path or by name: configs/NAME.yaml in the working directory, else the configs
bundled with the package (circuitlab/configs/, shipped as package data so `pip install` carries them)."""
from __future__ import annotations

from pathlib import Path

from circuitlab.errors import ConfigError

BUNDLED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def bundled_configs() -> list[str]:
    """Names of the run configs that ship with the package."""
    return sorted(p.stem for p in BUNDLED_CONFIGS.glob("*.yaml"))


def resolve_config(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for folder in (Path("configs"), BUNDLED_CONFIGS):
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    available = bundled_configs()
    raise ConfigError(f"config not found: {name_or_path}" +
                      (f" (bundled configs: {', '.join(available)})" if available else ""))
