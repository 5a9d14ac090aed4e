"""Pruning the caches by what live store paths use (`gc --max-cache SIZE`).

Entries, and what says a live path uses one:
- uv: an unpacked wheel, `cache/uv/archive-v0/<id>/`. Each build records the archives it installed
  from (build/cacheuse.py, table `cache_uses`); a repair or a cold rollback of a live path
  reinstalls from them offline. An entry is live when a path of the live closure recorded it.
- pyc: a compiled module, `cache/pyc/<magic>/<xx>/<key>.<tag>.pyc`. Entries are copied into
  environments byte for byte, so the record of which ones a path used is its own verified contents
  listing (`.llmgw/contents`, blake3 of every pyc): an entry is live when its bytes are a pyc of a
  live path. (Losing one costs a recompile, never correctness.)

With `max_cache`, while what the caches cost on disk is over it: entries no live path uses go
first, least recently used first (uv: the later of the archive's time and its last recorded use;
pyc: its mtime, which a reuse sets); entries a live path uses only with `prune_live`. What an
entry costs is what removing it frees (accounting.Tally: blocks, shared inodes counted only when
their last link goes). uv entries are removed holding uv's own cache lock exclusively, the lock
every uv command takes shared, so no build in flight is reading one.

Nothing in the index is turned into a path: recorded entry names are only compared with the names
of real directories found in the bucket (a row naming `../x` matches nothing and is dropped).
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from llmgw_store.build import cacheuse
from llmgw_store.core.errors import LockTimeout, StoreError
from llmgw_store.core.local_store import Store
from llmgw_store.core.report import say
from llmgw_store.core.temproots import read_all
from llmgw_store.roots.accounting import Tally, listed_files, remove_tree, walk

POINTER_SUFFIXES = ("", ".http", ".msgpack", ".rev", ".lock")
MAX_POINTER_ENTRIES = 1 << 22  # entries of uv's buckets read when looking for links to archives


@dataclass
class Entry:
    cache: str
    name: str
    path: Path
    cost: int
    last_used: float
    live: bool | None  # None: not known yet (pyc entries are checked only when about to go)


def _ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return 0.0


def cache_cost(store: Store) -> int:
    """Bytes on disk that removing both caches whole would free."""
    t = Tally()
    t.add(store.layout.uv_cache)
    t.add(store.layout.pyc_cache)
    return t.freed


def uv_entries(store: Store, live: set[str], tidy: bool = True) -> list[Entry]:
    """Every archive of uv's cache; live when a path of `live` recorded it. With `tidy`, records
    of paths neither registered nor live, and malformed records, are dropped."""
    uses: dict[str, list[dict]] = {}
    registered = {r.name for r in store.index.paths()}
    rows = store.index.cache_uses(cacheuse.CACHE)
    # Read after the records: a build that recorded them added its temp root before it started,
    # so it is seen here, and its entries count as live, whether or not it has registered yet.
    live = live | read_all(store.layout)[0]
    for row in rows:
        entry, user = str(row.entry), row.path_name
        if not cacheuse.ARCHIVE_RE.fullmatch(entry):
            if tidy:
                store.index.drop_cache_entry(cacheuse.CACHE, entry)  # malformed (planted): never a path
            continue
        if user not in registered and user not in live:
            if tidy:
                store.index.forget_cache_uses(user)  # a path that is gone, and no build in flight
            continue
        uses.setdefault(entry, []).append(row)
    out = []
    for a in cacheuse.archives(store.layout.uv_cache):
        rows = uses.get(a.name, [])
        t = Tally()
        t.add(a.path)
        mtime = a.stat(follow_symlinks=False).st_mtime
        out.append(Entry("uv", a.name, Path(a.path), t.freed, max([mtime] + [_ts(r.used_at) for r in rows]),
                         any(r.path_name in live for r in rows)))
    return out


def pyc_entries(store: Store) -> list[Entry]:
    from llmgw_store.build.bytecode import ENTRY_RE

    out = []
    for rel, st in walk(store.layout.pyc_cache):
        if stat.S_ISREG(st.st_mode) and ENTRY_RE.fullmatch(os.path.basename(rel)):
            cost = st.st_blocks * 512 if st.st_nlink <= 1 else 0
            out.append(Entry("pyc", rel, store.layout.pyc_cache / rel, cost, st.st_mtime, None))
    return out


def live_pyc_digests(store: Store, live: set[str]) -> set[str]:
    digests: set[str] = set()
    for name in live:
        if name.endswith(".partial"):
            continue
        try:
            env = store.layout.path_of(name)
        except StoreError:  # not a store name: holds nothing
            continue
        # every file's digest, not only the pycs': an entry matching any file of a live path is live
        digests |= {digest for _, digest in listed_files(env) or []}
    return digests


def _is_live_pyc(path: Path, digests: set[str]) -> bool:
    from llmgw_store.core.manifest import file_digest

    try:
        return file_digest(path) in digests
    except OSError:
        return False


def _links_to(uv_cache: Path) -> dict[str, list[str]]:
    """archive id -> paths (relative to the cache) of uv's links to it, outside the archive bucket."""
    out: dict[str, list[str]] = {}
    for i, (rel, st) in enumerate(walk(uv_cache)):
        if i >= MAX_POINTER_ENTRIES:
            break
        if rel.startswith(cacheuse.ARCHIVE_BUCKET + "/") or not stat.S_ISLNK(st.st_mode):
            continue
        try:
            target = os.readlink(uv_cache / rel)
        except OSError:
            continue
        head, _, ident = target.rstrip("/").rpartition("/")
        if head.endswith(cacheuse.ARCHIVE_BUCKET) and cacheuse.ARCHIVE_RE.fullmatch(ident):
            out.setdefault(ident, []).append(rel)
    return out


