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
after the trash is emptied (`_record_deferred`, under the gc lock).

A crash anywhere leaves either a registered complete path, or an unregistered directory in
store/, or a tree in the trash (deleted by the next gc). The next gc registers an unregistered
directory again when its manifest shows it complete (tree rehashed; the index may simply have been
lost) and judges it like any registered path; one that is not complete is garbage.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.results import Result, fields_of
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import DiskFullError, IndexError_, NoStoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.core import footprint, proofs, reserve
from llmgw_store.core.index import Index, ReferencedError, now_iso
from llmgw_store.core.keys import NIX_BASE32, STORE_NAME_MAX, is_store_name
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import is_generation_link, split_generation_link
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.names import check_profile
from llmgw_store.core.oplog import recorded
from llmgw_store.core.temproots import gc_lock, read_all, remove_stale
from llmgw_store.roots.accounting import Tally, inodes_of, listed_files, on_disk, remove_tree, walk
from llmgw_store.roots.cachelog import prune_wheel_home, wheel_home_inodes
from llmgw_store.system.trees import free_bytes

# A store path name after any `/store/` (core/keys.STORE_NAME_RE's shape, bounded): a process names
# its environment through whatever prefix reaches the root where it runs (the root bind-mounted
# elsewhere in a container's mount namespace, a symlinked parent), and /proc shows
# that prefix, not ours. Matching the name alone can only keep more (the safe direction); names
# that are not entries of this store are dropped.
_RUNTIME_NAME = re.compile(rf"/store/([{NIX_BASE32}]{{32}}-[A-Za-z0-9._+!-]{{1,{STORE_NAME_MAX - 33}}})")


def runtime_roots(layout: Layout) -> dict[str, set[str]]:
    """Store path names used by running processes (those /proc shows: the pid namespace gc runs
    in) -> the pids using them."""
    pattern = _RUNTIME_NAME
    found: dict[str, set[str]] = {}

    def note(text: str, pid: str) -> None:
        for m in pattern.finditer(text):
            found.setdefault(m.group(1), set()).add(pid)

    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        base = f"/proc/{pid}"
        for link in ("exe", "cwd"):
            try:
                note(os.readlink(f"{base}/{link}"), pid)
            except OSError:
                pass
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    note(os.readlink(f"{base}/fd/{fd}"), pid)
                except OSError:
                    pass
        except OSError:
            pass
        for name in ("maps", "cmdline", "environ"):
            try:
                with open(f"{base}/{name}", "rb") as f:
                    note(f.read().decode(errors="replace").replace("\0", "\n"), pid)
            except OSError:
                pass
    return {name: pids for name, pids in found.items() if os.path.lexists(layout.store / name)}


@dataclass(frozen=True)
class Root:
    """One gc root and the store path names it holds directly. `kind` is one of
    generation (with `profile`, `generation`), pin (with `pin`), hold (with `profile`: roots/holds.py), temp (builds and activations in
    flight), process (with `pid`: a running process uses the paths) and uv (the store's pinned uv);
    the fields a kind does not have are None and left out of its JSON."""

    kind: str
    paths: tuple[str, ...]
    profile: str | None = None
    generation: int | None = None
    pin: str | None = None
    pid: int | None = None

    @property
    def description(self) -> str:
        """The root in words, for people (`gc --print-roots`)."""
        return {"generation": f"profile {self.profile} generation {self.generation}", "pin": f"pin {self.pin}",
                "hold": f"hold of profile {self.profile}",
                "temp": "temp roots of live processes", "process": f"in use by pid {self.pid}",
                "uv": "the store's pinned uv"}[self.kind]

    def body(self) -> dict[str, Any]:
        return {k: v for k, v in fields_of(self).items() if v is not None}


