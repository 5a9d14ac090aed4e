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

A crash anywhere leaves either a registered complete path, or an unregistered directory in
store/, or a tree in the trash (deleted by the next gc). The next gc registers an unregistered
directory again when its manifest shows it complete (tree rehashed; the index may simply have been
lost) and judges it like any registered path; one that is not complete is garbage.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.core import debug
from llmgw_store.core.errors import IndexError_, UsageError
from llmgw_store.core.fsutil import force_rmtree, free_bytes, walk_files
from llmgw_store.core.keys import is_store_name
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.names import check_profile
from llmgw_store.core.report import say
from llmgw_store.core.results import Result
from llmgw_store.core.temproots import gc_lock, read_all


def _du(path: Path) -> int:
    return sum(st.st_size for _, st in walk_files(path))


def runtime_roots(layout: Layout) -> dict[str, set[str]]:
    """Store path names used by running processes -> the pids using them."""
    stores = {os.fspath(layout.store), os.path.realpath(layout.store)}
    pattern = re.compile("(?:" + "|".join(re.escape(s) for s in stores) + r")/([^/\0\s:'\"]+)")
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
    return found


def roots(store: Store, excluded_generations: set[tuple[str, int]] = frozenset()) -> dict[str, list[str]]:
    """root description -> store path names it holds directly."""
    from llmgw_store.build.uv import UV_VERSION
    from llmgw_store.roots.pins import list_pins

    layout = store.layout
    out: dict[str, list[str]] = {}
    for entry in os.scandir(layout.profiles) if layout.profiles.is_dir() else []:
        m = re.fullmatch(r"(.+)-(\d+)-link", entry.name)
        if m and entry.is_symlink() and (m.group(1), int(m.group(2))) not in excluded_generations:
            out[f"profile {m.group(1)} generation {m.group(2)}"] = [Path(os.readlink(entry.path)).name]
    for pin, name in list_pins(layout).items():
        out[f"pin {pin}"] = [name]
    live, _ = read_all(layout)
    if live:
        out["temp roots of live processes"] = sorted(live)
    for name, pids in runtime_roots(layout).items():
        out[f"in use by pid {', '.join(sorted(pids, key=int))}"] = [name]
    uv = [r["name"] for r in store.index.paths() if r["engine"] == "uv" and r["version"] == UV_VERSION]
    if uv:
        out["the store's pinned uv"] = uv
    return out


@dataclass(frozen=True)
class GcReport(Result):
    """What gc did (or with dry_run would do): each path deleted (name, size, reason), bytes freed
    per kind, each root and what it holds, generations deleted, complete paths registered again."""

    dry_run: bool
    deleted: tuple[dict[str, Any], ...] = ()
    generations_deleted: dict[str, list[int]] = field(default_factory=dict)
    freed: dict[str, int] = field(default_factory=dict)
    kept: dict[str, list[str]] = field(default_factory=dict)
    registered: tuple[str, ...] = ()
    seconds: float = 0.0
    free_before: int | None = None
    free_after: int | None = None


@dataclass(frozen=True)
class Roots(Result):
    """Each gc root and the store paths it holds (closure included)."""

    roots: dict[str, list[str]]

    def to_json(self) -> dict[str, list[str]]:
        return dict(self.roots)


