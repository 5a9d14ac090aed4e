"""`doctor`: the index against the disk, and rebuilding the index from the manifests.

The index is a cache: every path's row can be made again from its manifest, every generation from
the profile links, every pin from gcroots/. History (the build log, publication memos) is
copied over from the old database as far as SQLite can still read it. The old file, whatever state it
is in (missing, empty, truncated, not a database, a WAL of garbage), is moved aside with its -wal and
-shm into `var/db.sqlite.bak-<time>/`, never opened in place and never deleted.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import LockTimeout, StoreError
from llmgw_store.base.report import say
from llmgw_store.core import manifest
from llmgw_store.core.index import Index
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import split_generation_link
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.temproots import gc_lock, read_all
from llmgw_store.system.trees import force_rmtree

HISTORY_TABLES = ("builds", "releases", "latest", "tools", "generations", "cache_uses", "gc_rooted")
MAX_BACKUPS_PER_SECOND = 100
MAX_OLD_DB_BYTES = 4 << 30  # an index this large is not one a store made: its history is not copied


def _store_dirs(layout: Layout) -> list[str]:
    return sorted(e.name for e in os.scandir(layout.store)
                  if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") and not e.name.endswith(".partial"))


def _links(layout: Layout) -> tuple[dict[tuple[str, int], str], dict[str, str]]:
    from llmgw_store.roots.pins import list_pins

    gens = {}
    for e in os.scandir(layout.profiles):
        gen = split_generation_link(e.name)
        if gen and e.is_symlink():
            gens[gen] = Path(os.readlink(e.path)).name
    return gens, list_pins(layout)


def check(store: Store) -> dict[str, list[str]]:
    layout, index = store.layout, store.index
    rows = {r.name: r for r in index.paths()}
    dirs = set(_store_dirs(layout))
    gens, pins = _links(layout)
    known_gens = index.live_generations()
    mismatched = []
    for name in sorted(dirs & rows.keys()):
        try:
            if manifest.read(layout.path_of(name)).get("content_hash") != rows[name].content_hash:
                mismatched.append(name)
        except (OSError, ValueError):
            mismatched.append(name)
    return {
        "registered_but_missing": sorted(rows.keys() - dirs),
        "present_but_unregistered": sorted(dirs - rows.keys()),
        "manifest_differs_from_index": mismatched,
        "generations_not_in_index": sorted(f"{p}-{n}" for p, n in gens.keys() - known_gens),
        "links_to_unregistered_paths": sorted(f"{p}-{n}" for (p, n), t in gens.items() if t not in rows)
        + sorted(f"pin {p}" for p, t in pins.items() if t not in rows),
        "pins_not_in_index": sorted(pins.keys() - index.pins().keys()),
    }


@dataclass(frozen=True)
class DoctorReport(Result):
    """What `doctor` found (`problems`: kind -> items; ok when there are none), or with
    `--rebuild-index` what it did (the rest, None/empty otherwise)."""

    problems: dict[str, list[str]] = field(default_factory=dict)
    ok: bool = True
    containment: dict[str, str] = field(default_factory=dict)  # how children are contained (supervise/cgroups.py)
    registered: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    generations: int = 0
    pins: int = 0
    history_copied: dict[str, int] = field(default_factory=dict)
    backup: str | None = None
    moved_aside: tuple[str, ...] = ()


def doctor(*, root: str | Path | None = None, rebuild_index: bool = False,
           lock_timeout: float = LOCK_TIMEOUT_S) -> DoctorReport:
    if not rebuild_index:
        from llmgw_store.supervise.cgroups import containment

        with Store.open(root, lock_timeout) as store:
            found = check(store)
            kind, detail = containment()
            return DoctorReport(problems=found, ok=not any(found.values()),
                                containment={"kind": kind, "detail": detail})
    # The old index is not opened where it lies: it may be damaged in any way (opening fails), and
    # SQLite writes to a file it opens (it replays or drops a WAL), where the operator may want the
    # damaged bytes as they were.
    layout = Layout.at(root)
    layout.ensure()
    # No build or activation may be in flight: their open connections would write into the old
    # file. The exclusive gc lock stops new ones from starting; live temp roots show old ones.
    with gc_lock(layout, shared=False, timeout=lock_timeout, what="rebuilding the index"):
        live, _ = read_all(layout)
        if live:
            raise LockTimeout(f"{len(live)} build(s) or activation(s) are in flight; rebuild the index when they are done")
        backup, moved = _move_aside(layout.db)
        for f in moved:
            say(f"moved the old index file aside to {f}")
        report = _rebuild(layout, backup)
    return DoctorReport(registered=tuple(report["registered"]), skipped=tuple(report["skipped"]),
                        generations=report["generations"], pins=report["pins"],
                        history_copied=report["history_copied"], backup=str(backup) if backup is not None else None,
                        moved_aside=tuple(str(f) for f in moved))


def _move_aside(db: Path) -> tuple[Path | None, list[Path]]:
    """Move the index file and its -wal and -shm, as they are, into a new directory beside them;
    never delete them. mkdir is exclusive, so a second rebuild in the same second gets its own
    directory instead of renaming over the first one's backup."""
    files = [Path(f"{db}{suffix}") for suffix in ("", "-wal", "-shm") if os.path.lexists(f"{db}{suffix}")]
    if not files:
        return None, []
    base = f"{db.name}.bak-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    for attempt in range(MAX_BACKUPS_PER_SECOND):
        backup = db.with_name(base if attempt == 0 else f"{base}.{attempt}")
        try:
            backup.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    else:
        raise StoreError(f"{db.parent} already holds {MAX_BACKUPS_PER_SECOND} backups named {base}*; move some away")
    for f in files:
        # One directory to a subdirectory of it: rename(2) is atomic, and moves a link as a link.
        os.rename(f, backup / f.name)
    return backup, [backup / f.name for f in files]


