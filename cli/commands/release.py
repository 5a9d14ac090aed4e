"""Releases: `release set`, `release promote`, `release show` (signed pointers in a binary cache,
cache/releases.py) and `fleet` (every node's roots and every release, in one view). A node follows
a release with `activate PROFILE --release NAME` (cli/handlers.py)."""

from __future__ import annotations

import time

import click

from llmgw_store.cli.app import Context, cli, setting_option
from llmgw_store.cli.commands.fleet import cache_network_options


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _line(r) -> str:
    what = " ".join(x for x in (r.engine, r.version, f"({r.variant})" if r.variant else None) if x)
    return (f"{r.release} -> {r.name}{'  ' + what if what else ''}  (sequence {r.seq}, signed by {r.signer} at "
            f"{_when(r.time)})")


@cli.group()
def release() -> None:
    """Signed release pointers: what the fleet runs, set by the builder, followed by nodes."""


def _writes_pointer(to_help: str, trusted_help: str):
    """The options of a command that writes a release pointer (`set`, `promote`): the cache, the
    signing key, the keys whose signatures it also accepts, the network settings."""
    options = (click.option("--to", "to", required=True, help=to_help),
               click.option("--secret-key", required=True, envvar="LLMGW_STORE_SECRET_KEY",
                            help="Signing key file (from keygen)."),
               setting_option("trusted_keys", help=trusted_help), cache_network_options, click.pass_obj)

    def wrap(f):
        for option in reversed(options):
            f = option(f)
        return f

    return wrap


def _write_pointer(obj: Context, write, *args: str, to: str, secret_key: str, trusted_keys: tuple[str, ...],
                   policy) -> None:
    """Run the library call that writes the pointer (api.release_set, api.release_promote) and
    print its one line."""
    r = write(*args, to, secret_key, trusted_keys=tuple(trusted_keys), root=obj.root, policy=policy)
    obj.emit(r.to_json(), _line(r.release))


@release.command("set")
@click.argument("name")
@click.argument("target")
@_writes_pointer("Cache URL: file:///dir, http(s)://host/prefix or s3://bucket/prefix.",
                 "Another key whose signatures on the object (or the current pointer) this signer accepts (its own "
                 "is always accepted); repeatable.")
def release_set(obj: Context, name: str, target: str, **kw) -> None:
    """Point the release NAME at TARGET (PROFILE, PROFILE@N, a store path, its name or key), which
    the cache must hold (push it first). Setting an older TARGET again is a fleet-wide rollback.

    \b
    Example:
      llmgw-store release set vllm-prod vllm --to s3://llmgw-cache/prod --secret-key /etc/llmgw-store/builder-1.secret
    """
    from llmgw_store.api import release_set as do_set

    _write_pointer(obj, do_set, name, target, **kw)


@release.command("promote")
@click.argument("source")
@click.argument("dest")
@_writes_pointer("Cache URL holding both releases.",
                 "A key whose signature on SOURCE is accepted (the signer's own always is); repeatable.")
def release_promote(obj: Context, source: str, dest: str, **kw) -> None:
    """Point the release DEST at what the release SOURCE points at (vllm-canary -> vllm-prod).

    \b
    Example:
      llmgw-store release promote vllm-canary vllm-prod --to s3://llmgw-cache/prod --secret-key builder-1.secret
    """
    from llmgw_store.api import release_promote as do_promote

    _write_pointer(obj, do_promote, source, dest, **kw)


@release.command("show")
@click.argument("name")
@click.option("--from", "from_", multiple=True, required=True, help="Cache URL; repeatable (asked in order).")
@setting_option("trusted_keys", help="Public key accepted (name:base64 or a .public file); repeatable.")
@cache_network_options
@click.pass_obj
def release_show(obj: Context, name: str, from_: tuple[str, ...], trusted_keys: tuple[str, ...], policy) -> None:
    """Print what the release NAME points at, and the pointers it replaced (checked as a node checks them).

    \b
    Example:
      llmgw-store release show vllm-prod --from https://cache.internal/llmgw --trusted-key builder-1.public
    """
    from llmgw_store.cache.releases import read

    r = read(list(from_), name, list(trusted_keys), policy=policy)
    lines = [_line(r)] + [f"  was {e['name']}  (sequence {e['seq']}, {_when(e['time'])}, {e['signer']})"
                          for e in r.history]
    obj.emit(r.to_json(), "\n".join(lines))


def _ago(t: float) -> str:
    s = max(0.0, time.time() - t)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit} ago"
    return f"{s:.0f}s ago"


@cli.command("fleet")
@click.option("--from", "from_", required=True, help="Cache URL the nodes publish their roots to.")
@click.option("--keep-from", "keep_from", multiple=True, required=True,
              help="Public key (name:base64, a .public file, or a directory of them) of a node; repeatable.")
@setting_option("trusted_keys", help="Public key of a builder, to check the release pointers; repeatable.")
@click.option("--prometheus", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write a Prometheus textfile: llmgw_store_fleet_node_out_of_date{node,profile,release} 0|1.")
@cache_network_options
@click.pass_obj
def fleet(obj: Context, from_: str, keep_from: tuple[str, ...], trusted_keys: tuple[str, ...], prometheus: str | None,
          policy) -> None:
    """Show every node of the cache (its profiles, the key each runs, the release it follows and whether
    it runs it: in_sync, out_of_date; when it last published) and every release pointer, each checked
    as gc and nodes check them; a document that fails is shown as refused.

    \b
    Example:
      llmgw-store fleet --from s3://llmgw-cache/prod --keep-from /etc/llmgw-store/nodes/ --trusted-key builder-1.public
    """
    from llmgw_store.cache.fleet import view, write_prometheus
    from llmgw_store.core.layout import Layout

    var = Layout.at(obj.root).var  # a replay of a pointer this store wrote or saw is shown refused
    r = view(from_, list(keep_from), list(trusted_keys), policy=policy, var=var if var.is_dir() else None)
    if prometheus is not None:
        write_prometheus(prometheus, r)
    by_key: dict[str, list[str]] = {}
    for rel in r.releases:
        if rel.key:
            by_key.setdefault(rel.key, []).append(rel.release)
    lines = []
    for rel in r.releases:
        if rel.refused:
            lines.append(f"release {rel.release}: refused: {rel.refused}")
            continue
        assert rel.time is not None, "a pointer that was not refused is signed with its time (cache/fleet.py)"
        lines.append(f"release {rel.release} -> {rel.name}  (sequence {rel.seq}, {rel.signer}, {_ago(rel.time)})")
    for n in r.nodes:
        if n.refused:
            lines.append(f"node {n.node}: refused: {n.refused}")
            continue
        assert n.time is not None, "a roots document that was not refused is signed with its time (cache/fleet.py)"
        lines.append(f"node {n.node}: published {_when(n.time)} ({_ago(n.time)}), {n.keys} store path(s)")
        for profile, key in sorted(n.profiles.items()):
            named = by_key.get(key)
            follows = (f"  follows {n.releases[profile]}: {n.state.get(profile, 'unknown')}"
                       if profile in n.releases else "")
            lines.append(f"  {profile} -> {key}" + (f"  (release {', '.join(named)})" if named else "") + follows)
    if r.truncated:
        lines.append(f"(more than {len(r.nodes)} nodes or releases: the rest not shown)")
    obj.emit(r.to_json(), "\n".join(lines))
