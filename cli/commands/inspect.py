"""What is inside a store path: `packages`, `why`, `export`."""

from __future__ import annotations

import click

from llmgw_store.cli.app import Context, cli


@cli.command()
@click.argument("target", metavar="PATH")
@click.pass_obj
def packages(obj: Context, target: str) -> None:
    """List the packages in PATH (a store path, its name or key, PROFILE or PROFILE@N): name and
    version; with --json also whether the recipe asked for it and the file hashes the lock pins.

    \b
    Example:
      llmgw-store packages vllm
    """
    from llmgw_store.integrity.inspect import packages as do_packages

    r = do_packages(target, root=obj.root)
    width = max((len(p["name"]) for p in r.packages), default=0)
    obj.emit(r.to_json(), "\n".join(f"{p['name']:<{width}}  {p['version']}" + ("" if p["installed"] else "  (locked, not installed)")
                                    for p in r.packages))


@cli.command()
@click.argument("target", metavar="PATH")
@click.argument("package")
@click.pass_obj
def why(obj: Context, target: str, package: str) -> None:
    """Why PACKAGE is in PATH: each chain of requirements from the recipe's down to it (read from
    the installed packages' metadata).

    \b
    Example:
      llmgw-store why vllm@7 numpy
    """
    from llmgw_store.integrity.inspect import why as do_why

    r = do_why(target, package, root=obj.root)
    lines = [" -> ".join(f"{n} {v}" for n, v in chain) for chain in r.chains]
    if r.truncated:
        lines.append(f"(the first {len(r.chains)} chain(s); there are more)")
    obj.emit(r.to_json(), "\n".join(lines))


@cli.command()
@click.argument("target", metavar="PATH")
@click.option("--format", "fmt", type=click.Choice(["requirements", "pylock"]), default="requirements",
              show_default=True,
              help="requirements: pinned names with their --hash lines, for `uv pip install --require-hashes -r`; "
                   "pylock: PEP 751 pylock.toml (each file with its URL, from the index the path was resolved from).")
@click.pass_obj
def export(obj: Context, target: str, fmt: str) -> None:
    """Print the lock PATH was installed from, for installing the same packages elsewhere.

    \b
    Examples:
      llmgw-store export vllm > vllm.lock && uv pip install --require-hashes -r vllm.lock
      llmgw-store export vllm@7 --format pylock > pylock.toml
    """
    from llmgw_store.integrity.inspect import export as do_export

    r = do_export(target, fmt, root=obj.root)
    obj.emit(r.to_json(), r.text.rstrip("\n"))
