"""Types the library promises: every public function that takes a model says which (`model: Transformer`, or
nn.Module where any module will do), and `make test` runs the type checker before the tests."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "src" / "circuitlab"

# (file relative to src/circuitlab, function): why its `model` carries no type. Empty: every one does.
ALLOWED: dict[tuple[str, str], str] = {}


def public_functions(tree: ast.Module):
    """(qualified name, def) of module-level functions and methods of public classes whose names are public
    (dunders such as __init__ included); functions nested in functions are private to them."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not item.name.startswith("_") or item.name.startswith("__")):
                    yield f"{node.name}.{item.name}", item


def unannotated_models(source: str) -> list[str]:
    """The public functions of `source` whose parameter named `model` has no annotation (or says Any)."""
    found = []
    for name, fn in public_functions(ast.parse(source)):
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for a in args:
            if a.arg == "model" and (a.annotation is None or ast.unparse(a.annotation) in ("Any", "typing.Any")):
                found.append(name)
    return found


def test_every_public_function_taking_a_model_annotates_it():
    missing = []
    for path in sorted(LIBRARY.rglob("*.py")):
        rel = path.relative_to(LIBRARY).as_posix()
        missing += [f"{rel}: {name}" for name in unannotated_models(path.read_text())
                    if (rel, name) not in ALLOWED]
    assert not missing, ("annotate `model` (model: Transformer, under `if TYPE_CHECKING:` when the import would "
                         "point upward or close a circle):\n" + "\n".join(missing))


def test_the_scan_finds_what_it_should():
    planted = '''
from typing import Any
def a(model, x: int): ...
def b(model: Any): ...
def c(model: "Transformer"): ...
def _private(model): ...
class Browser:
    def __init__(self, model=None): ...
    def load(self, *, model): ...
    def _helper(self, model): ...
class _Hidden:
    def load(self, model): ...
def outer(model: Transformer):
    def inner(model): ...
'''
    assert unannotated_models(planted) == ["a", "b", "Browser.__init__", "Browser.load"]


def test_make_test_runs_the_type_checker_and_fails_on_its_errors():
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "no `test:` target in the Makefile"
    text = recipe.group(1)
    assert "$(PY) -m mypy" in text and "$(PY) -m pytest" in text, text
    assert "wait $$types; typed=$$?" in text and "exit $$(( tests || typed ))" in text, "mypy's status must count"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"mypy==[\d.]+"', pyproject), "mypy belongs in the dev extra (make setup installs it)"
    assert "[tool.mypy]" in pyproject and 'packages = ["circuitlab"]' in pyproject
