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
        obj.emit(held.to_json(), "\n".join(f"{r.description}: {', '.join(r.paths)}" for r in held.roots))
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
    if r.undeleted:
        extra += f"; {len(r.undeleted)} left in the trash (the kernel refused their deletion: see above)"
    obj.emit(r.to_json(), f"{len(r.deleted)} store path(s) {'to delete' if dry_run else 'deleted'}, {verb} "
                          f"{human_size(freed)} on disk in {r.seconds:.1f}s{extra}")
    if r.undeleted:
        obj.exit(1)  # the rest was collected; cron's log shows the failure


@cli.command(name="systemd-units")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for llmgw-store-gc.service and llmgw-store-gc.timer (e.g. /etc/systemd/system).")
@click.option("--on-calendar", default="*-*-* 04:17:00", show_default=True, envvar="LLMGW_STORE_GC_ON_CALENDAR",
              help="When the timer runs gc: a systemd calendar expression ('daily', 'Mon..Fri *-*-* 02:00'), "
                   "checked with systemd-analyze where installed. Env: LLMGW_STORE_GC_ON_CALENDAR.")
# The gc policy the unit's ExecStart carries: the [gc] table of the config file (core/config.py)
# where it sets a key, else these defaults; 'none' leaves an option out.
@setting_option("gc.delete_older_than", "30d", "gc first deletes generations older than this (never a current one); "
                "'none' leaves it out.")
@setting_option("gc.keep", None, "gc first deletes all but the newest N generations of each profile.")
@setting_option("gc.min_free", "200G", "gc collects dead paths until the filesystem has this much free; 'none' "
                "collects every dead path.")
@setting_option("gc.max_cache", "20G", "gc prunes the uv and bytecode caches down to SIZE, entries no live path "
                "uses first; 'none' leaves the caches alone.")
@setting_option("gc.keep_dead_for", "1h", "gc's grace period for dead paths.")
@click.pass_obj
def systemd_units(obj: Context, out_dir: str, on_calendar: str, delete_older_than: str, keep: str | None,
                  min_free: str, max_cache: str, keep_dead_for: str) -> None:
    """Write the gc service and timer for this installation: ExecStart is the llmgw-store running
    now, with the current --root and the gc policy given here; the timer runs it --on-calendar.

    \b
    Examples:
      llmgw-store systemd-units --out /etc/systemd/system && systemctl enable --now llmgw-store-gc.timer
      llmgw-store systemd-units --out ./units --min-free 500G --max-cache 50G --on-calendar 'hourly'
    """
    from llmgw_store.roots.systemd import GcPolicy, write_units

    policy = GcPolicy(delete_older_than=delete_older_than, keep=keep, min_free=min_free, max_cache=max_cache,
                      keep_dead_for=keep_dead_for)
    r = write_units(out_dir, root=obj.root, policy=policy, on_calendar=on_calendar)
    obj.emit(r.to_json(), f"wrote {r.service}\nwrote {r.timer}\nExecStart={r.exec_start}\nOnCalendar={r.on_calendar}")
