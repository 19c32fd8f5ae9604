"""README code runs as written: every ```python block, in order, in one namespace (as a reader pastes
them into one session), in a fresh folder; every line of its ```sh blocks is a `make` target of the Makefile or a
`circuitlab` command line the parser takes; and every command's --help example is a valid command line. All in the
fast suite so README code cannot rot unnoticed. Running the help examples and the README's real-model walk-through
themselves (each trains, imports or studies) is slow. Links: tests/contracts/test_self_contained.py."""
import json
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import helpers
from circuitlab.cli import _load, build_parser, command_names

ROOT = Path(__file__).resolve().parents[2]


# ~13 s on the 2-core machine under load (it trains 20 steps and builds the TransformerLens bridge): kept in
# the fast suite because a README that fails as written is the first thing a new user meets.
def test_every_readme_python_block_runs_as_written(tmp_path, monkeypatch, one_thread):
    blocks = helpers.python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 1
    assert all(info == "" for _, info, _ in blocks), "every README block runs: no info strings (no-run) there"
    monkeypatch.chdir(tmp_path)
    assert helpers.run_blocks(blocks, tmp_path, "README.md") == len(blocks)


SH_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", flags=re.S | re.M)


def shell_lines(text: str) -> list[list[str]]:
    """Every command line of the ```sh blocks, split as a shell would (comments dropped)."""
    return [shlex.split(line, comments=True) for block in SH_BLOCK.findall(text) for line in block.splitlines()
            if shlex.split(line, comments=True)]


def test_every_readme_shell_line_is_a_make_target_or_a_circuitlab_command():
    lines = shell_lines((ROOT / "README.md").read_text())
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    assert sum(argv[0] == "circuitlab" for argv in lines) >= 5 and ["make", "test"] in lines
    for argv in lines:
        if argv[0] == "make":
            assert len(argv) == 2 and argv[1] in targets, f"{shlex.join(argv)}: no such target in the Makefile"
        else:
            assert argv[0] == "circuitlab", f"{shlex.join(argv)}: a README command is make or circuitlab"
            build_parser().parse_args(argv[1:])  # argparse exits 2 on a wrong option


def test_the_shell_line_reader_drops_comments_and_keeps_quotes():
    text = "# t\n```sh\nmake demo   # trains\n\ncircuitlab x --prompt \"a # b\"\n```\n```python\nmake = 1\n```\n"
    assert shell_lines(text) == [["make", "demo"], ["circuitlab", "x", "--prompt", "a # b"]]


def walkthrough() -> list[list[str]]:
    """The README's real-model walk-through: the ```sh block that imports the built-in SmolLM2."""
    block = next(b for b in SH_BLOCK.findall((ROOT / "README.md").read_text()) if "circuitlab import smollm2" in b)
    return [shlex.split(line, comments=True) for line in block.splitlines() if shlex.split(line, comments=True)]


@pytest.mark.slow
def test_the_real_model_walkthrough_runs_as_written(tmp_path):
    """The walk-through's commands in order in a fresh folder (~4 minutes on 2 idle cores, 7 at load ~8): each exits
    0, and every claim of both studies holds, as the README says."""
    lines = walkthrough()
    assert [argv[:2] for argv in lines[:3]] == [["circuitlab", "import"], ["circuitlab", "study"], ["circuitlab", "study"]]
    for argv in lines:
        done = subprocess.run([sys.executable, "-m", "circuitlab.cli", *argv[1:], *(["--no-progress"] if argv[1] == "study" else [])],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr[-2000:]}"
    for study in ("induction", "ioi"):
        claims = json.loads((tmp_path / "runs" / "studies" / study / "results.json").read_text())["claims"]
        assert claims and all(c["holds"] for c in claims), [c["claim"] for c in claims if not c["holds"]]


def examples() -> list[tuple[str, str]]:
    return [(name, _load(name).EXAMPLE) for name in command_names()]


@pytest.mark.parametrize("name,example", examples())
def test_every_help_example_is_a_valid_command_line(name, example):
    argv = shlex.split(example.split("   (")[0])  # an example may end with a note in parentheses
    assert argv[0] == "circuitlab"
    build_parser().parse_args(argv[1:])  # argparse exits 2 on a wrong option


@pytest.mark.slow
def test_help_examples_run_as_written(tmp_path):
    """In the order a user meets them: the demo first (its runs are the other examples' input), import before
    export (its model is export's input); serve is left out (it runs until stopped). steer's example reads the
    user's two prompt files, made here. import fetches gpt2 from the hub: where the hub cannot be reached (as on
    the offline CI machine) import says so in one line, and import and export are reported as not run."""
    (tmp_path / "dragon.txt").write_text("The dragon flew over the hills.\nA big dragon lived in a cave.\n")
    (tmp_path / "cat.txt").write_text("The cat slept on the mat.\nA little cat chased a ball.\n")
    names = command_names()  # module names; import's is import_model
    order = ["demo", "import_model"] + [n for n in names if n not in ("demo", "import_model", "serve")]
    assert set(order) | {"serve"} == set(names)
    offline = []
    for name in order:
        if name == "export" and offline:
            continue  # its input is import's output
        argv = shlex.split(_load(name).EXAMPLE.split("   (")[0])
        done = subprocess.run([sys.executable, "-m", "circuitlab.cli", *argv[1:]], cwd=tmp_path,
                              capture_output=True, text=True)
        if name == "import_model" and "could not be fetched from the Hugging Face hub" in done.stderr:
            assert done.returncode == 2 and "Traceback" not in done.stderr  # the offline case is one line
            offline = ["import", "export"]
            continue
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
    if offline:
        warnings.warn(f"not run without the Hugging Face hub: {', '.join(offline)} examples", stacklevel=1)


def options_table() -> str:
    """The rows of docs/cli.md's table of options classes (its section "Where the flags come from"), which the
    README links to for every command's flags."""
    section = (ROOT / "docs" / "cli.md").read_text().split("\n## Where the flags come from", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("| `"))


def test_the_docs_name_every_commands_options_class():
    """The table of options classes stays true: each spec.Options class outside methods/ (a method's own are listed
    by `interpret`'s row) is named in a row of docs/cli.md's table, with its module (`module.py: Class`)."""
    from test_spec import options_classes

    named: dict[str, set[str]] = {}  # module file name -> the classes named after it, up to the next module
    for line in options_table().splitlines():
        for module, names in re.findall(r"(\w+\.py): (.*?)(?=\w+\.py:|\||$)", line):
            named.setdefault(module, set()).update(re.findall(r"\w+", names))
    package = ROOT / "src" / "circuitlab"
    found = options_classes()
    assert len(found) >= 20 and len(named) >= 15
    missing = [f"{path.relative_to(package)}: {cls.__name__}" for cls, path in found
               if path.parent.name != "methods" and cls.__name__ not in named.get(path.name, set())]
    assert not missing, "name these in docs/cli.md's table of options classes:\n" + "\n".join(missing)
