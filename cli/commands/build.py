"""`build` and `build --check`."""

from __future__ import annotations

import click

from llmgw_store.cli.app import PROG, Context, build_options, caches_from, cli, options_from, quoted


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@build_options
@click.option("--check", "check", is_flag=True,
              help="Rebuild RECIPE's store path (it must exist) into a temporary tree from its recorded lock and "
                   "compare file by file; exit 1 naming the files that differ. The store path is never changed.")
@click.pass_obj
def build(obj: Context, recipe: str, check: bool, **kw) -> None:
    """Build RECIPE into the store (or find it there) and print its store path.

    \b
    Examples:
      llmgw-store build examples/black.toml
      llmgw-store --json build examples/vllm.toml --variant cu128 --as-of 2025-06-01T00:00:00Z
      llmgw-store build examples/black.toml --check    # is it reproducible? 0 identical, 1 differs
    """
    if check:
        _build_check(obj, recipe, kw)
        return
    from llmgw_store.api import build as do_build

    result = do_build(recipe, options_from(kw), **caches_from(kw), root=obj.root)
    obj.emit(result.to_json(), str(result.path))


def _build_check(obj: Context, recipe: str, kw: dict) -> None:
    from llmgw_store.build.check import check as do_check

    r = do_check(recipe, options_from(kw), root=obj.root)
    if r.identical:
        obj.emit(r.to_json(), f"identical: {r.path} ({r.files} entries, content hash {r.content_hash})")
        return
    n = len(r.differences) + len(r.problems)
    lines = [f"{r.path}: {n} entr{'y differs' if n == 1 else 'ies differ'}"]
    lines += [f"  {msg}" for msg in r.problems]
    for d in r.differences:
        store, rebuilt = d["store"], d["rebuilt"]
        lines.append(f"  {quoted(d['path'])}  store: {_side(store)}  rebuilt: {_side(rebuilt)}")
    obj.emit(r.to_json(), "\n".join(lines))
    click.echo(f"{PROG}: {r.name} differs from its rebuild in {n} entr{'y' if n == 1 else 'ies'} "
               "(not reproducible, or changed since it was built: `verify` tells which)", err=True)
    obj.exit(1)


def _side(s: dict | None) -> str:
    if s is None:
        return "absent"
    what = quoted(s["target"]) if "target" in s else (s["digest"][:12] if "digest" in s else "")
    extra = [f"uid {s['uid']}"] + ([f"xattrs {','.join(map(quoted, s['xattrs']))}"] if s.get("xattrs") else [])
    return " ".join(str(x) for x in (s["kind"], s.get("mode", ""), what, *extra) if x)