def roots(store: Store, excluded_generations: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset(),
          temp: set[str] | None = None) -> list[Root]:
    """Every root and the store path names it holds directly. `temp`: the names live temp roots
    hold, when the caller has read them (under the gc lock) already."""
    from llmgw_store.build.uv import UV_VERSION
    from llmgw_store.roots.holds import list_holds
    from llmgw_store.roots.pins import list_pins

    layout = store.layout
    out: list[Root] = []
    for entry in sorted(os.scandir(layout.profiles) if layout.profiles.is_dir() else [], key=lambda e: e.name):
        gen = split_generation_link(entry.name)
        if gen and entry.is_symlink() and gen not in excluded_generations:
            out.append(Root("generation", (os.readlink(entry.path).rpartition("/")[2],), profile=gen[0],
                            generation=gen[1]))
    for pin, name in sorted(list_pins(layout).items()):
        out.append(Root("pin", (name,), pin=pin))
    for profile, name in sorted(list_holds(layout).items()):
        out.append(Root("hold", (name,), profile=profile))
    live = read_all(layout)[0] if temp is None else temp
    if live:
        out.append(Root("temp", tuple(sorted(live))))
    by_pid: dict[int, set[str]] = {}
    for name, pids in runtime_roots(layout).items():
        for pid in pids:
            by_pid.setdefault(int(pid), set()).add(name)
    out += [Root("process", tuple(sorted(names)), pid=pid) for pid, names in sorted(by_pid.items())]
    uv = [r.name for r in store.index.paths() if r.engine == "uv" and r.version == UV_VERSION]
    if uv:
        out.append(Root("uv", tuple(uv)))
    return out


def held_names(found: list[Root]) -> set[str]:
    """Every store path name the roots hold directly."""
    return {n for r in found for n in r.paths}


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


@dataclass(frozen=True)
class Roots(Result):
    """Each gc root and the store paths it holds (closure included): `gc --print-roots`."""

    roots: tuple[Root, ...]

    def body(self) -> dict[str, Any]:
        return {"roots": [r.body() for r in self.roots]}


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
            dead, live = _sweep(store, excluded, budget, keep_dead_for, dry_run, lock_timeout, report)
            if dry_run:
                # and what the pool and wheel home prunes would free that no path links already
                report["freed"]["store_paths"] = (sum(d["freed"] for d in dead) + _prune_pool(layout.links_pool, dry_run=True)
                                                  + prune_wheel_home(store, dry_run=True, timeout=0)[1])
                break
            # The lock is released: builds and activations go on while the trash is deleted.
            debug.pause("GC_BEFORE_EMPTY_TRASH")
            pooled = _empty_trash(layout, dead, report, _has_entries(layout.links_pool))
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
                    report["freed"]["store_paths"] += _prune_stale_pyc(layout.pyc_cache, layout.links_pool,
                                                                       linked_only=True)
                report["freed"]["store_paths"] += _prune_pool(layout.links_pool, names=None if whole else pooled)
            # The wheels only the deleted paths linked: freed with them, before what a full disk kept
            # gc from recording is recorded (the paths' files are the wheel home's inodes: deleting
            # the paths alone frees nothing). Under uv's cache lock, not the gc lock (removing an
            # entry changes no store path; what matters is that no uv process links from it
            # meanwhile), so a build's uv run delays only this step.
            report["freed"]["store_paths"] += prune_wheel_home(
                store, dry_run=False, timeout=min(lock_timeout, WHEEL_HOME_LOCK_S),
                gone=report["deferred"].get("forget", set()))[1]
            with gc_lock(layout, shared=False, timeout=lock_timeout):
                _record_deferred(store, report)
            if budget is None or not dead:
                break
        if not dry_run:
            _empty_trash(layout, [], report)  # what a killed gc left there
            report["freed"]["downloads"] = _prune_downloads(layout)
            if max_cache is not None or _due(store.index.tool_info("gc", "pyc-prune"), PYC_PRUNE_EVERY_S):
                with gc_lock(layout, shared=False, timeout=lock_timeout):
                    report["freed"]["linked_caches"] += _prune_stale_pyc(layout.pyc_cache, layout.links_pool)
                try:
                    store.index.remember_tool("gc", "pyc-prune", {"at": time.time()})
                except DiskFullError:
                    pass  # a memo: the next gc walks the bytecode cache again
        if max_cache is not None and live is None:
            say("caches left alone: no roots were read (nothing to collect)")
        elif max_cache is not None and live is not None:
            # Only when asked to bound the caches: `uv cache prune` and its accounting walk the
            # whole uv cache, and what it removes (what nothing points at any more) is rare.
            report["freed"]["uv_cache"] = _prune_uv_cache(store, dry_run)
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