def _rebuild(layout: Layout, backup: Path | None) -> dict[str, Any]:
    store = Store(layout, Index(layout.db, layout.store))
    try:
        registered, skipped = [], []
        for name in _store_dirs(layout):
            # Every tree is hashed again: a path registered here becomes a later build's cache hit,
            # so one whose bytes no longer match its manifest (changed while the index was lost)
            # must stay out. Slower than checking the listing alone, but this is a recovery command.
            why = store.adopt(name, rehash=True)
            if why is None:
                registered.append(name)
            else:
                skipped.append(name)
                say(f"{name}: not a complete store path ({why}); left unregistered (gc will remove it)")
        # History first (its generation rows carry who made them), bounded and never fatal; then
        # the disk, which is the truth: a link's generation replaces whatever the old file said.
        try:
            copied = _copy_history(layout, store.index, backup) if backup is not None else {}
        except (sqlite3.Error, OSError, StoreError) as exc:
            say(f"the old index's history was not copied ({exc}); the index is rebuilt from the disk")
            copied = {}
        index = store.index
        gens, pins = _links(layout)
        for (profile, number), target in gens.items():
            link = layout.generation_link(profile, number)
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.lstat(link).st_mtime))
            if not index.has_generation(profile, number, target):
                index.record_generation(profile, number, target, created)
        for pin, target in pins.items():
            index.record_pin(pin, target)
    finally:
        store.close()
    say(f"index rebuilt: {len(registered)} path(s), {len(gens)} generation(s), {len(pins)} pin(s)")
    return {"registered": registered, "skipped": skipped, "generations": len(gens), "pins": len(pins),
            "history_copied": copied}


def _copy_history(layout: Layout, index: Index, backup: Path) -> dict[str, int]:
    """History from the files moved aside, read through a scratch copy so they stay as they were.
    The old file is hostile: a file larger than MAX_OLD_DB_BYTES is not copied (a sparse one could
    fill the disk), and Index.copy_history_from bounds what it reads in rows, bytes and time."""
    for name in (layout.db.name, f"{layout.db.name}-wal"):
        try:
            st = os.lstat(backup / name)
        except FileNotFoundError:
            continue
        if st.st_size > MAX_OLD_DB_BYTES:
            say(f"{backup / name} is larger than {MAX_OLD_DB_BYTES >> 30} GiB; its history is not copied (it is kept)")
            return {}
    scratch = layout.tmp / f"doctor-{os.getpid()}-{time.monotonic_ns()}"
    scratch.mkdir(mode=0o700)
    try:
        db = layout.db.name
        for name in (db, f"{db}-wal"):
            _copy_regular(backup / name, scratch / name)
        if not (scratch / db).exists():
            return {}
        _size_from_file(scratch / db)
        return index.copy_history_from(scratch / db, HISTORY_TABLES)
    finally:
        force_rmtree(scratch)


def _size_from_file(db: Path) -> None:
    """Zero the database size recorded in an SQLite header (bytes 28-31), so that SQLite takes the
    size from the file instead (as it does for a header of before 3.7.0): a truncated file then reads
    up to its first lost page instead of failing as a whole. Only ever done to a scratch copy."""
    with open(db, "r+b") as f:
        if f.read(16) == b"SQLite format 3\x00":
            f.seek(28)
            f.write(bytes(4))


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy `src` if it is a regular file (not through a link, not a device or FIFO)."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    with open(fd, "rb") as f:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            with open(dest, "xb") as out:
                shutil.copyfileobj(f, out)
