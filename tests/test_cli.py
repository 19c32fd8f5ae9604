"""The `circuitlab` command: help, info, clean errors."""
import subprocess
import sys

from circuitlab.cli import command_names, main


def test_every_command_has_help_with_example(capsys):
    import importlib

    for module_name in command_names():
        module = importlib.import_module(f"circuitlab.commands.{module_name}")
        name = getattr(module, "NAME", module_name.replace("_", "-"))
        try:
            main([name, "--help"])
        except SystemExit as e:
            assert e.code == 0
        out = capsys.readouterr().out
        assert "example:" in out and "circuitlab" in out, name


def test_info_lists_presets(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "attn-only-2l" in out and "quick" in out


def test_bad_input_is_one_line_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "circuitlab.cli", "info", "--preset", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "unknown model preset 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
