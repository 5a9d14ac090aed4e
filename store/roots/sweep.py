"""The sweep: under the gc lock held exclusively, read the roots, choose the dead paths, forget
each in the index and rename it into ROOT/var/trash (roots/trash.py deletes the trash once the
lock is released). The order of a round is roots/gc.py's.
"""

from __future__ import annotations

import os
import stat
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import DiskFullError, IndexError_
from llmgw_store.base.report import say
from llmgw_store.core import footprint, proofs
from llmgw_store.core.index import ReferencedError, now_iso
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.temproots import gc_lock, read_all, remove_stale
from llmgw_store.roots.accounting import Tally, inodes_of, walk
from llmgw_store.roots.cachelog import wheel_home_inodes
from llmgw_store.roots.cacheprune import linked_pyc
from llmgw_store.roots.marking import adopt_unregistered, closure, held_names, roots
from llmgw_store.roots.trash import LEAVE, left


def sweep(store: Store, excluded, budget, keep_dead_for, dry_run, lock_timeout, report) -> tuple[list, set[str]]:
    """Under the gc lock: read the roots, record them, choose, forget and rename into the trash."""
    layout = store.layout
    first = report["rounds"] == 1
    with gc_lock(layout, shared=False, timeout=lock_timeout):
        # From here until the lock is released no process can add a temp root: the roots read
        # below are all the roots there are, and the temp-roots files are read once.
        live_temp, stale = read_all(layout)
        spared: set[str] = set()
        if first and not dry_run:
            report["registered"] = adopt_unregistered(store, live_temp, spared)
        found = roots(store, excluded, temp=live_temp)
        live = closure(store, held_names(found)) | spared
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
                # Deleted first, recorded after (record_deferred): until then the index names a
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
                    if exc.errno not in LEAVE:
                        raise
                    # Left where it is, unregistered: the next gc registers it again and retries.
                    left(os.fspath(src), exc, "left in store/", report)
                    item["kept"] = True
                    continue
                item["trash"] = trash
        dead = [item for item in dead if not item.get("kept")]
        report["deleted"] += dead
    return dead, live


def _gc_links(store: Store) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """(inode -> link count now, inode -> how many of its links gc removes itself) for the inodes
    of optimise's pool, the wheel home and the bytecode cache's entries that are store inodes in
    the pool too (the ones gc unlinks with the last path: prune_stale_pyc's `linked_only`)."""
    pool = inodes_of(store.layout.links_pool)
    pyc = {ident: n for ident, n in linked_pyc(store.layout.pyc_cache).items() if ident in pool}
    maps = [pool, wheel_home_inodes(store), pyc]
    nlinks: dict[tuple[int, int], int] = {}
    extra: dict[tuple[int, int], int] = {}
    for m in maps:
        for ident, n in m.items():
            nlinks[ident] = n
            extra[ident] = extra.get(ident, 0) + 1
    return nlinks, {k: v for k, v in extra.items() if v != 1}


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
    `adopt_unregistered` found incomplete. With `keep_dead_for`, a registered dead path rooted
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


def record_deferred(store: Store, report: dict[str, Any]) -> None:
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