def collect(
    *,
    root: str | Path | None = None,
    dry_run: bool = False,
    delete_older_than: float | None = None,
    keep: int | None = None,
    max_freed: int | None = None,
    min_free: int | None = None,
    max_cache: int | None = None,
    lock_timeout: float = LOCK_TIMEOUT_S,
) -> GcReport:
    """Every lock (the gc lock, each profile's, the index) is waited for at most `lock_timeout` s."""
    started = time.monotonic()
    report: dict[str, Any] = {"dry_run": dry_run, "deleted": [], "generations_deleted": {}, "freed": {}, "kept": {}}
    with Store.open(root, lock_timeout) as store:
        layout = store.layout
        trash = layout.trash
        if min_free is not None:
            free = free_bytes(layout.store)
            if free >= min_free:
                say(f"{free / 1e9:.1f} GB free, at least --min-free: nothing to do")
                report.update(seconds=round(time.monotonic() - started, 3), free_before=free)
                return _report(report)
            budget = min_free - free
        else:
            budget = None
        if max_freed is not None:
            budget = max_freed if budget is None else min(budget, max_freed)

        excluded: set[tuple[str, int]] = set()
        if delete_older_than is not None or keep is not None:
            excluded = _prune_generations(store, delete_older_than, keep, dry_run, lock_timeout, report)

        with gc_lock(layout, shared=False, timeout=lock_timeout):
            # From here until the lock is released no process can add a temp root: the roots read
            # below are all the roots there are.
            if not dry_run:
                report["registered"] = _adopt_unregistered(store, read_all(layout)[0])
            root_map = roots(store, excluded)
            live = _closure(store, {n for names in root_map.values() for n in names})
            report["kept"] = {desc: names for desc, names in root_map.items()}
            live_temp, stale = read_all(layout)
            report["freed"]["stale_files"] = 0
            if not dry_run:
                for f in stale:
                    f.unlink(missing_ok=True)
                report["freed"]["stale_files"] = len(stale) + _remove_stale_key_locks(layout, live_temp)
            dead = _choose(store, live, budget, checked=not dry_run)
            for item in dead:
                say(f"{'would delete' if dry_run else 'deleting'} {item['name']} ({item['size'] / 1e6:.1f} MB, {item['reason']})")
                if dry_run:
                    continue
                store.index.forget(item["name"])
                debug.pause("GC_AFTER_FORGET")  # forgotten, still in store/
                src = layout.store / _component(item["name"])
                if os.path.lexists(src):
                    os.rename(src, trash / f"{item['name']}.{os.getpid()}.{time.monotonic_ns()}")
            report["deleted"] = dead
        # The lock is released: builds and activations go on while the trash is deleted.
        report["freed"]["store_paths"] = sum(d["size"] for d in dead)
        if not dry_run:
            debug.pause("GC_BEFORE_EMPTY_TRASH")
            for entry in os.scandir(trash):
                force_rmtree(Path(entry.path))
            report["freed"]["downloads"] = _prune_downloads(layout)
        report["freed"]["uv_cache"] = _prune_uv_cache(store, max_cache, dry_run)
        if not dry_run:
            # After the uv cache: a file the uv cache still links costs nothing. Exclusive again,
            # briefly: optimise links into the pool with the lock shared.
            with gc_lock(layout, shared=False, timeout=lock_timeout):
                report["freed"]["linked_caches"] = _prune_linked_caches(layout.links_pool, layout.pyc_cache)
        report["seconds"] = round(time.monotonic() - started, 3)
        report["free_after"] = free_bytes(layout.store)
        return _report(report)


def _report(report: dict[str, Any]) -> GcReport:
    return GcReport(**{**report, "deleted": tuple(report["deleted"]), "registered": tuple(report.get("registered", ()))})


def _closure(store: Store, names: set[str]) -> set[str]:
    """The roots and what they reference (recorded at registration, read from the index)."""
    live = set(names) | set(store.index.closure(names))
    # a build in flight is rooted by its final name; its .partial is live with it
    return live | {n + ".partial" for n in live}


def _adopt_unregistered(store: Store, busy: set[str]) -> list[str]:
    """Register again each complete directory of store/ that the index does not know (Store.adopt,
    tree rehashed), so that it, and what it references, is judged like any registered path: kept
    when a root holds it, collected when none does. Called with the gc lock held exclusively: no
    temp root can be added, so a directory no live temp root names has no builder (a builder adds
    its temp root before it takes the key's lock) and nothing else writes it meanwhile."""
    known = {r["name"] for r in store.index.paths()}
    adopted = []
    for entry in os.scandir(store.layout.store):
        name = entry.name
        if (name in known or name in busy or not is_store_name(name)
                or not entry.is_dir(follow_symlinks=False)):
            continue
        if store.adopt(name, rehash=True) is None:
            say(f"registered {name} again from its manifest (complete, but not in the index)")
            adopted.append(name)
    return adopted


def _choose(store: Store, live: set[str], budget: int | None, checked: bool = True) -> list[dict[str, Any]]:
    """Dead paths, crash leftovers first, then least recently used; cut at the byte budget. With
    `checked`, every unregistered directory left is one `_adopt_unregistered` found incomplete."""
    rows = {r["name"]: r for r in store.index.paths()}
    leftovers, registered = [], []
    for entry in os.scandir(store.layout.store):
        name = entry.name
        if name in live or name.startswith("."):
            continue
        if name in rows:
            registered.append({"name": name, "size": rows[name]["size"], "reason": "no root holds it",
                               "last_used": rows[name]["last_used"]})
        else:
            if name.endswith(".partial"):
                what = "an unfinished build"
            elif checked:
                what = "unregistered and incomplete (left by a crash)"
            else:
                what = "unregistered (a gc registers it again if its manifest shows it complete)"
            leftovers.append({"name": name, "size": _du(Path(entry.path)), "reason": what, "last_used": ""})
    # Registered rows whose directory is gone are forgotten too (nothing to free).
    on_disk = {e.name for e in os.scandir(store.layout.store)}
    for name, row in rows.items():
        if name not in on_disk and name not in live:
            registered.append({"name": name, "size": 0, "reason": "registered but missing on disk", "last_used": ""})
    chosen, total = [], 0
    for item in leftovers + sorted(registered, key=lambda r: r["last_used"]):
        if budget is not None and total >= budget:
            break
        chosen.append(item)
        total += item["size"]
    return chosen


def _component(name: str) -> str:
    """`name` if it is one entry of store/ (a registered name is checked by the index, a leftover's
    comes from listing store/): nothing gc renames is ever outside store/."""
    if not name or name in (".", "..") or os.sep in name or "\0" in name:
        raise IndexError_(f"refusing to collect {name[:80]!r}: not an entry of the store directory")
    return name


