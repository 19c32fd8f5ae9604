"""Subcommands of the `circuitlab` command (see circuitlab.cli).

A command with subcommands of its own (`circuitlab sae train`, `circuitlab lens show`) keeps a table
name -> (help, example, add_arguments, run) and hands it to add_subcommands / run_subcommand.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

Subcommands = Mapping[str, tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[..., int]]]


def add_subcommands(p: argparse.ArgumentParser, table: Subcommands, command: str) -> None:
    """One sub-parser per entry, each with its help and example."""
    sub = p.add_subparsers(dest=f"{command}_command", metavar="<subcommand>")
    for name, (help_, example, add, run_) in table.items():
        sp = sub.add_parser(name, help=help_, description=help_, epilog=f"example:\n  {example}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        add(sp)
        sp.set_defaults(**{f"_{command}_run": run_})


def run_subcommand(args: argparse.Namespace, table: Subcommands, command: str) -> Any:
    """Run the chosen subcommand; none chosen is a one-line error listing them."""
    from circuitlab.errors import CircuitlabError

    run_ = getattr(args, f"_{command}_run", None)
    if run_ is None:
        raise CircuitlabError(f"choose a subcommand: {', '.join(table)} (circuitlab {command} <subcommand> --help)")
    return run_(args)
