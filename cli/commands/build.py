"""`build` and `build --check` (the body, shared with the fast path, is cli/handlers.py)."""

from __future__ import annotations

import click

from llmgw_store.cli import handlers
from llmgw_store.cli.app import Context, cli, spec_params


@cli.command()
@spec_params("build")
@click.pass_obj
def build(obj: Context, **kw) -> None:
    """Build RECIPE into the store (or find it there) and print its store path.

    \b
    Examples:
      llmgw-store build examples/black.toml
      llmgw-store build examples/vllm.toml --variant cu128 --as-of 2025-06-01T00:00:00Z --json
      llmgw-store build examples/black.toml --check    # is it reproducible? 0 identical, 1 differs
    """
    handlers.build(obj, kw)
