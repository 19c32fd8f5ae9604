"""The package's shape, checked from the source: every import (top-level or inside a function) read
with ast, so a lazy import counts like any other."""
from __future__ import annotations

import ast
import re
import functools
from pathlib import Path

import circuitlab

PACKAGE = Path(circuitlab.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # the tree is read once for all the tests here
def imports_of(path: Path) -> tuple[tuple[str, int], ...]:
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
    return tuple(found)


def library_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_library_code_imports_no_test_tools():
    """unittest.mock, pytest and friends are for tests; the library must not need them."""
    offenders = [f"{module_name(p)}:{line} imports {name}" for p in library_files() for name, line in imports_of(p)
                 if name.split(".")[0] in ("unittest", "pytest", "_pytest")]
    assert not offenders, "\n".join(offenders)


# The package's floors, bottom up: a module may import its own layer and the ones below.
LAYERS = [
    ("config", "errors", "atomic", "names", "display", "perf", "memory", "checks", "textfile", "spec"),
    ("model",),
    ("data", "training"),
    ("forge", "pretrained"),
    ("analysis", "dictionaries"),
    ("graphs",),
    ("viz",),
    ("methods",),
    ("report", "serve"),
    ("experiments", "studies"),
    ("commands", "cli"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
# Imports that break the layering today, each with the reason it is still here and who removes it.
ALLOWED: set[tuple[str, str]] = set()


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "circuitlab":
        return None
    if len(parts) == 1:
        return 0  # the package root re-exports the ground floor and the model
    if parts[1] not in RANK:
        raise AssertionError(f"{module}: a package LAYERS does not place; add it there and to the floors of docs/architecture.md")
    return RANK[parts[1]]


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in library_files():
        name = module_name(path)
        graph[name] = {m for m, _ in imports_of(path) if m.split(".")[0] == "circuitlab" and m != name}
    return graph


def test_imports_point_downward():
    """Each module imports only from its layer or below (lazy imports inside functions included)."""
    upward = []
    for path in library_files():
        name = module_name(path)
        if name == "circuitlab":
            continue
        mine = layer_of(name)
        for imported, line in imports_of(path):
            theirs = layer_of(imported)
            if theirs is not None and theirs > mine and (name, imported) not in ALLOWED:
                upward.append(f"{name}:{line} imports {imported} ({LAYERS[theirs][0]} is above {LAYERS[mine][0]})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(set(upward)))


def test_no_import_cycles_between_packages():
    """No two packages import each other, directly or through others (imports inside a package may
    cycle through its __init__, which Python resolves; between packages a cycle is a layering bug)."""
    graph: dict[str, set[str]] = {}
    for name, deps in import_graph().items():
        if name == "circuitlab":
            continue
        pkg = ".".join(name.split(".")[:2])
        graph.setdefault(pkg, set()).update(".".join(d.split(".")[:2]) for d in deps if d != "circuitlab")
    for pkg in graph:
        graph[pkg].discard(pkg)
    allowed = {(".".join(a.split(".")[:2]), ".".join(b.split(".")[:2])) for a, b in ALLOWED}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if (node, nxt) in allowed:
                    continue
                if nxt == start:
                    cycles.append(" -> ".join(path + [start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    graph = {name: {d for d in deps if d in graph} for name, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_import_circles_between_modules():
    """No module reaches itself through imports, lazy ones inside functions and a package's __init__
    included: a circle means two modules share one job (split out what both need, one level down)."""
    circles = import_circles(import_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_analysis_does_not_import_dictionaries():
    """Dictionaries stand on analysis (and graphs on both); the reverse would be a circle in the making."""
    offenders = [f"{module_name(p)}:{line} imports {name}" for p in library_files()
                 if module_name(p).startswith("circuitlab.analysis")
                 for name, line in imports_of(p) if name.startswith("circuitlab.dictionaries")]
    assert not offenders, "\n".join(offenders)


ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def doc_floors(text: str) -> list[set[str]]:
    """The floors table of docs/architecture.md ("## The floors": | floor | packages | ... |), bottom up: each floor's
    packages and ground-floor modules as LAYERS names them (`model/` -> model, `config.py` -> config)."""
    section = text.split("\n## The floors", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| *(\d+) *\| *([^|]*?) *\|", section, flags=re.M)
    floors: dict[int, set[str]] = {}
    for floor, cell in rows:
        floors[int(floor)] = {re.sub(r"(/|\.py)$", "", name) for name in re.findall(r"`([^`]+)`", cell)}
    assert sorted(floors) == list(range(len(floors))), f"floors numbered 0.. without gaps: {sorted(floors)}"
    return [floors[i] for i in range(len(floors))]


def test_the_floors_of_the_architecture_doc_are_LAYERS():
    """docs/architecture.md draws the floors; it cannot go stale: its table is LAYERS, floor by floor."""
    drawn = doc_floors(ARCHITECTURE.read_text())
    assert drawn == [set(names) for names in LAYERS], (
        "docs/architecture.md's floors table differs from LAYERS:\n"
        + "\n".join(f"floor {i}: doc {sorted(d)} vs LAYERS {sorted(l)}"
                    for i, (d, l) in enumerate(zip(drawn + [set()] * len(LAYERS), LAYERS)) if d != set(l)))


def test_the_floors_reader_reads_a_planted_table():
    text = ("# A\n\n## The floors\n\n| floor | packages | what |\n|---|---|---|\n| 1 | `model/` `cli.py` | up |\n"
            "| 0 | `config.py` | ground |\n\n## Next\n\n| 2 | `other/` | not in the section |\n")
    assert doc_floors(text) == [{"config"}, {"model", "cli"}]
