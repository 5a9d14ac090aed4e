"""The click app: the group (cli/app.py) with every command registered (cli/commands/)."""

from __future__ import annotations

from llmgw_store.cli import commands  # noqa: F401  (registers the commands)
from llmgw_store.cli.app import PROG, Context, cli

__all__ = ["PROG", "Context", "cli", "main"]


def main() -> None:
    cli(prog_name=PROG)
