"""Garbage collection: `gc` and the systemd units that run it."""

from __future__ import annotations

import click

from llmgw_store.cli.app import Context, cli, lock_timeout_option, setting_option
from llmgw_store.core import locks


@cli.command()
@click.option("--dry-run", is_flag=True, help="Say what would be deleted and how much it frees; delete nothing.")
@setting_option("gc.delete_older_than")
@setting_option("gc.keep")
@click.option("--max-freed", metavar="SIZE", help="Stop after freeing this much (50G), least recently used first.")
@setting_option("gc.min_free")
@setting_option("gc.max_cache")
@click.option("--prune-live", is_flag=True, help="With --max-cache: also prune entries live paths were built from (repair and cold rollback then need the network).")
@setting_option("gc.keep_dead_for")
@click.option("--keep-records", type=click.IntRange(min=1), help="Keep at most N records of cold generations per profile (the oldest go; `rollback --to` needs a record).")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the gc lock and each profile's lock (so cron tries again later)")
@click.option("--print-roots", is_flag=True, help="Print each gc root and the store paths it holds; collect nothing.")
@click.pass_obj
def gc(obj: Context, dry_run: bool, delete_older_than: str | None, keep: int | None, max_freed: str | None,
       min_free: str | None, max_cache: str | None, prune_live: bool, keep_dead_for: str | None,
       keep_records: int | None, lock_timeout: float, print_roots: bool) -> None:
    """Delete store paths no root holds (profiles, pins, running processes, builds in flight).

    Safe to run from cron while builds and activations run.

    \b
    Examples:
      llmgw-store gc --dry-run
      llmgw-store gc --delete-older-than 30d
      llmgw-store --json gc --min-free 100G
    """
    from llmgw_store.core.units import human_size, parse_duration, parse_size
    from llmgw_store.roots import gc as gcmod

    if print_roots:
        held = gcmod.print_roots(root=obj.root, lock_timeout=lock_timeout)
        obj.emit(held.to_json(), "\n".join(f"{desc}: {', '.join(names)}" for desc, names in sorted(held.roots.items())))
        return
    r = gcmod.collect(
        root=obj.root, dry_run=dry_run, keep=keep, lock_timeout=lock_timeout,
        # `is not None`: an empty value given is parsed (and refused, exit 2), never taken as "no limit".
        delete_older_than=parse_duration(delete_older_than) if delete_older_than is not None else None,
        max_freed=parse_size(max_freed) if max_freed is not None else None,
        min_free=parse_size(min_free) if min_free is not None else None,
        max_cache=parse_size(max_cache) if max_cache is not None else None,
        keep_dead_for=parse_duration(keep_dead_for) if keep_dead_for is not None else None, prune_live=prune_live,
        keep_records=keep_records,
    )
    verb = "would free" if dry_run else "freed"
    freed = sum(v for k, v in r.freed.items() if k != "stale_files")
    extra = f"; {len(r.kept_by_grace)} dead path(s) kept by --keep-dead-for" if r.kept_by_grace else ""
    if r.cache_pruned:
        extra += (f"; {r.cache_pruned['entries']} cache entr(ies) pruned ({human_size(r.cache_pruned['bytes'])})"
                  + (f", {r.cache_pruned['kept_live']} kept for live paths" if r.cache_pruned["kept_live"] else ""))
    obj.emit(r.to_json(), f"{len(r.deleted)} store path(s) {'to delete' if dry_run else 'deleted'}, {verb} "
                          f"{human_size(freed)} on disk in {r.seconds:.1f}s{extra}")


@cli.command(name="systemd-units")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for llmgw-store-gc.service and llmgw-store-gc.timer (e.g. /etc/systemd/system).")
@setting_option("gc.keep_dead_for", "1h", "The gc's grace period for dead paths.")
@click.option("--on-calendar", default="*-*-* 04:17:00", show_default=True, help="When the timer runs gc (systemd OnCalendar).")
@click.pass_obj
def systemd_units(obj: Context, out_dir: str, keep_dead_for: str, on_calendar: str) -> None:
    """Write the gc service and timer for this installation: ExecStart is the llmgw-store running
    now, with the current --root.

    \b
    Example:
      llmgw-store systemd-units --out /etc/systemd/system && systemctl enable --now llmgw-store-gc.timer
    """
    from llmgw_store.roots.systemd import write_units

    r = write_units(out_dir, root=obj.root, keep_dead_for=keep_dead_for, on_calendar=on_calendar)
    obj.emit(r.to_json(), f"wrote {r.service}\nwrote {r.timer}\nExecStart={r.exec_start}")
