"""The click app: the group (cli/app.py) with every command registered (cli/commands/)."""

from __future__ import annotations

from llmgw_store.cli import commands  # noqa: F401  (registers the commands)
from llmgw_store.cli.app import PROG, Context, cli

__all__ = ["PROG", "Context", "cli", "main"]


def main() -> None:
    """The full command (the console script comes here when the fast path does not answer)."""
    from llmgw_store.system import signals

    signals.guard()  # SIGTERM and SIGHUP end the command as ^C does: exit 143, 129
    cli(prog_name=PROG)
