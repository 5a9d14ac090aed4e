"""Read-only questions about store paths: `list`, `info`, `diff`."""

from __future__ import annotations

import click

from llmgw_store.cli import handlers
from llmgw_store.cli.app import Context, cli, spec_params


@cli.command(name="list")
@spec_params("list")
@click.pass_obj
def list_cmd(obj: Context) -> None:
    """List the store paths the index holds: path, size, entries (files, links, directories), last used."""
    from llmgw_store.integrity.queries import list_paths

    doc = list_paths(obj.root).to_json()
    obj.emit(doc, handlers.listed(doc))


@cli.command()
@spec_params("info")
@click.pass_obj
def info(obj: Context, path: str) -> None:
    """Show what the index and manifest say of PATH (a store path, its name or its key, PROFILE or PROFILE@N)."""
    from llmgw_store.integrity.queries import path_info

    doc = path_info(path, obj.root).to_json()
    obj.emit(doc, handlers.described(doc))


@cli.command()
@click.argument("a")
@click.argument("b")
@click.pass_obj
def diff(obj: Context, a: str, b: str) -> None:
    """Packages added, removed, upgraded and downgraded from A to B, and the size change.

    A and B are store paths (or names or keys), PROFILE (its current generation) or PROFILE@N.

    \b
    Example:
      llmgw-store diff vllm@6 vllm@7
    """
    from llmgw_store.app.units import human_size
    from llmgw_store.integrity.diff import diff as do_diff

    r = do_diff(a, b, root=obj.root)
    lines = [f"+ {p['name']} {p['version']}" for p in r.added]
    lines += [f"- {p['name']} {p['version']}" for p in r.removed]
    lines += [f"↑ {p['name']} {p['from']} -> {p['to']}" for p in r.upgraded]
    lines += [f"↓ {p['name']} {p['from']} -> {p['to']}" for p in r.downgraded]
    sign = "+" if r.size_change >= 0 else "-"
    lines.append(f"size: {human_size(r.a['size'])} -> {human_size(r.b['size'])} ({sign}{human_size(abs(r.size_change))})")
    obj.emit(r.to_json(), "\n".join(lines))