def _prune_generations(store: Store, older_than, keep, dry_run, lock_timeout, report) -> set[tuple[str, int]]:
    from llmgw_store.roots.profiles import delete_generations_locked, profile_lock

    excluded = set()
    for entry in sorted(os.scandir(store.layout.profiles), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name.endswith("-link") or not entry.is_symlink():
            continue
        profile = entry.name
        try:
            check_profile(profile)
        except UsageError:
            say(f"skipping {entry.name!r} in profiles/: not a profile name")
            continue
        with profile_lock(store, profile, lock_timeout):
            r = delete_generations_locked(store, profile, None, older_than, keep, dry_run)
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


def _prune_linked_caches(pool: Path, pyc_cache: Path) -> int:
    """Delete the files of optimise's pool that no store path links any more (an inode whose only
    link is the pool's: the pool links store files only), and the bytecode cache's entries that no
    build has used for PYC_UNUSED_S (entries are copied into environments, never linked, so links
    say nothing about them; a reuse sets the mtime), with whatever there is not an entry (an older
    format's hardlinks into environments, a crashed build's temporary files). Returns bytes freed."""
    from llmgw_store.build.bytecode import ENTRY_RE, TEMP_PREFIX

    freed = 0
    for p, st in walk_files(pool):
        if st.st_nlink <= 1:
            freed += _unlink(p, st)
    now = time.time()
    for p, st in walk_files(pyc_cache):
        name = os.path.basename(p)
        if name.startswith(TEMP_PREFIX):
            stale = now - st.st_mtime > PYC_TEMP_S
        else:
            stale = not ENTRY_RE.fullmatch(name) or now - st.st_mtime > PYC_UNUSED_S
        if stale:
            freed += _unlink(p, st)
    return freed


def _unlink(path: str, st: os.stat_result) -> int:
    """Bytes freed by removing `path` (none if another link keeps its inode)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return st.st_size if st.st_nlink <= 1 else 0


def _exclusive_bytes(tree: Path) -> int:
    """Bytes of regular files under `tree` that no other directory shares (link count 1): a cache
    file hardlinked into an environment costs nothing extra, and removing it frees nothing."""
    return sum(st.st_size for _, st in walk_files(tree) if st.st_nlink == 1)


UV_CACHE_TIMEOUT_S = 120.0


def _prune_uv_cache(store: Store, max_cache: int | None, dry_run: bool) -> int:
    """`uv cache prune` (entries nothing references), or `uv cache clean` when what the cache holds
    alone is over `max_cache`. uv takes its own cache lock, so builds in flight are safe; the wait
    for it is bounded and a busy cache is skipped until the next gc."""
    from llmgw_store.build import uv as uvmod
    from llmgw_store.core.errors import CommandError

    cache = store.layout.uv_cache
    before = _exclusive_bytes(cache)
    verb = "clean" if max_cache is not None and before > max_cache else "prune"
    if dry_run:
        say(f"would run `uv cache {verb}` ({before / 1e6:.1f} MB in the uv cache that no environment shares)")
        return 0
    pinned = [r for r in store.index.paths() if r["engine"] == "uv" and r["version"] == uvmod.UV_VERSION]
    if pinned:
        binary = store.layout.path_of(pinned[0]["name"]) / "bin" / "uv"
    else:
        from uv import find_uv_bin

        binary = Path(find_uv_bin())
    try:
        uvmod.run([binary, "cache", verb], what=f"uv cache {verb}", log_dir=store.layout.logs, timeout=UV_CACHE_TIMEOUT_S,
                  env=uvmod.clean_env(UV_NO_CONFIG="1", UV_CACHE_DIR=str(cache)), cwd=store.layout.tmp)
    except CommandError as exc:
        say(f"left the uv cache alone this time: {exc}")
        return 0
    freed = max(0, before - _exclusive_bytes(cache))
    say(f"uv cache {verb}: freed {freed / 1e6:.1f} MB")
    return freed


DOWNLOAD_GRACE_S = 3600.0


def _prune_downloads(layout: Layout) -> int:
    """Downloaded archives are kept only until what they fed is in the store; one younger than an
    hour may still be on its way into a build in flight, so it stays."""
    freed = 0
    cutoff = time.time() - DOWNLOAD_GRACE_S
    for entry in os.scandir(layout.downloads) if layout.downloads.is_dir() else []:
        if entry.is_file() and not entry.name.startswith(".") and entry.stat().st_mtime < cutoff:
            freed += entry.stat().st_size
            os.unlink(entry.path)
    return freed


def print_roots(*, root: str | Path | None = None, lock_timeout: float = LOCK_TIMEOUT_S) -> Roots:
    """Each root and the store paths it holds (closure included), as gc would see them now."""
    with Store.open(root, lock_timeout) as store:
        with gc_lock(store.layout, shared=False, timeout=lock_timeout):
            return Roots({desc: sorted(n for n in _closure(store, set(names)) if not n.endswith(".partial"))
                          for desc, names in roots(store).items()})
