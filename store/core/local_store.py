"""A store on the local disk: its layout and its index, opened together."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core import manifest, reserve, uses
from llmgw_store.core.errors import NoStoreError, NotFoundError
from llmgw_store.core.index import BUSY_TIMEOUT_S, Index, row_from_manifest
from llmgw_store.core.keys import is_store_name, key_of_name
from llmgw_store.core.layout import Layout

MAX_REFERENCES = 64


@dataclass
class Store:
    layout: Layout
    index: Index

    @classmethod
    def open(cls, root: str | Path | None = None, lock_timeout: float = BUSY_TIMEOUT_S, *,
             readonly: bool = False, create: bool = False) -> "Store":
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

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def adopt(self, name: str, *, rehash: bool = True, busy: frozenset[str] | set[str] = frozenset(),
              _seen: frozenset[str] = frozenset()) -> str | None:
        """Register `store/<name>`, a directory the index does not know, from its own manifest
        (references included) when it is a complete store path (manifest.check_complete); return
        None once it is registered, else why it is not complete. The index is a cache of the
        manifests: a path it lost (a deleted or rebuilt index, a crash between rename and
        registration) is found again, never deleted on the index's word alone.
        The caller keeps every other writer of `name` away: it holds the key's lock, or the gc lock
        exclusively with no live temp root naming `name` (nor one of `busy`, the names live temp roots
        hold: a reference among them is left to the process that is bringing it in)."""
        if not is_store_name(name):
            return "its name is not a store path name"
        env = self.layout.path_of(name)
        try:
            doc = manifest.check_complete(env, name, rehash=rehash)
        except ValueError as exc:
            return str(exc)
        try:
            row = row_from_manifest(doc)
        except (TypeError, AttributeError):
            return "its manifest has a field of the wrong type"
        refs = doc.get("references")
        if not (isinstance(refs, list) and len(refs) <= MAX_REFERENCES
                and all(isinstance(r, str) and "/" not in r and key_of_name(r) for r in refs)):
            refs = manifest.references_of(env, self.layout.store)
        # A path is registered after its references (the index's foreign keys): adopt those the
        # index lost first. `_seen` ends a cycle of references, which no registration can make.
        for ref in refs:
            if ref != name and self.index.path_by_name(ref) is None:
                if ref in busy:
                    why = "another process is bringing it in"
                elif ref in _seen | {name}:
                    why = "its references make a cycle"
                else:
                    why = self.adopt(ref, rehash=rehash, busy=busy, _seen=_seen | {name})
                if why is not None:
                    return f"it references {ref}, which is not a complete store path ({why})"
        self.index.insert_path(row, refs)
        return None
