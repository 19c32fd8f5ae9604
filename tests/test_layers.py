"""The package's shape, checked from the source: every import (top-level or inside a function) read
with ast, so a lazy import counts like any other."""
from __future__ import annotations

import ast
from pathlib import Path

import circuitlab

PACKAGE = Path(circuitlab.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            # `from circuitlab.x import y` may name a submodule y
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names
                      if (PACKAGE.parent / f"{base}.{alias.name}".replace(".", "/")).with_suffix(".py").is_file()
                      or (PACKAGE.parent / f"{base}.{alias.name}".replace(".", "/")).is_dir()]
    return found


def library_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_library_code_imports_no_test_tools():
    """unittest.mock, pytest and friends are for tests; the library must not need them."""
    offenders = [f"{module_name(p)}:{line} imports {name}" for p in library_files() for name, line in imports_of(p)
                 if name.split(".")[0] in ("unittest", "pytest", "_pytest")]
    assert not offenders, "\n".join(offenders)
