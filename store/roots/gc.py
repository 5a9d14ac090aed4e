"""Garbage collection of store paths that no root holds, and of caches.

Roots: every generation of every profile, every pin, the temp roots of live processes (builds and
activations in flight), runtime roots (store paths named by a running process's exe, cwd, maps,
open fds, cmdline or environ, as Nix's gc reads /proc), the store's current pinned uv, and what
those reference (an interpreter an environment's pyvenv.cfg names, when that is in the store).

    take the gc lock exclusively   (from here on the set of roots cannot grow: adding a temp root
                                    needs the gc lock shared; a build never holds it for long)
    read roots, mark, choose what to delete (least recently used first under --max-freed/--min-free)
    for each dead path: forget it in the index, then rename it into ROOT/var/trash (atomic)
    release the gc lock
    delete the trash                (slow, and no lock is held: builds go on meanwhile)
    prune caches

On a full disk: gc first deletes the store's reserve (core/reserve.py: space for the index's
shared memory and journal, and the lock's note) and makes it again when it is done. Without a
reserve (a disk filled before one existed), the index is opened without shared memory
(Index(exclusive=True)), and what cannot be recorded before a dead path is deleted is recorded
after the trash is emptied (`record_deferred`, under the gc lock).

A crash anywhere leaves either a registered complete path, or an unregistered directory in
store/, or a tree in the trash (deleted by the next gc). The next gc registers an unregistered
directory again when its manifest shows it complete (tree rehashed; the index may simply have been
lost) and judges it like any registered path; one that is not complete is garbage.

This module keeps the order above (`collect`); the parts are modules of their own: marking.py
(the roots and their closure; liveroots.py, the /proc scan), sweep.py (what happens under the gc
lock), trash.py (emptying the trash, no lock held), cacheprune.py (the pool, the bytecode cache,
uv's cache, downloads).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.results import Result
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import DiskFullError, NoStoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.core import reserve
from llmgw_store.core.index import Index
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import is_generation_link
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.names import check_profile
from llmgw_store.core.oplog import recorded
from llmgw_store.core.temproots import gc_lock
from llmgw_store.roots.cachelog import prune_wheel_home
from llmgw_store.roots.cacheprune import (
    PYC_PRUNE_EVERY_S,
    UV_CACHE_TIMEOUT_S,
    WHEEL_HOME_LOCK_S,
    prune_downloads,
    prune_pool,
    prune_stale_pyc,
    prune_uv_cache,
)
from llmgw_store.roots.marking import Root
from llmgw_store.roots.sweep import record_deferred, sweep
from llmgw_store.roots.trash import empty_trash, has_entries
from llmgw_store.system.trees import free_bytes


@dataclass(frozen=True)
class GcReport(Result):
    """What gc did (or with dry_run would do): each path deleted (name, size: its apparent bytes,
    freed: the bytes its deletion freed on disk, reason), bytes freed per kind (on disk: blocks,
    an inode counted only when its last link went), each root and what it holds, generations
    deleted, complete paths registered again, dead paths kept by the grace period, caches pruned;
    `undeleted`: trees left in the trash because the kernel refused their deletion (gc exits 1)."""

    dry_run: bool
    deleted: tuple[dict[str, Any], ...] = ()
    generations_deleted: dict[str, list[int]] = field(default_factory=dict)
    freed: dict[str, int] = field(default_factory=dict)
    kept: tuple[Root, ...] = ()
    registered: tuple[str, ...] = ()
    seconds: float = 0.0
    free_before: int | None = None
    free_after: int | None = None
    kept_by_grace: tuple[str, ...] = ()
    cache_pruned: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    undeleted: tuple[str, ...] = ()


@recorded("gc")
def collect(
    *,
    root: str | Path | None = None,
    dry_run: bool = False,
    delete_older_than: float | None = None,
    keep: int | None = None,
    max_freed: int | None = None,
    min_free: int | None = None,
    max_cache: int | None = None,
    keep_dead_for: float | None = None,
    prune_live: bool = False,
    keep_records: int | None = None,
    lock_timeout: float = LOCK_TIMEOUT_S,
) -> GcReport:
    """Every lock (the gc lock, each profile's, the index) is waited for at most `lock_timeout` s.
    `keep_dead_for` (seconds): a dead path rooted or used within that long is kept (the grace
    period). Byte figures are on disk (accounting.py); `min_free` is checked against the
    filesystem's own free space, re-read after each round of deletion."""
    started = time.monotonic()
    report: dict[str, Any] = {"dry_run": dry_run, "deleted": [], "generations_deleted": {}, "freed": {}, "kept": {},
                              "kept_by_grace": [], "rounds": 0, "deferred": {}, "undeleted": []}
    # The reserve's blocks are the store's own: gc gives them back to itself, not to the disk, so
    # every comparison with --min-free counts them as used (`held`).
    held = _release_reserve(root) if not dry_run else 0
    try:
        store = _open(root, lock_timeout)
    except NoStoreError as exc:
        say(exc.nothing_to("collect"))  # a timer installed before the first build: exit 0
        return _report({**report, "seconds": round(time.monotonic() - started, 3)})
    with store:
        layout = store.layout
        if not dry_run:
            from llmgw_store.cache.pull import sweep_stale_pulls

            sweep_stale_pulls(layout.tmp)  # scratch trees of pulls killed by SIGKILL
        report["free_before"] = free_bytes(layout.store) - held
        if min_free is not None and report["free_before"] >= min_free:
            say(f"{human_size(report['free_before'])} free, at least --min-free: nothing to do")
            if held:
                reserve.keep(layout)
            report.update(seconds=round(time.monotonic() - started, 3), free_after=report["free_before"])
            return _report(report)

        excluded: set[tuple[str, int]] = set()
        if delete_older_than is not None or keep is not None or keep_records is not None:
            try:
                excluded = _prune_generations(store, delete_older_than, keep, dry_run, lock_timeout, report,
                                              keep_records)
            except DiskFullError:
                say("generations left as they are: the disk is too full to record their deletion "
                    "(dead store paths are collected first; the next gc prunes them)")

        report["freed"].update(store_paths=0, linked_caches=0, stale_files=0)
        # Rounds: each chooses dead paths for what is still missing of the budget (predicted on
        # disk), deletes them, then measures. Without a budget, or dry, there is one round; with
        # one, at most as many as there are entries in store/ (each round deletes at least one).
        limit = 1 + sum(1 for _ in os.scandir(layout.store))
        live: set[str] | None = None  # the live closure of the last root read
        while report["rounds"] < limit:
            report["rounds"] += 1
            budget = _budget(layout, min_free, max_freed, report["freed"]["store_paths"], held)
            if budget is not None and budget <= 0:
                break
            dead, live = sweep(store, excluded, budget, keep_dead_for, dry_run, lock_timeout, report)
            if dry_run:
                # and what the pool and wheel home prunes would free that no path links already
                report["freed"]["store_paths"] = (sum(d["freed"] for d in dead) + prune_pool(layout.links_pool, dry_run=True)
                                                  + prune_wheel_home(store, dry_run=True, timeout=0)[1])
                break
            # The lock is released: builds and activations go on while the trash is deleted.
            debug.pause("GC_BEFORE_EMPTY_TRASH")
            pooled = empty_trash(layout, dead, report, has_entries(layout.links_pool))
            # A file optimise shared is freed only when its pool link goes too: part of what
            # deleting the paths frees. Only the pool entries the deleted paths' listings name
            # are looked at; the whole pool when the trash held a tree without a listing (a
            # killed gc's), and with --max-cache. Exclusive again, briefly: optimise links into
            # the pool with the lock shared.
            with gc_lock(layout, shared=False, timeout=lock_timeout):
                whole = max_cache is not None or pooled is None
                if dead:
                    # the deleted paths' pycs that the bytecode cache links (bytecode.link_cache) go
                    # with them: the cache's link first, then the pool's
                    report["freed"]["store_paths"] += prune_stale_pyc(layout.pyc_cache, layout.links_pool,
                                                                      linked_only=True)
                report["freed"]["store_paths"] += prune_pool(layout.links_pool, names=None if whole else pooled)
            # The wheels only the deleted paths linked: freed with them, before what a full disk kept
            # gc from recording is recorded (the paths' files are the wheel home's inodes: deleting
            # the paths alone frees nothing). Under uv's cache lock, not the gc lock (removing an
            # entry changes no store path; what matters is that no uv process links from it
            # meanwhile), so a build's uv run delays only this step.
            report["freed"]["store_paths"] += prune_wheel_home(
                store, dry_run=False, timeout=min(lock_timeout, WHEEL_HOME_LOCK_S),
                gone=report["deferred"].get("forget", set()))[1]
            with gc_lock(layout, shared=False, timeout=lock_timeout):
                record_deferred(store, report)
            if budget is None or not dead:
                break
        if not dry_run:
            empty_trash(layout, [], report)  # what a killed gc left there
            report["freed"]["downloads"] = prune_downloads(layout)
            if max_cache is not None or _due(store.index.tool_info("gc", "pyc-prune"), PYC_PRUNE_EVERY_S):
                with gc_lock(layout, shared=False, timeout=lock_timeout):
                    report["freed"]["linked_caches"] += prune_stale_pyc(layout.pyc_cache, layout.links_pool)
                try:
                    store.index.remember_tool("gc", "pyc-prune", {"at": time.time()})
                except DiskFullError:
                    pass  # a memo: the next gc walks the bytecode cache again
        if max_cache is not None and live is None:
            say("caches left alone: no roots were read (nothing to collect)")
        elif max_cache is not None and live is not None:
            # Only when asked to bound the caches: `uv cache prune` and its accounting walk the
            # whole uv cache, and what it removes (what nothing points at any more) is rare.
            report["freed"]["uv_cache"] = prune_uv_cache(store, dry_run)
            from llmgw_store.roots.cachelog import prune

            # What a live path needs for repair, and a generation record (a cold rollback), stays.
            needed = live | store.index.generation_path_names()
            pruned = prune(store, max_cache, needed, prune_live=prune_live, dry_run=dry_run, timeout=UV_CACHE_TIMEOUT_S)
            report["cache_pruned"] = pruned
            report["freed"]["cache_entries"] = pruned["bytes"]
        if not dry_run:
            reserve.keep(layout)  # for the next gc on a full disk (none when this one freed nothing)
        report["seconds"] = round(time.monotonic() - started, 3)
        report["free_after"] = free_bytes(layout.store)
        return _report(report)


def _release_reserve(root: str | Path | None) -> int:
    """Give back the reserve before anything is opened: what follows (the index's shared memory and
    journal, the lock's note) then has room on a full disk. Only in a store that passes the
    directory checks (layout.check: nothing is deleted through a planted link). Returns the bytes
    it gave back."""
    layout = Layout.at(root)
    if not os.path.isdir(layout.store):
        return 0
    layout.check()
    return reserve.release(layout)


def _open(root: str | Path | None, lock_timeout: float) -> Store:
    """The store, its index opened as every command opens it; on a disk too full for the index's
    shared memory, opened without it (Index(exclusive=True): other commands wait for this gc)."""
    try:
        return Store.open(root, lock_timeout)
    except DiskFullError:
        layout = Layout.at(root)
        say("the disk is full: the index is opened without shared memory (other commands wait for this gc); "
            "dead paths are deleted first and recorded after")
        return Store(layout, Index(layout.db, layout.store, busy_timeout=lock_timeout, exclusive=True))


def _budget(layout: Layout, min_free: int | None, max_freed: int | None, freed: int, held: int = 0) -> int | None:
    """Bytes still to free: what the filesystem says is missing for `min_free` (read now, not
    predicted), and what is left of `max_freed`; None when neither is asked."""
    budget = None
    if min_free is not None:
        budget = min_free - (free_bytes(layout.store) - held)
    if max_freed is not None:
        budget = max_freed - freed if budget is None else min(budget, max_freed - freed)
    return budget


def _due(memo: dict[str, Any] | None, every: float) -> bool:
    if memo is None:
        return True
    try:
        return time.time() - float(memo["at"]) > every
    except (TypeError, KeyError, ValueError):
        return True


def _report(report: dict[str, Any]) -> GcReport:
    report.pop("deferred", None)
    for item in report["deleted"]:
        item.pop("trash", None)
    return GcReport(**{**report, "deleted": tuple(report["deleted"]), "registered": tuple(report.get("registered", ())),
                       "undeleted": tuple(report.get("undeleted", ())),
                       "kept": tuple(report.get("kept", ())),
                       "kept_by_grace": tuple(report.get("kept_by_grace", ()))})


def _prune_generations(store: Store, older_than, keep, dry_run, lock_timeout, report,
                       keep_records: int | None = None) -> set[tuple[str, int]]:
    """Deleted generations become cold (their records stay, see roots/records.py); `keep_records`
    also drops the oldest records of cold generations beyond that many per profile."""
    from llmgw_store.roots.profiles import delete_generations_locked, profile_lock

    excluded = set()
    for entry in sorted(os.scandir(store.layout.profiles), key=lambda e: e.name):
        if entry.name.startswith(".") or is_generation_link(entry.name) or not entry.is_symlink():
            continue
        profile = entry.name
        try:
            check_profile(profile)
        except UsageError:
            say(f"skipping {entry.name!r} in profiles/: not a profile name")
            continue
        with profile_lock(store, profile, lock_timeout):
            r = delete_generations_locked(store, profile, None, older_than, keep, dry_run, keep_records=keep_records)
        if r.deleted:
            report["generations_deleted"][profile] = list(r.deleted)
            excluded |= {(profile, n) for n in r.deleted}
    return excluded