def _record_deferred(store: Store, report: dict[str, Any]) -> None:
    """What a full disk kept the sweep from recording, now that the trash is emptied: each deleted
    path forgotten, the roots seen. Called with the gc lock held exclusively: a name a live temp
    root holds, or one on disk again, belongs to a build of that key that registers it itself."""
    deferred = report["deferred"]
    if not deferred:
        return
    busy = read_all(store.layout)[0]
    for name in sorted(deferred.pop("forget", ())):
        if name in busy or os.path.lexists(store.layout.store / _component(name)):
            continue
        try:
            _forget(store, name)
        except ReferencedError:
            say(f"{name} is gone but a registered path references it: `llmgw-store doctor` names it")
    if "rooted" in deferred:
        names, at = deferred.pop("rooted")
        store.index.mark_rooted(names, at)


def _forget(store: Store, name: str) -> None:
    store.index.forget(name)
    store.index.forget_rooted(name)
    store.index.forget_tool(footprint.KIND, name)
    if name not in store.index.generation_path_names():
        store.index.forget_cache_uses(name)  # no cold rollback can want its entries
    proofs.drop(store.layout.var, name)  # its lock's kept proof (core/proofs.py) goes with it


def _budget(layout: Layout, min_free: int | None, max_freed: int | None, freed: int, held: int = 0) -> int | None:
    """Bytes still to free: what the filesystem says is missing for `min_free` (read now, not
    predicted), and what is left of `max_freed`; None when neither is asked."""
    budget = None
    if min_free is not None:
        budget = min_free - (free_bytes(layout.store) - held)
    if max_freed is not None:
        budget = max_freed - freed if budget is None else min(budget, max_freed - freed)
    return budget


def _sweep(store: Store, excluded, budget, keep_dead_for, dry_run, lock_timeout, report) -> tuple[list, set[str]]:
    """Under the gc lock: read the roots, record them, choose, forget and rename into the trash."""
    layout = store.layout
    first = report["rounds"] == 1
    with gc_lock(layout, shared=False, timeout=lock_timeout):
        # From here until the lock is released no process can add a temp root: the roots read
        # below are all the roots there are, and the temp-roots files are read once.
        live_temp, stale = read_all(layout)
        spared: set[str] = set()
        if first and not dry_run:
            report["registered"] = _adopt_unregistered(store, live_temp, spared)
        found = roots(store, excluded, temp=live_temp)
        live = _closure(store, held_names(found)) | spared
        if first:
            report["kept"] = tuple(found)
            if not dry_run:
                remove_stale(stale)  # each under its own flock: never a live process's file
                report["freed"]["stale_files"] = len(stale) + _remove_stale_key_locks(layout, live_temp)
        now = time.time()
        if not dry_run:
            # The grace period's clock: each path seen rooted now (and each whose generation this
            # gc deleted: rooted until a moment ago) was rooted at `now`.
            just_unrooted = _names_of_generations(layout, excluded)
            rooted, at = {n for n in live | just_unrooted if not n.endswith(".partial")}, now_iso()
            try:
                store.index.mark_rooted(rooted, at)
            except DiskFullError:
                report["deferred"]["rooted"] = (rooted, at)  # recorded once the trash is emptied
        # A link in optimise's pool, the wheel home or the bytecode cache (an entry that is a store
        # path's pyc) is one gc removes once no path links the file.
        pooled, extra = _gc_links(store) if (budget is not None or dry_run) else ({}, {})
        dead = _choose(store, live, budget, checked=not dry_run, keep_dead_for=keep_dead_for, now=now,
                       pooled=pooled, extra=extra, report=report, predict=dry_run or budget is not None)
        dead = _referrers_first(store, dead)  # deleted, and reported, in this order
        for item in dead:
            say(f"{'would delete' if dry_run else 'deleting'} {item['name']} ({human_size(item['size'])}, {item['reason']})")
            if dry_run:
                continue
            try:
                _forget(store, item["name"])
            except ReferencedError:  # a kept path (over the budget, in its grace) references it
                say(f"keeping {item['name']}: a path gc keeps references it")
                item["kept"] = True
                continue
            except DiskFullError:
                # Deleted first, recorded after (_record_deferred): until then the index names a
                # path that is gone, which every reader takes as "not in the store". (SQLite checks
                # the references when the delete runs, before the full disk refuses its commit.)
                report["deferred"].setdefault("forget", set()).add(item["name"])
            debug.pause("GC_AFTER_FORGET")  # forgotten, still in store/
            src = layout.store / _component(item["name"])
            if os.path.lexists(src):
                trash = layout.trash / f"{item['name']}.{os.getpid()}.{time.monotonic_ns()}"
                try:
                    os.rename(src, trash)
                except OSError as exc:
                    if exc.errno not in _LEAVE:
                        raise
                    # Left where it is, unregistered: the next gc registers it again and retries.
                    _left(os.fspath(src), exc, "left in store/", report)
                    item["kept"] = True
                    continue
                item["trash"] = trash
        dead = [item for item in dead if not item.get("kept")]
        report["deleted"] += dead
    return dead, live


