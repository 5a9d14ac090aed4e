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
    from llmgw_store.app.units import human_size, parse_duration, parse_size
    from llmgw_store.roots import gc as gcmod

    if print_roots:
        from llmgw_store.roots.marking import print_roots as held_roots

        held = held_roots(root=obj.root, lock_timeout=lock_timeout)
        obj.emit(held.to_json(), "\n".join(f"{r.description}: {', '.join(r.paths)}" for r in held.roots))
        return
    def limit(value: str | None, parse):
        # `is not None`: an empty value given is parsed (and refused, exit 2), never taken as "no limit";
        # `none` is: it sets aside the config file's value (the systemd units pass it so).
        return None if value is None or value.strip().lower() == "none" else parse(value)

    r = gcmod.collect(
        root=obj.root, dry_run=dry_run, keep=keep, lock_timeout=lock_timeout,
        delete_older_than=limit(delete_older_than, parse_duration),
        max_freed=parse_size(max_freed) if max_freed is not None else None,
        min_free=limit(min_free, parse_size), max_cache=limit(max_cache, parse_size),
        keep_dead_for=limit(keep_dead_for, parse_duration), prune_live=prune_live,
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
# The gc options ExecStart carries besides --config: only those given here as a flag or a variable
# (the config file's [gc] table is read by gc itself when the unit runs it); 'none' leaves one out.
@setting_option("gc.delete_older_than")
@setting_option("gc.keep")
@setting_option("gc.min_free")
@setting_option("gc.max_cache")
@setting_option("gc.keep_dead_for")
@click.option("--follow", is_flag=True,
              help="Also write llmgw-store-follow.service and .timer: every --follow-every, `activate PROFILE` for "
                   "each profile of the config file's `releases` table, then push-roots ([node]).")
@click.option("--follow-every", default="60s", show_default=True, metavar="DURATION",
              help="How often the follow timer runs (with --follow): 30s, 5m, 1h.")
@click.pass_context
def systemd_units(ctx: click.Context, out_dir: str, on_calendar: str, delete_older_than: str | None,
                  keep: str | None, min_free: str | None, max_cache: str | None, keep_dead_for: str | None,
                  follow: bool, follow_every: str) -> None:
    """Write the gc service and timer for this installation: ExecStart is the llmgw-store running
    now, with the current --root and config file (whose [gc] table is the policy, as for a gc run
    by hand), then push-roots and stats where that file configures them; the timer runs it
    --on-calendar. With --follow, also the follow service and timer: the node follows the releases
    its config file names (`releases = {vllm = "vllm-prod"}`) every --follow-every.

    \b
    Examples:
      llmgw-store --config /etc/llmgw-store/config.toml systemd-units --out /etc/systemd/system
      llmgw-store systemd-units --out ./units --min-free 500G --max-cache 50G --on-calendar 'hourly'
      llmgw-store --config /etc/llmgw-store/config.toml systemd-units --out /etc/systemd/system --follow
    """
    from click.core import ParameterSource

    from llmgw_store.roots.systemd import GcPolicy, NodeDay, write_units

    obj: Context = ctx.obj
    given = {name: value for name, value in (("delete_older_than", delete_older_than), ("keep", keep),
                                             ("min_free", min_free), ("max_cache", max_cache),
                                             ("keep_dead_for", keep_dead_for))
             if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    loaded = ctx.find_root().meta.get("llmgw_store.config")
    day = NodeDay.from_file(loaded.path if loaded else None, loaded.values if loaded else {})
    policy = GcPolicy(**given)
    r = write_units(out_dir, root=obj.root, policy=policy, on_calendar=on_calendar, day=day,
                    follow=follow_every if follow else None)
    lines = [f"wrote {r.service}", f"wrote {r.timer}", f"ExecStart={r.exec_start}",
             *(f"ExecStart={t}" for t in r.then), f"OnCalendar={r.on_calendar}"]
    if r.follow_service:
        lines += [f"wrote {r.follow_service}", f"wrote {r.follow_timer}", *(f"ExecStart={t}" for t in r.follow),
                  f"OnUnitActiveSec={r.follow_every}"]
    obj.emit(r.to_json(), "\n".join(lines))
