"""Click app. Each command parses, calls one library function, and formats what it returns.

Output contract: results on stdout (a store path, a table, or with --json one JSON document);
progress and errors on stderr, one line each. Exit codes: 0 ok, 1 failed, 2 bad usage or input,
75 a lock could not be had in time (cron may simply try again).
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from llmgw_store.errors import CommandError, StoreError

PROG = "llmgw-store"


class Context:
    def __init__(self, root: str | None, as_json: bool, verbose: int):
        self.root, self.as_json, self.verbose = root, as_json, verbose
        self.started = time.monotonic()

    def progress(self, message: str) -> None:
        if message.startswith("$ ") and self.verbose < 1:
            return
        click.echo(f"[{time.monotonic() - self.started:6.1f}s] {message}", err=True)

    def emit(self, document: Any, text: str) -> None:
        if self.as_json:
            click.echo(json.dumps(document, indent=2, sort_keys=True, default=str))
        elif text:
            click.echo(text)


class StoreGroup(click.Group):
    """Turns every StoreError into one line on stderr and its exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StoreError as err:
            click.echo(f"{PROG}: error: {err}", err=True)
            obj = ctx.find_object(Context)
            if isinstance(err, CommandError) and err.output_tail and obj is not None and obj.verbose:
                click.echo(err.output_tail, err=True)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo(f"{PROG}: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=StoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--root", type=click.Path(file_okay=False), envvar="LLMGW_STORE_ROOT",
              help="Store root. Default: $LLMGW_STORE_ROOT, else /var/lib/llmgw-store (root) or $XDG_DATA_HOME/llmgw-store.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; human text goes to stderr.")
@click.option("-v", "--verbose", count=True, help="Show the commands run, and a failed command's output.")
@click.version_option(package_name="llmgw-store", prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, root: str | None, as_json: bool, verbose: int) -> None:
    """A content-addressed store for the uv-built Python environments of LLM inference engines.

    \b
    Example:
      llmgw-store --root ./.llmgw-store build examples/black.toml
    """
    ctx.obj = Context(root, as_json, verbose)


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--version", "version", help="Engine version to build (default: the recipe's, else the latest release).")
@click.option("--variant", help="Which [[build]] of the recipe (default: the first).")
@click.option("--as-of", help="Resolve as the index stood at this ISO 8601 time (default: the recipe's as_of, else publication + 24 h).")
@click.option("--index-url", default="https://pypi.org/simple", show_default=True, help="Package index (simple API, PEP 691 JSON).")
@click.option("--uv", "uv_path", type=click.Path(dir_okay=False), envvar="LLMGW_STORE_UV",
              help="Use this uv binary instead of the store's pinned one (its --version enters the key). Env: LLMGW_STORE_UV.")
@click.option("--python-preference", envvar="LLMGW_STORE_PYTHON_PREFERENCE", default="only-managed", show_default=True,
              type=click.Choice(["only-managed", "managed", "system", "only-system"]),
              help="Where the interpreter may come from; only-managed falls back to system when downloads fail.")
@click.option("--lock-timeout", type=float, default=3600.0, show_default=True,
              help="Seconds to wait for another process building the same key (then exit 75).")
@click.pass_obj
def build(obj: Context, recipe: str, version: str | None, variant: str | None, as_of: str | None,
          index_url: str, uv_path: str | None, python_preference: str, lock_timeout: float) -> None:
    """Build RECIPE into the store (or find it there) and print its store path.

    \b
    Examples:
      llmgw-store build examples/black.toml
      llmgw-store --json build vllm.toml --variant cu128 --as-of 2025-06-01T00:00:00Z
    """
    from llmgw_store.builder import BuildOptions, build as do_build

    options = BuildOptions(version=version, variant=variant, as_of=as_of, index_url=index_url, uv=uv_path,
                           python_preference=python_preference, lock_timeout=lock_timeout)
    result = do_build(recipe, options, root=obj.root, progress=obj.progress)
    obj.emit(result.to_json(), str(result.path))


@cli.command(name="list")
@click.pass_obj
def list_cmd(obj: Context) -> None:
    """List the store paths the index holds: name, size, files, last used."""
    from llmgw_store.queries import list_paths

    rows = list_paths(obj.root)
    lines = [
        f"{r['path']}  {r['size'] / 1e6:9.1f} MB  {r['files']:6d} files  last used {r['last_used'][:19]}Z"
        for r in rows
    ]
    obj.emit(rows, "\n".join(lines))


@cli.command()
@click.argument("path")
@click.pass_obj
def info(obj: Context, path: str) -> None:
    """Show what the index and manifest say of PATH (a store path, its name or its key)."""
    from llmgw_store.queries import path_info

    row = path_info(path, obj.root)
    manifest = row.get("manifest") or {}
    text = "\n".join([
        f"path:         {row['path']}",
        f"engine:       {row['engine']} {row['version']} ({row['variant']})",
        f"key:          {row['key']}",
        f"as of:        {row['as_of']}",
        f"uv:           {row['uv_version']}",
        f"python:       {row['python']}",
        f"size:         {row['size'] / 1e6:.1f} MB in {row['files']} entries",
        f"content hash: {row['content_hash']}",
        f"built:        {row['created']} in {row['build_seconds']:.1f}s",
        f"last used:    {row['last_used']}",
        f"requirements: {', '.join(manifest.get('requirements', []))}",
    ])
    obj.emit(row, text)


def main() -> None:
    cli(prog_name=PROG)