def _gc_links(store: Store) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """(inode -> link count now, inode -> how many of its links gc removes itself) for the inodes
    of optimise's pool, the wheel home and the bytecode cache's entries that are store inodes in
    the pool too (the ones gc unlinks with the last path: _prune_stale_pyc's `linked_only`)."""
    pool = inodes_of(store.layout.links_pool)
    pyc = {ident: n for ident, n in _linked_pyc(store.layout.pyc_cache).items() if ident in pool}
    maps = [pool, wheel_home_inodes(store), pyc]
    nlinks: dict[tuple[int, int], int] = {}
    extra: dict[tuple[int, int], int] = {}
    for m in maps:
        for ident, n in m.items():
            nlinks[ident] = n
            extra[ident] = extra.get(ident, 0) + 1
    return nlinks, {k: v for k, v in extra.items() if v != 1}


def _linked_pyc(pyc_cache: Path) -> dict[tuple[int, int], int]:
    """inode -> link count of the bytecode cache's entries with other links (bytecode.link_cache's)."""
    from llmgw_store.build.bytecode import ENTRY_RE

    return {(st.st_dev, st.st_ino): st.st_nlink for rel, st in walk(pyc_cache)
            if rel and stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and ENTRY_RE.fullmatch(os.path.basename(rel))}


