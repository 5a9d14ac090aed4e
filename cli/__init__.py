"""The `llmgw-store` command: parses arguments, calls one library function, formats its result.

`main` is the console script: the fast path (cli/fast.py: build hits, activate, rollback, without
click) and otherwise the click app. `cli` (the click group) is loaded on first use, so importing
this package loads neither click nor the library.
"""

from __future__ import annotations

__all__ = ["cli", "main"]


def main() -> None:
    from llmgw_store.cli.fast import main as run

    run()


def __getattr__(name: str) -> object:
    if name == "cli":
        from llmgw_store.cli.main import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
