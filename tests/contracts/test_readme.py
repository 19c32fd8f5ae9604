"""README code runs as written: every ```python block, in order, in one namespace (as a reader pastes
them into one session), in a fresh folder; and every command's --help example is a valid command line.
Both are in the fast suite so README code cannot rot unnoticed. Running the help examples themselves
(each trains or downloads) is slow."""
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
    assert len(blocks) >= 4
    assert all(info == "" for _, info, _ in blocks), "every README block runs: no info strings (no-run) there"
    monkeypatch.chdir(tmp_path)
    assert helpers.run_blocks(blocks, tmp_path, "README.md") == len(blocks)


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


def test_the_readme_names_every_commands_options_class():
    """The README's table of options classes stays true: each spec.Options class outside methods/ (a method's own
    are listed by `interpret`'s row) is named there with its module."""
    from test_spec import options_classes

    text = (ROOT / "README.md").read_text()
    package = ROOT / "src" / "circuitlab"
    missing = [f"{path.relative_to(package)}: {cls.__name__}" for cls, path in options_classes()
               if path.parent.name != "methods" and cls.__name__ not in text]
    assert not missing, "name these in the README's table of options classes:\n" + "\n".join(missing)