def _referrers_first(store: Store, dead: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`dead` in its order (least recently used first), except that a path comes after every dead
    path that references it: the index forgets a referrer before what it references."""
    by_name = {item["name"]: item for item in dead}
    referrers: dict[str, list[str]] = {}
    for name in by_name:
        for ref in store.index.references(name):
            if ref in by_name and ref != name:
                referrers.setdefault(ref, []).append(name)
    ordered: list[dict[str, Any]] = []
    seen: set[str] = set()

    def place(name: str) -> None:
        # Iterative depth-first: a reference cycle (which a damaged index could hold) ends the walk.
        stack = [(name, iter(referrers.get(name, ())))]
        seen.add(name)
        while stack:
            here, pending = stack[-1]
            nxt = next(pending, None)
            if nxt is None:
                stack.pop()
                ordered.append(by_name[here])
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(referrers.get(nxt, ()))))

    for item in dead:
        if item["name"] not in seen:
            place(item["name"])
    return ordered


def _names_of_generations(layout: Layout, generations: set[tuple[str, int]]) -> set[str]:
    out = set()
    for profile, number in generations:
        try:
            out.add(Path(os.readlink(layout.generation_link(profile, number))).name)
        except OSError:
            continue  # deleted already (not a dry run): the generation record says when
    return out


def _due(memo: dict[str, Any] | None, every: float) -> bool:
    if memo is None:
        return True
    try:
        return time.time() - float(memo["at"]) > every
    except (TypeError, KeyError, ValueError):
        return True


def _has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as it:
            return any(True for _ in it)
    except OSError:
        return False


def _empty_trash(layout: Layout, dead: list[dict[str, Any]], report: dict[str, Any],
                 pool_used: bool = True) -> set[str] | None:
    """Delete the trees renamed into the trash, counting what each really frees. Returns the names
    of the pool entries their listings name (None: something in the trash had no readable listing,
    so only a walk of the whole pool finds what it shared; an empty set when the pool is empty)."""
    pooled: set[str] | None = set()
    for item in dead:
        if "trash" in item:
            names = _pool_names(item["trash"]) if pool_used else set()
            pooled = None if names is None or pooled is None else pooled | names
            item["freed"] = _remove_or_leave(item.pop("trash"), report)
            report["freed"]["store_paths"] += item["freed"]
        else:
            item["freed"] = 0
    for entry in os.scandir(layout.trash):
        if entry.path in report["undeleted"]:
            continue  # said already
        pooled = None if pool_used else pooled
        report["freed"]["store_paths"] += _remove_or_leave(entry.path, report)
    return pooled


# What the kernel refuses even root (EPERM: an immutable or append-only attribute; EBUSY: a mount
# point inside the tree). Such a tree stays in the trash, where nothing uses it, and every other
# one is still deleted; gc then exits 1 (cli/commands/gc.py), every time until someone clears it.
_LEAVE = (errno.EPERM, errno.EACCES, errno.EBUSY)


def _remove_or_leave(tree: str | os.PathLike, report: dict[str, Any]) -> int:
    """remove_tree(tree), or, when the kernel refuses a deletion in it, one line naming it and the
    likely cause, the tree left in the trash and named in report["undeleted"] (0 bytes counted)."""
    try:
        return remove_tree(tree)
    except OSError as exc:
        if exc.errno not in _LEAVE:
            raise
        _left(os.fspath(tree), exc, "left in the trash", report)
        return 0


def _left(shown: str, exc: OSError, where: str, report: dict[str, Any]) -> None:
    report["undeleted"].append(shown)
    say(f"cannot delete {shown} ({os.fsdecode(exc.filename or '')}: {exc.strerror}): {where}; most likely an "
        "immutable or append-only attribute (`lsattr -R` it; `chattr -R -i -a` clears it) or a mount inside it; "
        "the next gc deletes it once that is gone")


_POOL_NAME = re.compile(r"[0-9a-f]{64}-[fx]")


def _pool_names(tree: Path) -> set[str] | None:
    """The names optimise's pool gives the files of `tree`'s listing (`<blake3>-<f|x>`), checked;
    None when the listing cannot be read (a leftover that never had one)."""
    listed = listed_files(tree)
    if listed is None:
        return None
    return {n for kind, digest in listed if _POOL_NAME.fullmatch(n := f"{digest}-{kind}")}


def _report(report: dict[str, Any]) -> GcReport:
    report.pop("deferred", None)
    for item in report["deleted"]:
        item.pop("trash", None)
    return GcReport(**{**report, "deleted": tuple(report["deleted"]), "registered": tuple(report.get("registered", ())),
                       "undeleted": tuple(report.get("undeleted", ())),
                       "kept": tuple(report.get("kept", ())),
                       "kept_by_grace": tuple(report.get("kept_by_grace", ()))})


def _closure(store: Store, names: set[str]) -> set[str]:
    """The roots and what they reference (recorded at registration, read from the index)."""
    live = set(names) | set(store.index.closure(names))
    # a build in flight is rooted by its final name; its .partial is live with it
    return live | {n + ".partial" for n in live}


def _adopt_unregistered(store: Store, busy: set[str], spared: set[str]) -> list[str]:
    """Register again each complete directory of store/ that the index does not know (Store.adopt,
    tree rehashed), so that it, and what it references, is judged like any registered path: kept
    when a root holds it, collected when none does. Called with the gc lock held exclusively: no
    temp root can be added, so a directory no live temp root names has no builder (a builder adds
    its temp root before it takes the key's lock) and nothing else writes it meanwhile."""
    known = {r.name for r in store.index.paths()}
    adopted = []
    for entry in os.scandir(store.layout.store):
        name = entry.name
        if (name in known or name in busy or not is_store_name(name)
                or not entry.is_dir(follow_symlinks=False)):
            continue
        try:
            why = store.adopt(name, rehash=True, busy=busy)
        except DiskFullError:
            # Not registered, so its references are unknown: kept whole until a gc can record it.
            say(f"kept {name} for now: complete but not in the index, which the full disk keeps from recording it")
            spared.add(name)
            continue
        if why is None:
            say(f"registered {name} again from its manifest (complete, but not in the index)")
            adopted.append(name)
    return adopted


def _ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    try:
        return datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return 0.0


def _choose(store: Store, live: set[str], budget: int | None, *, checked: bool = True,
            keep_dead_for: float | None = None, now: float = 0.0, pooled=None, extra=None,
            report: dict[str, Any] | None = None, predict: bool = False) -> list[dict[str, Any]]:
    """Dead paths, crash leftovers first, then least recently used; cut at the byte budget (on
    disk, predicted by accounting.Tally). With `checked`, every unregistered directory left is one
    `_adopt_unregistered` found incomplete. With `keep_dead_for`, a registered dead path rooted
    (as a gc last saw it, or a generation record says) or used less than that long ago is kept."""
    rows = {r.name: r for r in store.index.paths()}
    rooted = store.index.last_rooted() if keep_dead_for is not None else {}
    leftovers: list[dict[str, Any]] = []  # the result's items: name, size, reason, last_used (freed added)
    registered: list[dict[str, Any]] = []
    on_disk = set()
    for entry in os.scandir(store.layout.store):
        name = entry.name
        on_disk.add(name)
        if name in live or name.startswith("."):
            continue
        if name in rows:
            row = rows[name]
            if keep_dead_for is not None:
                last = max(_ts(rooted.get(name)), _ts(row.last_used))
                if now - last < keep_dead_for:
                    if report is not None and name not in report["kept_by_grace"]:
                        report["kept_by_grace"].append(name)
                    continue
            registered.append({"name": name, "size": row.size, "reason": "no root holds it",
                               "last_used": row.last_used})
        else:
            if name.endswith(".partial"):
                what = "an unfinished build"
            elif checked:
                what = "unregistered and incomplete (left by a crash)"
            else:
                what = "unregistered (a gc registers it again if its manifest shows it complete)"
            leftovers.append({"name": name, "size": None, "reason": what, "last_used": ""})
    # Registered rows whose directory is gone are forgotten too (nothing to free).
    for name in rows:
        if name not in on_disk and name not in live:
            registered.append({"name": name, "size": 0, "reason": "registered but missing on disk", "last_used": ""})
    tally = Tally(pooled, extra)
    chosen = []
    for item in leftovers + sorted(registered, key=lambda r: _ts(r["last_used"])):
        if budget is not None and tally.freed >= budget:
            break
        apparent = tally.apparent
        if predict:
            # What the path costs, as recorded when it was registered (core/footprint.py): a
            # prediction walks only a tree without a record that still describes it.
            tree = store.layout.store / _component(item["name"])
            item["freed"] = tally.add(tree, _record(store.index.tool_info(footprint.KIND, item["name"]), tree))
        else:
            item["freed"] = 0
        if item["size"] is None:
            item["size"] = tally.apparent - apparent if predict else _apparent(store.layout.store / item["name"])
        chosen.append(item)
    return chosen


def _record(record: Any, tree: Path) -> dict | None:
    """`record` when it is a footprint of `tree` as it is now (the same directory)."""
    if record is None:
        return None
    try:
        st = os.lstat(tree)
    except OSError:
        return None
    return record if footprint.valid(record, st) else None


def _apparent(tree: Path) -> int:
    return sum(st.st_size for _, st in walk(tree) if stat.S_ISREG(st.st_mode))


def _component(name: str) -> str:
    """`name` if it is one entry of store/ (a registered name is checked by the index, a leftover's
    comes from listing store/): nothing gc renames is ever outside store/."""
    if not name or name in (".", "..") or os.sep in name or "\0" in name:
        raise IndexError_(f"refusing to collect {name[:80]!r}: not an entry of the store directory")
    return name


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


def _remove_stale_key_locks(layout: Layout, live_temp: set[str]) -> int:
    """Lock files of keys no live process is building. Called with the gc lock held exclusively: a
    builder adds its temp root (which needs the gc lock) before it opens its key's lock file, so no
    process can be holding or about to open a lock file whose key no live temp root names. (Deleting
    a lock file someone may still open would let two processes lock two different inodes.)"""
    from llmgw_store.core.keys import KEY_RE, key_of_name

    busy = {key_of_name(n.removesuffix(".partial")) for n in live_temp}
    removed = 0
    for entry in os.scandir(layout.locks):
        key, _, ext = entry.name.partition(".")
        # A key's, never `profile-<p>` (32 characters for a 24-character profile name) or the gc lock.
        if ext in ("lock", "owner") and KEY_RE.fullmatch(key) and key not in busy:
            os.unlink(entry.path)
            removed += 1
    return removed


PYC_UNUSED_S = 30 * 86400  # a bytecode cache entry no build has used for this long goes
PYC_TEMP_S = 3600.0  # a build's temporary file in the bytecode cache older than this was left by a crash
PYC_PRUNE_EVERY_S = 86400.0  # the walk for stale bytecode entries runs at most once a day (always with --max-cache)


def _prune_pool(pool: Path, dry_run: bool = False, names: set[str] | None = None) -> int:
    """Delete the files of optimise's pool that no store path links any more (an inode whose only
    link is the pool's: the pool links store files only): those named in `names`, else all.
    Returns bytes freed on disk."""
    freed = 0
    if names is not None:
        for name in names:
            path = os.path.join(pool, name)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
                freed += on_disk(st) if dry_run else _unlink(path, st)
        return freed
    for rel, st in walk(pool):
        if rel and stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            freed += on_disk(st) if dry_run else _unlink(os.path.join(pool, rel), st)
    return freed


def _prune_stale_pyc(pyc_cache: Path, pool: Path, linked_only: bool = False) -> int:
    """The bytecode cache's entries that are their own copy (one link) and that no build has used
    for PYC_UNUSED_S (a reuse sets such an entry's mtime); entries that are a store path's pyc
    (build/bytecode.link_cache made them links to it) while a path links them (they cost nothing,
    and their times are the store's), and once only optimise's pool does, with them (the pool's copy
    goes in the next gc); with whatever there is not an entry (a crashed build's temporary files).
    Only unlinks: nothing here changes an inode a store path may share. `linked_only`: only the
    entries that are store inodes (after paths were deleted). Returns bytes freed on disk."""
    from llmgw_store.build.bytecode import ENTRY_RE, TEMP_PREFIX

    freed = 0
    now = time.time()
    pooled = inodes_of(pool)
    for rel, st in walk(pyc_cache):
        if not rel or stat.S_ISDIR(st.st_mode):
            continue
        name = os.path.basename(rel)
        if linked_only:
            stale = st.st_nlink > 1 and ENTRY_RE.fullmatch(name) is not None \
                and st.st_nlink - 1 - ((st.st_dev, st.st_ino) in pooled) <= 0
        elif name.startswith(TEMP_PREFIX):
            stale = now - st.st_mtime > PYC_TEMP_S
        elif not ENTRY_RE.fullmatch(name):
            stale = True
        elif st.st_nlink > 1:
            stale = st.st_nlink - 1 - ((st.st_dev, st.st_ino) in pooled) <= 0
        else:
            stale = now - st.st_mtime > PYC_UNUSED_S
        if stale:
            freed += _unlink(os.path.join(pyc_cache, rel), st)
    return freed


def _unlink(path: str, st: os.stat_result) -> int:
    """Bytes freed on disk by removing `path` (none if another link keeps its inode)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return on_disk(st) if st.st_nlink <= 1 else 0


UV_CACHE_TIMEOUT_S = 120.0
WHEEL_HOME_LOCK_S = 10.0  # gc waits this long (at most --lock-timeout) for uv's cache lock to prune the wheel home


def _prune_uv_cache(store: Store, dry_run: bool) -> int:
    """uv's pointers to archives that are gone, where its archive bucket is the wheel home (never
    `uv cache prune` there: it would take the store's link to the wheel home for a stale bucket);
    else `uv cache prune`: what nothing in uv's cache points at any more (unreferenced archives,
    stale buckets). Entries a path was built from are pointed at, so they stay; `--max-cache`
    (cachelog.py) removes entries by live use. uv takes its own cache lock, so builds in flight are
    safe; the wait for it is bounded and a busy cache is skipped until the next gc."""
    from llmgw_store.base.errors import CommandError, IntegrityError, LockTimeout, UnsafePathError
    from llmgw_store.build import uv as uvmod
    from llmgw_store.build.cacheuse import bucket_dir, uv_cache_lock
    from llmgw_store.roots.cachelog import prune_uv_pointers

    cache = store.layout.uv_cache
    if dry_run:
        say("would prune uv's cache")
        return 0
    before = _cost(cache)
    if bucket_dir(cache) == store.layout.wheel_home:
        try:
            with uv_cache_lock(cache, UV_CACHE_TIMEOUT_S):
                present = {n for n in os.listdir(store.layout.wheel_home)}
                gone = prune_uv_pointers(store, present)
        except (OSError, LockTimeout) as exc:
            say(f"left the uv cache alone this time: {exc}")
            return 0
        freed = max(0, before - _cost(cache))
        say(f"uv's pointers to {gone} archive(s) no longer unpacked: freed {human_size(freed)}")
        return freed
    pinned = [r for r in store.index.paths() if r.engine == "uv" and r.version == uvmod.UV_VERSION]
    binary: Path | None
    if pinned:
        binary = store.layout.path_of(pinned[0].name) / "bin" / "uv"
    else:
        try:
            binary = uvmod.checked_shipped(store)  # trusted, and checked against pip's RECORD, before it runs
        except (IntegrityError, UnsafePathError) as exc:
            say(f"left the uv cache alone this time: {exc}")
            return 0
        if binary is None:
            say("left the uv cache alone this time: no uv to prune it with")
            return 0
    try:
        uvmod.run([binary, "cache", "prune"], what="uv cache prune", log_dir=store.layout.logs, timeout=UV_CACHE_TIMEOUT_S,
                  env=uvmod.clean_env(UV_NO_CONFIG="1", UV_CACHE_DIR=str(cache)), cwd=store.layout.tmp)
    except CommandError as exc:
        say(f"left the uv cache alone this time: {exc}")
        return 0
    freed = max(0, before - _cost(cache))
    say(f"uv cache prune: freed {human_size(freed)}")
    return freed


def _cost(tree: Path) -> int:
    t = Tally()
    t.add(tree)
    return t.freed


DOWNLOAD_GRACE_S = 3600.0


def _prune_downloads(layout: Layout) -> int:
    """Downloaded archives are kept only until what they fed is in the store; one younger than an
    hour may still be on its way into a build in flight, so it stays."""
    freed = 0
    cutoff = time.time() - DOWNLOAD_GRACE_S
    for entry in os.scandir(layout.downloads) if layout.downloads.is_dir() else []:
        if entry.is_file(follow_symlinks=False) and not entry.name.startswith("."):
            st = entry.stat(follow_symlinks=False)
            if st.st_mtime < cutoff:
                freed += _unlink(entry.path, st)
    return freed


def print_roots(*, root: str | Path | None = None, lock_timeout: float = LOCK_TIMEOUT_S) -> Roots:
    """Each root and the store paths it holds (closure included), as gc would see them now."""
    try:
        store = Store.open(root, lock_timeout)
    except NoStoreError as exc:
        say(exc.nothing_to("hold"))
        return Roots(())
    with store, gc_lock(store.layout, shared=False, timeout=lock_timeout):
        return Roots(tuple(dataclasses.replace(r, paths=tuple(sorted(
            n for n in _closure(store, set(r.paths)) if not n.endswith(".partial")))) for r in roots(store)))
