"""The `circuitlab` command. Each subcommand lives in circuitlab/commands/<name>.py and defines
HELP, EXAMPLE, add_arguments(parser) and run(args) -> int (and optionally NAME); it is found
automatically."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import warnings

from circuitlab.errors import CircuitlabError, os_error_message, out_of_memory_message, set_command_line

# Order in `circuitlab --help`; any other module in circuitlab/commands is listed after these.
PREFERRED = ["demo", "train", "generate", "info"]


def command_names() -> list[str]:
    import pkgutil

    import circuitlab.commands as pkg

    found = [m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]
    return [n for n in PREFERRED if n in found] + sorted(n for n in found if n not in PREFERRED)


def _load(name: str):
    return importlib.import_module(f"circuitlab.commands.{name.replace('-', '_')}")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), like every other error of the command."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="circuitlab",
        description="Build, train, load and take apart transformer language models.",
        epilog="example: circuitlab demo --out runs/demo   (run `circuitlab <command> --help` for each)",
    )
    parser.add_argument("--version", action="version", version=f"circuitlab {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name in command_names():
        module = _load(name)
        name = getattr(module, "NAME", name.replace("_", "-"))  # NAME lets a module be called e.g. "import"
        p = sub.add_parser(name, help=module.HELP, description=module.HELP,
                           epilog=f"example:\n  {module.EXAMPLE}", formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _version() -> str:
    from circuitlab import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    set_command_line(list(argv) if argv is not None else sys.argv[1:])
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    # A warning is one line too, without the source line Python shows by default.
    default_format = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *_: f"circuitlab {args.command}: warning: {message}\n"
    from circuitlab.training.interrupts import restart_message, stop_signals_as_ctrl_c, stopped_by

    try:
        from circuitlab.memory import memory_limit

        # the termination signal saves and says what Ctrl-C does; --memory: the budget every size limit shares
        with stop_signals_as_ctrl_c(), memory_limit(getattr(args, "memory", None)):
            return int(args._run(args) or 0)
    except CircuitlabError as e:
        print(f"circuitlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only folder, a file in the way: one line too
        message = os_error_message(e)
        if message is None:
            raise
        print(f"circuitlab {args.command}: error: {message}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:  # the allocator refused: one line, not a traceback
        message = out_of_memory_message(e)
        if message is None:
            raise
        print(f"circuitlab {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # every stop says how to go on: a stage's own message, or start over
        signum = stopped_by()
        how = "terminated" if signum == signal.SIGTERM else "interrupted"
        print(f"circuitlab {args.command}: {how}: {str(e) or restart_message()}", file=sys.stderr)
        return 128 + int(signum)
    finally:
        warnings.formatwarning = default_format
        set_command_line(None)  # a later Python call in this process is not this command


if __name__ == "__main__":
    sys.exit(main())
