"""Making a store path exist: the one place where `.partial` trees become store paths.

    hit?  ── the index has the key and its directory exists ──▶ done, no lock, no network
      │ no
    take the key's lock            (from here on, no other process writes this key's paths)
    kill a dead holder's children  (any its keepers missed, see procs.py); record ours from here on
    hit?  ── another process built it while we waited ──▶ done
      │ no
    on disk, unregistered? ── its manifest shows it complete (tree rehashed) ──▶ register it: "recovered"
                           └─ it does not ──▶ refuse (damaged, maybe rooted and in use: never deleted here)
    clear leftovers                (a .partial only)
    make(.partial)                 (the caller's steps: venv, resolve, install, verify)
    hash the tree, write the manifest, freeze (drop write bits)
    Store.install                  rename .partial → final (atomic on one filesystem: the path appears
                                   complete or not at all), then register (one transaction: path row
                                   + build-log row); the one way in, shared with pulls and adoption

A crash before the rename leaves only a `.partial`, which the next build of the key (holding the
lock) or gc removes; a crash between rename and register leaves an unregistered complete directory,
which the next build or pull of the key (or gc) registers from its manifest. Nothing is deleted on
the index's word alone, and nothing half-built is ever registered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw_store.base.errors import IntegrityError
from llmgw_store.base.report import say
from llmgw_store.core import locks, manifest, uses
from llmgw_store.core.dedupe import share
from llmgw_store.core.index import now_iso
from llmgw_store.core.pathinfo import StorePathInfo
from llmgw_store.system.trees import force_rmtree, freeze

if TYPE_CHECKING:
    from llmgw_store.core.local_store import Store

DEFAULT_LOCK_TIMEOUT_S = locks.BUILD_LOCK_TIMEOUT_S
# A key `make` may return beside the manifest's fields: what the install step knows of the tree it
# made (build/wheelhome.Handoff): `memo`, digests of files it has just hashed (manifest.scan's
# memo: nothing is hashed twice), and `check(listing)`, run on the tree's listing before anything
# is written (it raises if a file linked from the wheel home does not hash to its seal's digest).
HANDOFF = "handoff"


def realise(
    store: Store,
    key: str,
    name: str,
    inputs: dict[str, Any],
    meta: dict[str, Any],
    make: Callable[[Path], dict[str, Any]],
    *,
    verify: Callable[[Path], object] | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
    check: Callable[[], object] | None = None,
    substitute: Callable[[], bool] | None = None,
) -> tuple[Path, str]:
    """Return (path, how): how is "hit", "waited" (another process built it), "recovered" (complete on
    disk but unknown to the index, registered again from its manifest), "substituted" (fetched from
    a binary cache by `substitute`, under the lock) or "built".
    `check` runs on a miss before anything is locked or written: input validation too slow for the
    hit path (a path can only be in the store if its inputs once passed it). `verify` runs on the
    frozen tree, as the environment will be used, while the tree is hashed."""
    layout, index = store.layout, store.index
    final = layout.path_of(name)
    row = index.path_by_key(key)
    if row is not None and final.is_dir():
        # A stamp, not an index write: no transaction and no WAL checkpoint on a hit (core/uses.py).
        uses.touch_root(str(layout.root), name)
        return final, "hit"
    if check is not None:
        check()
    from llmgw_store.core.temproots import TempRoots

    # From here until this process exits, gc keeps `name` (and its .partial) whatever else happens.
    TempRoots(layout).add(name, lock_timeout)

    with locks.hold(layout.locks, key, f"building {name}", lock_timeout), \
            _children_recorded(layout, key):
        # The lock is held: this process alone may create, clear or register this key's paths.
        row = index.path_by_key(key)
        if row is not None and final.is_dir():
            index.touch(name)
            return final, "waited"
        if row is not None:
            say(f"{name} is registered but missing on disk; building it again")
            index.forget(name)
        partial = layout.partial_of(name)
        if os.path.lexists(partial):
            say(f"removing {partial.name}, left by a build that did not finish")
            force_rmtree(partial)
        # Unregistered but present: the index lost it (deleted, rebuilt) or a process died between
        # rename and registration. A final directory is only ever renamed into place complete, so
        # one that does not match its manifest was damaged since, and may be rooted and in use: it
        # is registered when complete, else the build refuses (Store.recover; never deleted here).
        if store.recover(name):
            return final, "recovered"

        if substitute is not None and substitute():
            return final, "substituted"
        build_id = index.start_build(key, name)
        info = _produce(store, key, name, inputs, meta, make, verify, build_id)
        share(layout, partial)  # identical files of other store paths, verified, linked (core/dedupe.py)
        try:
            how = store.install(partial, info, build_id=build_id, seconds=info.build_seconds)
        finally:
            force_rmtree(partial)  # left only when the rename did not happen (or another tree was adopted)
        keep_proof(store, name)
        return final, "built" if how == "installed" else "recovered"


def keep_proof(store: Store, name: str) -> None:
    """Prove once, at registration, that the path was installed from its lock, and keep the proof
    (core/proofs.py): a switch to it then need not read its listing. A path whose lock cannot be
    proved keeps none (its records then hold no lock, as records.describe says)."""
    from llmgw_store.build.lockproof import proved_lock
    from llmgw_store.core import proofs

    row = store.index.path_by_name(name)
    if row is None:
        return
    try:
        lock, lock_format = proved_lock(store.layout.path_of(name), name, row.content_hash)
    except IntegrityError:
        return
    proofs.keep(store.layout.var, name, row.content_hash, lock_format, lock)


def replace(
    store: Store,
    key: str,
    name: str,
    inputs: dict[str, Any],
    meta: dict[str, Any],
    make: Callable[[Path], dict[str, Any]],
    *,
    expect: str,
    verify: Callable[[Path], None] | None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
) -> StorePathInfo:
    """Rebuild a registered path in `.partial` and swap it in for the one in the store (repair),
    only once the new tree has passed every check a build makes AND hashes to `expect`, the content
    hash recorded when the path was built. A repair restores the recorded bytes or changes nothing:
    the index never takes a hash from a rebuild (IntegrityError, the path left as it was). The swap
    is one renameat2(RENAME_EXCHANGE) (Store.install): readers see the old tree or the new one, never a
    missing path."""
    from llmgw_store.core.temproots import TempRoots

    layout, index = store.layout, store.index
    final, partial = layout.path_of(name), layout.partial_of(name)
    TempRoots(layout).add(name, lock_timeout)
    with locks.hold(layout.locks, key, f"repairing {name}", lock_timeout), \
            _children_recorded(layout, key):
        force_rmtree(partial)
        build_id = index.start_build(key, name)
        info = _produce(store, key, name, inputs, meta, make, verify, build_id)
        if info.content_hash != expect:
            differs = _differences(final, partial, expect)
            force_rmtree(partial)
            index.fail_build(build_id, info.build_seconds,
                             f"rebuilt content hash {info.content_hash} is not the recorded {expect}")
            raise IntegrityError(
                f"the rebuild of {name} gives different bytes ({differs}); the recorded hash is kept and the path "
                "left as it was: remove the path (unpin it, `llmgw-store gc`) and build it again"
            )
        share(layout, partial)  # verified pool copies only: never the damaged inode being replaced
        try:
            store.install(partial, info, build_id=build_id, seconds=info.build_seconds, replacing=True)
        finally:
            force_rmtree(partial)
        return info


def _differences(final: Path, partial: Path, expect: str, limit: int = 5) -> str:
    """The paths where the rebuilt tree differs from the recorded listing, when that listing is
    itself the recorded one (it hashes to `expect`); else say that they cannot be named."""
    try:
        recorded = manifest.read_contents(final)
        if manifest.content_hash(recorded) != expect:
            return "the recorded listing is damaged too, so the files cannot be named"
        found = manifest.compare(recorded, manifest.read_contents(partial))
    except (OSError, ValueError):
        return "the listings cannot be read, so the files cannot be named"
    paths = sorted(p for kind in found.values() for p in kind)
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


@contextmanager
def _children_recorded(layout, key: str) -> Iterator[None]:
    """Under the key's lock, before a `.partial` is touched: kill what the children of a holder
    that died (the record `var/locks/<key>.pgids` is left only then) still run — they could be
    writing into the `.partial` about to be removed — then record this build's children there
    until the block ends. See procs.py for why this kills nothing but that build's processes.
    (procs is loaded here, on a miss: a cache hit never starts a child.)"""
    from llmgw_store.supervise import procs

    record = layout.locks / f"{key}.pgids"
    reaped = procs.reap(record)
    if reaped.killed:
        groups = ", ".join(map(str, reaped.groups)) or "unrecorded"
        say(f"killed {len(reaped.killed)} process(es) left running by a build that did not finish "
                 f"(process groups {groups})")
    if reaped.left:
        say(f"{len(reaped.left)} process(es) of a build that did not finish are still dying "
                 f"(pids {', '.join(map(str, reaped.left))})")
    with procs.recording(record):
        yield


def _produce(store: Store, key, name, inputs, meta, make, verify, build_id: int) -> StorePathInfo:
    """Run `make` in a fresh `.partial`, freeze it, verify and hash it, write its manifest. On any
    failure the `.partial` is removed and the build logged as failed. The recipe's `meta` and what
    `make` returns are the manifest's other fields (StorePathInfo.extra); the manifest is read back
    through the same check as any other (StorePathInfo.from_manifest)."""
    partial = store.layout.partial_of(name)
    started = time.monotonic()
    try:
        partial.mkdir()
        extra = make(partial)
        handoff = extra.pop(HANDOFF, None)
        # Frozen before verify: the environment must work read-only, as it will in the store, and
        # nothing verify runs can change the bytes being hashed meanwhile. .llmgw/ stays writable
        # until the manifest is in.
        meta_dir = partial / manifest.MANIFEST_DIR
        meta_dir.mkdir(exist_ok=True)
        freeze(partial, keep_writable=meta_dir)
        entries = _scan_while(verify, partial, handoff)
        manifest.write_contents(partial, entries)
        doc = {
            **meta,
            **extra,
            "name": name,
            "key": key,
            "inputs": inputs,
            "content_hash": manifest.content_hash(entries),
            "references": manifest.references_of(partial, store.layout.store),
            "size": sum(e.size for e in entries if e.kind in "fx"),
            "files": len(entries),
            "build_seconds": round(time.monotonic() - started, 3),
            "installed": now_iso(),
        }
        info = StorePathInfo.from_manifest(doc, name)
        manifest.write(partial, info)
        freeze(meta_dir)
        return info
    except BaseException as exc:
        force_rmtree(partial)
        store.index.fail_build(build_id, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        raise


def _scan_while(verify: Callable[[Path], None] | None, tree: Path, handoff: Any = None) -> list:
    """Hash `tree` in a thread while `verify` runs (a subprocess, mostly waiting): the two overlap.
    With the install step's `handoff` (HANDOFF), its memo spares the scan what it hashed, and its
    check runs on the listing — also when `verify` failed: a file linked from the wheel home that
    changed since it was sealed explains the failure, and is what the build must say (and retry)."""
    from concurrent.futures import ThreadPoolExecutor

    say("hashing the tree" + (" while verifying" if verify else ""))
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashed = pool.submit(manifest.scan, tree, memo=handoff.memo if handoff is not None else None)
        try:
            if verify is not None:
                verify(tree)
        except Exception:
            if handoff is not None:
                handoff.check(hashed.result())
            raise
        entries = hashed.result()
    if handoff is not None:
        handoff.check(entries)
    return entries
