"""Read-only questions about store paths: `list`, `info`, `diff`."""

from __future__ import annotations

import click

from llmgw_store.cli.app import Context, cli


@cli.command(name="list")
@click.pass_obj
def list_cmd(obj: Context) -> None:
    """List the store paths the index holds: path, size, entries (files, links, directories), last used."""
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.queries import list_paths

    r = list_paths(obj.root)
    lines = [f"{p.path}  {human_size(p.size):>10}  {p.files:6d} entries  last used {p.last_used[:19]}Z"
             for p in r.paths]
    obj.emit(r.to_json(), "\n".join(lines))


@cli.command()
@click.argument("path")
@click.pass_obj
def info(obj: Context, path: str) -> None:
    """Show what the index and manifest say of PATH (a store path, its name or its key, PROFILE or PROFILE@N)."""
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.queries import path_info

    r = path_info(path, obj.root)
    row, manifest = r.row, r.manifest or {}
    text = "\n".join([
        f"path:         {row.path}",
        f"engine:       {row.engine} {row.version} ({row.variant})",
        f"key:          {row.key}",
        f"as of:        {row.as_of}",
        f"uv:           {row.uv_version}",
        f"python:       {row.python}",
        f"size:         {human_size(row.size)} in {row.files} entries",
        f"content hash: {row.content_hash}",
        f"built:        {row.created} in {row.build_seconds:.1f}s",
        f"last used:    {row.last_used}",
        f"requirements: {', '.join(manifest.get('requirements', []))}",
    ])
    obj.emit(r.to_json(), text)


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
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.diff import diff as do_diff

    r = do_diff(a, b, root=obj.root)
    lines = [f"+ {p['name']} {p['version']}" for p in r.added]
    lines += [f"- {p['name']} {p['version']}" for p in r.removed]
    lines += [f"↑ {p['name']} {p['from']} -> {p['to']}" for p in r.upgraded]
    lines += [f"↓ {p['name']} {p['from']} -> {p['to']}" for p in r.downgraded]
    sign = "+" if r.size_change >= 0 else "-"
    lines.append(f"size: {human_size(r.a['size'])} -> {human_size(r.b['size'])} ({sign}{human_size(abs(r.size_change))})")
    obj.emit(r.to_json(), "\n".join(lines))