@contextmanager
def uv_cache_lock(uv_cache: Path, timeout: float) -> Iterator[None]:
    """uv's own lock on its cache (`.lock`, flock), exclusive: every uv command holds it shared."""
    fd = os.open(uv_cache / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"uv's cache lock {uv_cache / '.lock'} was held for {timeout:g}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _remove_uv(store: Store, e: Entry, links: dict[str, list[str]]) -> int:
    cache = store.layout.uv_cache
    freed = 0
    # the pointers first: uv never meets a link to an archive that is half gone
    for rel in links.get(e.name, []):
        for suffix in POINTER_SUFFIXES:
            freed += remove_tree(cache / (rel + suffix))
    freed += remove_tree(e.path)
    store.index.drop_cache_entry(cacheuse.CACHE, e.name)
    return freed


def prune(store: Store, max_cache: int, live: set[str], *, prune_live: bool, dry_run: bool,
          timeout: float) -> dict:
    """Remove cache entries until the caches cost at most `max_cache` bytes (see the docstring).
    Returns {"entries", "bytes", "live_entries", "kept_live", "cost_before", "cost_after"}."""
    cost = cache_cost(store)
    report = {"entries": 0, "bytes": 0, "live_entries": 0, "kept_live": 0, "cost_before": cost, "cost_after": cost}
    if cost <= max_cache:
        return report
    entries = uv_entries(store, live, tidy=not dry_run) + pyc_entries(store)
    digests: set[str] | None = None
    dead, alive = [], []
    for e in sorted(entries, key=lambda e: (e.last_used, e.cache, e.name)):
        (alive if e.live else dead).append(e)
    links = _links_to(store.layout.uv_cache) if not dry_run else {}

    def take(e: Entry) -> None:
        nonlocal cost
        freed = e.cost if dry_run else (_remove_uv(store, e, links) if e.cache == "uv" else remove_tree(e.path))
        say(f"{'would prune' if dry_run else 'pruned'} {e.cache} cache entry {e.name} "
            f"({freed / 2**20:.1f} MiB{', used by a live path' if e.live else ''})")
        cost -= freed
        report["entries"] += 1
        report["bytes"] += freed
        report["live_entries"] += 1 if e.live else 0

    with ExitStack() as held:
        if not dry_run:
            try:
                held.enter_context(uv_cache_lock(store.layout.uv_cache, timeout))
            except (OSError, LockTimeout) as exc:  # a planted `.lock` link, or uv busy past the timeout
                say(f"left the caches alone this time: {exc}")
                return report
        for e in dead:
            if cost <= max_cache:
                break
            if e.cache == "pyc":
                if digests is None:
                    digests = live_pyc_digests(store, live)
                e.live = _is_live_pyc(e.path, digests)
                if e.live:
                    alive.append(e)
                    continue
            take(e)
        alive.sort(key=lambda e: (e.last_used, e.cache, e.name))
        for e in alive:
            if cost <= max_cache:
                break
            if not prune_live:
                report["kept_live"] += 1
                continue
            take(e)
    report["cost_after"] = max(cost, 0)
    return report
