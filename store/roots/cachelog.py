"""Pruning the caches: the wheel home by its links (every gc), and both caches by what live store
paths use (`gc --max-cache SIZE`).

The wheel home (`store/.wheels`, uv's archive bucket: build/wheelhome.py) holds the unpacked
wheels environments link. Every gc removes the entries no file outside links any more — no store
path and no build in flight — and no cold generation's path was installed from, with their seals
and uv's pointers to them (`prune_wheel_home`): keeping uv's cache after a build costs nothing but
those pointers, and the wheels of cold generations (rolled back to offline) while their records
stay.

Entries, and what says a live path uses one:
- uv: an unpacked wheel, `cache/uv/archive-v0/<id>/` (the wheel home's `<id>`). Each build records
  the archives it installed from (build/cacheuse.py, table `cache_uses`); a repair or a cold
  rollback of a live path reinstalls from them offline. An entry is live when a path of the live
  closure recorded it.
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

import os
import stat
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from llmgw_store.base.errors import LockTimeout, StoreError
from llmgw_store.base.report import say
from llmgw_store.build import cacheuse
from llmgw_store.build.cacheuse import uv_cache_lock
from llmgw_store.core.index import CacheUse
from llmgw_store.core.local_store import Store
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
    """Bytes on disk that removing both caches whole would free (uv's includes the wheel home, its
    archive bucket: what store paths link there costs nothing)."""
    t = Tally()
    t.add(store.layout.uv_cache)
    t.add(store.layout.wheel_home)
    t.add(store.layout.pyc_cache)
    return t.freed


def uv_entries(store: Store, live: set[str], tidy: bool = True) -> list[Entry]:
    """Every archive of uv's cache; live when a path of `live` recorded it. With `tidy`, records
    of paths neither registered nor live, and malformed records, are dropped."""
    uses: dict[str, list[CacheUse]] = {}
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


def _remove_uv(store: Store, e: Entry, links: dict[str, list[str]]) -> int:
    cache = store.layout.uv_cache
    freed = 0
    # the pointers first: uv never meets a link to an archive that is half gone
    for rel in links.get(e.name, []):
        for suffix in POINTER_SUFFIXES:
            freed += remove_tree(cache / (rel + suffix))
    freed += remove_tree(e.path)
    _drop_seal(store, e.name)
    store.index.drop_cache_entry(cacheuse.CACHE, e.name)
    return freed


def _drop_seal(store: Store, ident: str) -> None:
    try:
        os.unlink(store.layout.wheel_seals / ident)
    except FileNotFoundError:
        pass


def _wheel_entries(store: Store) -> list[os.DirEntry]:
    """The wheel home's entries: well-named real directories (at most cacheuse.MAX_ARCHIVES)."""
    out: list[os.DirEntry] = []
    try:
        with os.scandir(store.layout.wheel_home) as it:
            for i, e in enumerate(it):
                if i >= cacheuse.MAX_ARCHIVES:
                    break
                if cacheuse.ARCHIVE_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                    out.append(e)
    except (FileNotFoundError, NotADirectoryError):
        pass
    return out


def wheel_home_inodes(store: Store) -> dict[tuple[int, int], int]:
    """(st_dev, st_ino) -> st_nlink of every file of the wheel home: like a pool entry, a link there
    is one gc removes once no store path links the file (accounting.Tally's `pooled`)."""
    out = {}
    for e in _wheel_entries(store):
        for _, st in walk(e.path):
            if stat.S_ISREG(st.st_mode):
                out[(st.st_dev, st.st_ino)] = st.st_nlink
    return out


def prune_wheel_home(store: Store, *, dry_run: bool, timeout: float, gone: frozenset[str] | set[str] = frozenset()
                     ) -> tuple[int, int]:
    """Remove the wheel home's entries no file outside links any more (no store path, no build in
    flight: wheelhome.linked) and no path a generation record names was installed from (its
    cache-use records stay while the record does), with their seals and uv's pointers to them; and
    seals whose entry is gone. Returns (entries, bytes freed on disk; with `dry_run`, what removing them would free).
    Holds uv's cache lock exclusively (every uv command holds it shared while it runs, so none is
    linking from an entry meanwhile); a lock not had within `timeout` leaves the wheel home as it is."""
    from llmgw_store.build import wheelhome

    layout = store.layout
    with ExitStack() as held:
        if not dry_run:
            try:
                held.enter_context(uv_cache_lock(layout.uv_cache, timeout))
            except (OSError, LockTimeout) as exc:
                say(f"left the wheel home alone this time: {exc}")
                return 0, 0
        # From here (the lock held) no uv process runs: an entry nothing links now cannot be about
        # to be linked by one; a build that has linked one keeps its links until it registers.
        entries = _wheel_entries(store)
        # What a generation record names (a cold generation, rolled back to offline from uv's
        # cache) keeps its entries: gc keeps its cache-use records when it deletes the path.
        # `gone`: paths deleted whose records a full disk has not let gc forget yet; their uses
        # hold nothing (unless a generation record names the path).
        cold = store.index.generation_path_names() if gone else set()
        recorded = {str(r.entry) for r in store.index.cache_uses(cacheuse.CACHE)
                    if r.path_name not in gone or r.path_name in cold}
        dead = [e for e in entries if e.name not in recorded and not wheelhome.linked(e.path)]
        freed = 0
        for e in dead:
            if dry_run:
                t = Tally()
                t.add(e.path)
                freed += t.freed
                continue
            freed += remove_tree(e.path)
            _drop_seal(store, e.name)
            store.index.drop_cache_entry(cacheuse.CACHE, e.name)
        if not dry_run:
            here = {e.name for e in entries} - {e.name for e in dead}
            _drop_orphan_seals(store, here)
            if dead:
                prune_uv_pointers(store, here)
    if dead:
        say(f"{'would remove' if dry_run else 'removed'} {len(dead)} wheel(s) no store path links from the wheel home "
            f"({freed / 2**20:.1f} MiB)")
    return len(dead), freed


def _drop_orphan_seals(store: Store, entries: set[str]) -> None:
    try:
        names = os.listdir(store.layout.wheel_seals)
    except OSError:
        return
    for n in names[:cacheuse.MAX_ARCHIVES]:
        if cacheuse.ARCHIVE_RE.fullmatch(n) and n not in entries:
            _drop_seal(store, n)


def prune_uv_pointers(store: Store, present: set[str]) -> int:
    """Remove uv's pointers (every suffix) to archives that are not in the wheel home any more:
    uv would fetch those wheels again in any case. Returns how many archives they named. Called
    with uv's cache lock held."""
    cache = store.layout.uv_cache
    gone = 0
    for ident, rels in _links_to(cache).items():
        if ident in present:
            continue
        gone += 1
        for rel in rels:
            for suffix in POINTER_SUFFIXES:
                remove_tree(cache / (rel + suffix))
    return gone


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
    dead: list[Entry] = []
    alive: list[Entry] = []
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
