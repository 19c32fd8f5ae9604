"""The shape of the code (docs/architecture.md, "Names": one place and one meaning per name; small modules with one job):
a public name is defined in one module of the package, no function is over 100 lines, no module is over
500 lines without a one-line reason at its top. Each allow-list below says why an entry is there; an entry
that no longer matches anything fails too, so the lists only shrink."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "circuitlab"
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 500
# A module over MAX_MODULE_LINES says why in one line among its first lines, e.g.
#     # long module: the forward pass is read top to bottom in one place; split, its speed would suffer
REASON = re.compile(r"^# long module: \S.{9,}$")
REASON_WITHIN = 5  # lines

# Public top-level names defined in two modules on purpose (commands/ is left out: each subcommand
# module defines the same protocol, add_arguments and run). None today.
SAME_NAME_ON_PURPOSE: dict[str, set[str]] = {}

# Collisions that belong to other pieces of issue 38, kept here so main stays green until they land.
# Whoever lands the piece deletes the entry (this test fails on an entry that no longer collides).
SAME_NAME_PENDING: dict[str, set[str]] = {}

# Functions over MAX_FUNCTION_LINES that other pieces of issue 38 split ("module:qualified name").
LONG_FUNCTIONS_PENDING: dict[str, str] = {}

# Modules over MAX_MODULE_LINES with no reason line yet, split or reasoned by other pieces of issue 38.
LONG_MODULES_PENDING: dict[str, str] = {}


def _modules(root: Path) -> dict[str, str]:
    """Package-relative path ("analysis/ablation.py") -> source, every module under root."""
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}


def public_definitions(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Public (no leading underscore) top-level function and class name -> the modules defining it,
    commands/ left out."""
    found: dict[str, set[str]] = defaultdict(set)
    for rel, source in _modules(root).items():
        if rel.startswith("commands/"):
            continue
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                found[node.name].add(rel)
    return found


def function_lengths(root: Path = PACKAGE) -> dict[str, int]:
    """"module:qualified.name" -> lines (decorators left out, the body's last line in), every function and
    method of the package, nested ones included (a nested function counts in its parent's lines too)."""
    lengths: dict[str, int] = {}

    def walk(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[f"{rel}:{name}"] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, rel, f"{name}.")
            else:
                walk(child, rel, prefix)

    for rel, source in _modules(root).items():
        walk(ast.parse(source), rel, "")
    return lengths


def long_modules(root: Path = PACKAGE) -> dict[str, tuple[int, str | None]]:
    """Modules over MAX_MODULE_LINES -> (lines, their reason line or None)."""
    found = {}
    for rel, source in _modules(root).items():
        lines = source.splitlines()
        if len(lines) > MAX_MODULE_LINES:
            reason = next((line for line in lines[:REASON_WITHIN] if REASON.match(line)), None)
            found[rel] = (len(lines), reason)
    return found


def test_a_public_name_is_defined_in_one_module():
    allowed = {**SAME_NAME_ON_PURPOSE, **SAME_NAME_PENDING}
    twice = {name: mods for name, mods in public_definitions().items() if len(mods) > 1}
    new = {name: sorted(mods) for name, mods in twice.items() if allowed.get(name) != mods}
    assert not new, f"a public name defined in more than one module (give each its own name): {new}"
    stale = sorted(set(allowed) - set(twice))
    assert not stale, f"no longer defined twice: delete these entries from the allow-lists of {__file__}: {stale}"


def test_no_function_over_100_lines():
    lengths = function_lengths()
    assert len(lengths) > 1000  # the scan saw the package
    long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    new = {name: n for name, n in long.items() if name not in LONG_FUNCTIONS_PENDING}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (split them into steps of one job each): {new}"
    stale = sorted(set(LONG_FUNCTIONS_PENDING) - set(long))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines: delete from LONG_FUNCTIONS_PENDING: {stale}"


def test_no_module_over_500_lines_without_a_reason():
    long = long_modules()
    unreasoned = {rel: n for rel, (n, reason) in long.items() if reason is None and rel not in LONG_MODULES_PENDING}
    assert not unreasoned, (f"modules over {MAX_MODULE_LINES} lines: split them into modules of one job, or say why "
                            f"not in a '# long module: <reason>' line among the first {REASON_WITHIN}: {unreasoned}")
    stale = sorted(rel for rel in LONG_MODULES_PENDING if rel not in long or long[rel][1] is not None)
    assert not stale, f"split or reasoned now: delete from LONG_MODULES_PENDING: {stale}"


def test_the_scans_see_what_they_look_for(tmp_path):
    """The scans on a planted package: a name in two modules (and in commands/, which is left out), a nested
    function's lines, a long module with and without its reason line."""
    (tmp_path / "commands").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "a.py").write_text(f"class A:\n    def f(self):\n        def g():\n            pass\n{body}\n"
                                   "def run():\n    pass\n")
    (tmp_path / "b.py").write_text("def run():\n    pass\n\n\ndef _private():\n    pass\n" + "\n" * 500)
    (tmp_path / "c.py").write_text('"""Doc."""\n# long module: planted to be long, and says so here\n' + "\n" * 500)
    (tmp_path / "commands" / "x.py").write_text("def run():\n    pass\n\n\ndef A():\n    pass\n")
    assert public_definitions(tmp_path) == {"A": {"a.py"}, "run": {"a.py", "b.py"}}
    lengths = function_lengths(tmp_path)
    assert lengths["a.py:A.f"] == MAX_FUNCTION_LINES + 3 and lengths["a.py:A.f.g"] == 2
    assert lengths["commands/x.py:run"] == 2
    assert long_modules(tmp_path) == {"b.py": (506, None),
                                      "c.py": (502, "# long module: planted to be long, and says so here")}
    assert not REASON.match("# long module: ok")
