"""`doctor`: the index against the disk, and rebuilding the index from the manifests.

The index is a cache: every path's row can be made again from its manifest, every generation from
the profile links, every pin from gcroots/. History (the build log, switches, publication memos) is
copied over from the old database when it can still be read; the old file is kept beside the new.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from llmgw_store.core import manifest
from llmgw_store.core.errors import LockTimeout
from llmgw_store.core.index import Index, fold_wal, row_from_manifest
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.temproots import gc_lock, read_all

HISTORY_TABLES = ("builds", "switches", "releases", "latest", "tools", "generations")


def _quiet(_: str) -> None:
    pass


def _store_dirs(layout: Layout) -> list[str]:
    return sorted(e.name for e in os.scandir(layout.store)
                  if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") and not e.name.endswith(".partial"))


def _links(layout: Layout) -> tuple[dict[tuple[str, int], str], dict[str, str]]:
    from llmgw_store.roots.pins import list_pins

    gens = {}
    for e in os.scandir(layout.profiles):
        m = re.fullmatch(r"(.+)-(\d+)-link", e.name)
        if m and e.is_symlink():
            gens[(m.group(1), int(m.group(2)))] = Path(os.readlink(e.path)).name
    return gens, list_pins(layout)


def check(store: Store) -> dict[str, list[str]]:
    layout, index = store.layout, store.index
    rows = {r["name"]: r for r in index.paths()}
    dirs = set(_store_dirs(layout))
    gens, pins = _links(layout)
    known_gens = index.live_generations()
    mismatched = []
    for name in sorted(dirs & rows.keys()):
        try:
            if manifest.read(layout.path_of(name)).get("content_hash") != rows[name]["content_hash"]:
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


def doctor(*, root: str | Path | None = None, rebuild_index: bool = False, lock_timeout: float = LOCK_TIMEOUT_S,
           progress: Callable[[str], None] = _quiet) -> dict[str, Any]:
    with Store.open(root, lock_timeout) as store:
        if not rebuild_index:
            found = check(store)
            return {"problems": found, "ok": not any(found.values())}
        layout = store.layout
        # No build or activation may be in flight: their open connections would write into the old
        # file. The exclusive gc lock stops new ones from starting; live temp roots show old ones.
        with gc_lock(layout, shared=False, timeout=lock_timeout, what="rebuilding the index", progress=progress):
            live, _ = read_all(layout)
            if live:
                raise LockTimeout(f"{len(live)} build(s) or activation(s) are in flight; rebuild the index when they are done")
            store.index.close()
            backup = _move_aside(layout.db)
            report = _rebuild(layout, backup, progress)
            store.index = Index(layout.db)
        report["backup"] = str(backup)
        return report


def _move_aside(db: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    backup = db.with_name(f"{db.name}.bak-{stamp}")
    if db.exists():
        fold_wal(db)  # the backup is then one self-contained file
        os.rename(db, backup)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return backup


def _rebuild(layout: Layout, backup: Path, progress) -> dict[str, Any]:
    index = Index(layout.db, layout.store)
    registered, skipped = [], []
    for name in _store_dirs(layout):
        env = layout.path_of(name)
        try:
            doc = manifest.read(env)
            ok = manifest.content_hash(manifest.read_contents(env)) == doc["content_hash"] and doc["name"] == name
        except (OSError, ValueError, KeyError):
            ok = False
        if not ok:
            skipped.append(name)
            progress(f"{name}: no consistent manifest; left unregistered (gc will remove it)")
            continue
        refs = doc.get("references")
        index.insert_path(row_from_manifest(doc), refs if refs is not None else manifest.references_of(env, layout.store))
        registered.append(name)
    copied = index.copy_history_from(backup, HISTORY_TABLES) if backup.exists() else {}
    gens, pins = _links(layout)
    for (profile, number), target in gens.items():
        link = layout.profiles / f"{profile}-{number}-link"
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.lstat(link).st_mtime))
        if not index.has_generation(profile, number, target):
            index.record_generation(profile, number, target, created)
    for pin, target in pins.items():
        index.record_pin(pin, target)
    index.close()
    progress(f"index rebuilt: {len(registered)} path(s), {len(gens)} generation(s), {len(pins)} pin(s)")
    return {"registered": registered, "skipped": skipped, "generations": len(gens), "pins": len(pins),
            "history_copied": copied}
