"""`verify`, `doctor`, `optimise`, `stats`."""

from __future__ import annotations

import click

from llmgw_store.cli import handlers
from llmgw_store.cli.app import Context, cli, lock_timeout_option, setting_option, spec_params
from llmgw_store.core import locks


@cli.command()
@spec_params("verify")
@click.pass_obj
def verify(obj: Context, **kw) -> None:
    """Recompute the content hash of PATHS (store paths, names, keys, PROFILE or PROFILE@N; default:
    every store path) and compare with the manifest
    and the index; name modified, missing, extra and writable files. Exit 1 if any path is damaged.

    \b
    Examples:
      llmgw-store verify
      llmgw-store verify vllm@7 --repair
    """
    handlers.verify(obj, kw)


@cli.command()
@click.option("--rebuild-index", is_flag=True, help="Recreate the index from the manifests, profile links and pins (the old one is kept as a backup).")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the gc lock (--rebuild-index)")
@click.pass_obj
def doctor(obj: Context, rebuild_index: bool, lock_timeout: float) -> None:
    """Check the index against the disk; exit 1 if they disagree. --rebuild-index recreates it.

    \b
    Examples:
      llmgw-store doctor
      llmgw-store doctor --rebuild-index
    """
    from llmgw_store.integrity.doctor import doctor as do_doctor

    r = do_doctor(root=obj.root, rebuild_index=rebuild_index, lock_timeout=lock_timeout)
    if rebuild_index:
        obj.emit(r.to_json(), f"index rebuilt: {len(r.registered)} path(s), {r.generations} generation(s), "
                              f"{r.pins} pin(s); {len(r.skipped)} directory(ies) left unregistered; "
                              + (f"old index kept in {r.backup}" if r.backup else "there was no old index"))
        return
    lines = [f"{kind.replace('_', ' ')}: {item}" for kind, items in r.problems.items() for item in items]
    contained = f"children contained by: {r.containment['kind']} ({r.containment['detail']})"
    obj.emit(r.to_json(), "\n".join([*lines, contained]) if lines else f"index and disk agree\n{contained}")
    if not r.ok:
        obj.exit(1)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Count what would be linked and freed; change nothing.")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "a gc to let go of the gc lock")
@click.pass_obj
def optimise(obj: Context, dry_run: bool, lock_timeout: float) -> None:
    """Hardlink identical files across store paths (through ROOT/store/.links) and report the bytes saved.

    Every file is hashed against its listing first: a damaged one is left as it is and named
    (exit 1), for `verify --repair`."""
    from llmgw_store.app.units import human_size
    from llmgw_store.integrity.optimise import optimise as do_optimise

    r = do_optimise(root=obj.root, dry_run=dry_run, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"{r.files_linked} of {r.files_examined} file(s) {'would be ' if dry_run else ''}linked, "
                          f"{human_size(r.bytes_saved)} {'would be ' if dry_run else ''}freed"
                          + (f"; {len(r.damaged)} damaged file(s) left as they are: run `llmgw-store verify --repair`"
                             if r.damaged else ""))
    if r.damaged:
        obj.exit(1)


@cli.command()
@setting_option("stats.prometheus")
@click.pass_obj
def stats(obj: Context, prometheus: str | None) -> None:
    """Paths, bytes (apparent and on disk after dedup), profiles, generations, cache sizes.

    \b
    Example (node_exporter's textfile collector, after each cron gc):
      llmgw-store stats --prometheus /var/lib/node_exporter/textfile/llmgw_store.prom
    """
    from llmgw_store.app.units import human_size
    from llmgw_store.integrity.stats import stats as do_stats

    r = do_stats(root=obj.root, prometheus=prometheus)
    obj.emit(r.to_json(), "\n".join([
        f"paths:        {r.paths} ({human_size(r.bytes_apparent)} apparent, {human_size(r.bytes_on_disk)} on disk)",
        f"profiles:     {r.profiles} with {r.generations} generation(s); {r.pins} pin(s)",
        f"uv cache:     {human_size(r.uv_cache_bytes)} apparent ({human_size(r.uv_cache_bytes_unshared)} on disk, not shared with environments)",
        f"pyc cache:    {human_size(r.pyc_cache_bytes)} on disk (caches together: {human_size(r.cache_bytes_on_disk)}, what gc --max-cache counts)",
        f"downloads:    {human_size(r.downloads_bytes)} on disk",
        f"free:         {human_size(r.free_bytes)}",
        *(f"{'last ' + op + ':':13s} {_when(o['last_success'])} ({o['failures']} failure(s), last {_when(o['last_failure'])})"
          for op, o in sorted(r.operations.items())),
        *(f"profile {c['profile']}: generation {c['generation']}, {c['engine']} {c['version']} ({c['variant']})"
          for c in r.current_generations),
    ]))


def _when(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else "never"


@cli.command()
@click.argument("name")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for NAME.secret (mode 600) and NAME.public.")
@click.pass_obj
def keygen(obj: Context, name: str, out_dir: str) -> None:
    """Make an ed25519 key pair for signing pushes (NAME.secret) and trusting them (NAME.public).

    \b
    Example:
      llmgw-store keygen builder-1 --out /etc/llmgw-store
    """
    from llmgw_store.cache.signing import keygen as do_keygen

    r = do_keygen(name, out_dir)
    obj.emit(r.to_json(), f"secret key: {r.secret}\npublic key: {r.public} ({r.public_key})")
