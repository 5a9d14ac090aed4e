"""Pruning the caches beside the store, after the sweep: optimise's pool, the bytecode cache, uv's
cache and the downloads. Only unlinks: nothing here changes an inode a store path may share.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from llmgw_store.app.units import human_size
from llmgw_store.base.report import say
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.roots.accounting import Tally, inodes_of, on_disk, walk

PYC_UNUSED_S = 30 * 86400  # a bytecode cache entry no build has used for this long goes
PYC_TEMP_S = 3600.0  # a build's temporary file in the bytecode cache older than this was left by a crash
PYC_PRUNE_EVERY_S = 86400.0  # the walk for stale bytecode entries runs at most once a day (always with --max-cache)


def prune_pool(pool: Path, dry_run: bool = False, names: set[str] | None = None) -> int:
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


def prune_stale_pyc(pyc_cache: Path, pool: Path, linked_only: bool = False) -> int:
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


def linked_pyc(pyc_cache: Path) -> dict[tuple[int, int], int]:
    """inode -> link count of the bytecode cache's entries with other links (bytecode.link_cache's)."""
    from llmgw_store.build.bytecode import ENTRY_RE

    return {(st.st_dev, st.st_ino): st.st_nlink for rel, st in walk(pyc_cache)
            if rel and stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and ENTRY_RE.fullmatch(os.path.basename(rel))}


def _unlink(path: str, st: os.stat_result) -> int:
    """Bytes freed on disk by removing `path` (none if another link keeps its inode)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return on_disk(st) if st.st_nlink <= 1 else 0


UV_CACHE_TIMEOUT_S = 120.0
WHEEL_HOME_LOCK_S = 10.0  # gc waits this long (at most --lock-timeout) for uv's cache lock to prune the wheel home


def prune_uv_cache(store: Store, dry_run: bool) -> int:
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


def prune_downloads(layout: Layout) -> int:
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
