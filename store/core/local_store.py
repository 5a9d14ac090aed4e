"""A store on the local disk: its layout and its index, opened together, and `Store.install`, the one
way a tree becomes a store path (renamed into store/ and registered)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw_store.app import debug
from llmgw_store.base.errors import IntegrityError, NoStoreError, NotFoundError, StoreError
from llmgw_store.base.report import say
from llmgw_store.core import footprint, manifest, reserve, uses
from llmgw_store.core.index import BUSY_TIMEOUT_S, Index, RegisteredPath
from llmgw_store.core.keys import is_store_name
from llmgw_store.core.layout import Layout
from llmgw_store.core.pathinfo import StorePathInfo
from llmgw_store.system.trees import force_rmtree


@dataclass
class Store:
    """A store on the local disk: its layout and its index, opened together."""

    layout: Layout
    index: Index

    @classmethod
    def open(cls, root: str | Path | None = None, lock_timeout: float = BUSY_TIMEOUT_S, *,
             readonly: bool = False, create: bool = False) -> Store:
        """Check the store's directories (make the missing ones), then open its index. Waits on the
        index's SQLite locks never outlast `lock_timeout` (the command's --lock-timeout).
        `readonly=True` is for commands that only look (list, info, stats, verify, generations):
        they create nothing, write nothing, and on a root that holds no store say so. Only what
        brings a store path in (build, pull) passes `create=True`: every other command, given a
        root where no store is (a typo in --root), says so and leaves the disk as it was."""
        layout = Layout.at(root)
        if not readonly and not create and not os.path.isdir(layout.store):
            if os.path.lexists(layout.root):
                layout.check()
            raise NoStoreError(f"no store at {layout.root} (no {layout.store}); "
                               "build something first, or pass the right --root", layout.root)
        if readonly:
            if os.path.lexists(layout.root):
                layout.check()
            if not layout.db.is_file():
                if os.path.isdir(layout.store):
                    raise NotFoundError(f"the index {layout.db} of the store at {layout.root} is missing; run "
                                        "`llmgw-store doctor --rebuild-index` to rebuild it from the store's manifests")
                raise NoStoreError(f"no store at {layout.root} (no index {layout.db}); "
                                   "build something first, or pass the right --root", layout.root)
            return cls(layout, Index(layout.db, layout.store, readonly=True))
        layout.ensure()
        if create:
            reserve.keep(layout)  # what fills a disk leaves gc room to empty it (core/reserve.py)
        index = Index(layout.db, layout.store, busy_timeout=lock_timeout)
        # Uses recorded by cache hits as stamps (uses.py) enter last_used before anyone reads it.
        uses.fold(str(layout.root), index)
        return cls(layout, index)

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the one way in ---------------------------------------------------------------------------

    def install(self, tree: Path, info: StorePathInfo, *, build_id: int | None = None,
                seconds: float = 0.0, outcome: str = "built", replacing: bool = False) -> str:
        """The one way a tree becomes a store path: renamed into store/, then registered (path row,
        references and build-log entry in one transaction). Returns "installed"; or "adopted" when
        store/<name> was there already and complete — left by a process killed between its rename
        and its registration, or lost by the index — and is registered from its own manifest
        (`tree` is then removed); or "replaced" (`replacing`, below).

        The caller holds the key's lock (only it creates, clears or registers the key's paths) and
        has checked `tree` whole: built, frozen and hashed into `info` (what its manifest says,
        references included), or fetched and verified against signed metadata. `tree` lies on the store's filesystem (a `.partial`
        in store/, or a scratch tree in var/tmp), so the rename is atomic: store/<name> appears
        complete or not at all. `tree` may be store/<name> itself: a directory found in place,
        registered as it is (adoption, `adopt`).

        Killed before the rename, only scratch is left (the next build or pull of the key, or gc,
        removes it); killed between rename and registration, a complete unregistered directory,
        which the next install of the key, `gc` or `doctor` adopts. A directory in place that is
        not complete was damaged after its rename and may be in use (a profile of a lost index):
        it is never removed here (IntegrityError naming it).

        `replacing` (repair): store/<name> is registered and damaged; `tree` (checked to hash to
        the recorded content hash by the caller) takes its place in one renameat2(RENAME_EXCHANGE),
        so readers see the old tree or the new one and never a missing path; the old one goes to
        var/trash and is deleted, and the index records the new content."""
        name = info.name
        final = self.layout.path_of(name)
        try:
            if replacing:
                assert build_id is not None, "a repair is logged as a build (realise starts it)"
                exchange(Path(tree), final)
                # `tree` now holds the damaged tree: out of store/ first, then deleted.
                trash = self.layout.trash / f"{name}.{os.getpid()}.{time.monotonic_ns()}"
                os.rename(tree, trash)
                w = info.whole()
                self.index.replace_content(name, info.content_hash, w.size, w.files, build_id, seconds)
                footprint.remember(self.index, name, final)
                force_rmtree(trash)
                return "replaced"
            how = "installed"
            if Path(tree) != final:
                if os.path.lexists(final):
                    info = self._complete(name)
                    force_rmtree(tree)
                    how, outcome = "adopted", "recovered"
                else:
                    if self.index.path_by_name(name) is not None:
                        self.index.forget(name)  # registered, its directory gone: the stale row goes
                    debug.pause("INSTALL_BEFORE_RENAME")
                    # Same filesystem: rename(2) is atomic, and the key's lock keeps anyone else
                    # from creating `final` meanwhile.
                    os.rename(tree, final)
                    debug.pause("INSTALL_BEFORE_REGISTER")
            row = RegisteredPath.of(info)
            references = list(info.references or ())
            if build_id is None:
                self.index.insert_path(row, references)
            else:
                self.index.register(row, build_id, seconds, references, outcome=outcome)
        except BaseException as exc:
            if build_id is not None:
                try:
                    self.index.fail_build(build_id, seconds, f"{type(exc).__name__}: {exc}")
                except StoreError:
                    pass  # the index itself failing: the first error is the one to report
            raise
        debug.pause("INSTALL_AFTER_REGISTER")
        footprint.remember(self.index, name, final)  # what gc predicts its deletion frees
        return how

    def _complete(self, name: str, *, rehash: bool = True) -> StorePathInfo:
        """What the manifest of store/<name> says (its references found) when it is a complete
        store path (manifest.check_complete); else IntegrityError saying why, and that it is kept."""
        try:
            info = self._found(name, rehash)
            self._register_references(name, info.references or (), rehash=rehash)
            return info
        except ValueError as exc:
            raise IntegrityError(
                f"{name} exists but does not match its manifest (damaged: {exc}); it is kept, since it may "
                "be in use: remove the profiles and pins that hold it and let `llmgw-store gc` take it, then "
                "build again") from None

    def _found(self, name: str, rehash: bool) -> StorePathInfo:
        """store/<name>'s checked manifest (ValueError otherwise), with its references: the
        manifest's when they are a valid list (pathinfo.MAX_REFERENCES at most), else its pyvenv.cfg's."""
        if not is_store_name(name):
            raise ValueError("its name is not a store path name")
        env = self.layout.path_of(name)
        info = manifest.check_complete(env, name, rehash=rehash)
        if info.references is None:
            info = replace(info, references=tuple(manifest.references_of(env, self.layout.store)))
        return info

    def _register_references(self, name: str, refs: Sequence[str], *, rehash: bool,
                             busy: frozenset[str] | set[str] = frozenset(), seen: frozenset[str] = frozenset()) -> None:
        """A path is registered after its references (the index's foreign keys): adopt those the
        index lost first. `seen` ends a cycle of references, which no registration can make; a
        reference in `busy` (a live temp root names it) is left to the process bringing it in.
        ValueError when one is not a complete store path."""
        for ref in refs:
            if ref != name and self.index.path_by_name(ref) is None:
                why: str | None
                if ref in busy:
                    why = "another process is bringing it in"
                elif ref in seen | {name}:
                    why = "its references make a cycle"
                else:
                    why = self.adopt(ref, rehash=rehash, busy=busy, _seen=seen | {name})
                if why is not None:
                    raise ValueError(f"it references {ref}, which is not a complete store path ({why})")

    def recover(self, name: str) -> bool:
        """Before making `name`, under its key's lock: True when store/<name> is there,
        unregistered, complete (tree rehashed), and now registered from its own manifest; False
        when there is nothing there; IntegrityError when what is there is damaged (kept)."""
        if not os.path.lexists(self.layout.path_of(name)):
            return False
        self.install(self.layout.path_of(name), self._complete(name))
        say(f"{name} is complete on disk but was not in the index; registered it again from its manifest")
        return True

    def adopt(self, name: str, *, rehash: bool = True, busy: frozenset[str] | set[str] = frozenset(),
              _seen: frozenset[str] = frozenset()) -> str | None:
        """Register `store/<name>`, a directory the index does not know, from its own manifest
        (references included, adopted first when the index lost them too) when it is a complete
        store path (manifest.check_complete); return None once it is registered, else why it is
        not complete. The index is a cache of the manifests: a path it lost (a deleted or rebuilt
        index, a crash between rename and registration) is found again, never deleted on the
        index's word alone.
        The caller keeps every other writer of `name` away: it holds the key's lock, or the gc lock
        exclusively with no live temp root naming `name` (nor one of `busy`, the names live temp roots
        hold: a reference among them is left to the process that is bringing it in)."""
        try:
            info = self._found(name, rehash)
            self._register_references(name, info.references or (), rehash=rehash, busy=busy, seen=_seen)
        except ValueError as exc:
            return str(exc)
        self.install(self.layout.path_of(name), info)
        return None


def exchange(a: Path, b: Path) -> None:
    """Swap two directories atomically (Linux renameat2 with RENAME_EXCHANGE). Where the kernel or
    filesystem cannot, fall back to two renames: `b` is then missing for an instant."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        at_fdcwd, rename_exchange = -100, 2
        if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(a))
    aside = b.with_name(b.name + ".old")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)
