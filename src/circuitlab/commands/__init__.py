"""Subcommands of the `circuitlab` command (see circuitlab.cli)."""
