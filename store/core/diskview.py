"""The store as a reader sees it: store paths from their manifests, without the index.

`run`, `env` and the introspection commands (packages, why, export) need to know one store path,
and the index is not always theirs to open:

- a service user (a systemd unit's `User=`) may read the store but not enter the 0700 `var/` that
  holds the index, by design (layout.py: no other user may open a lock or the database);
- on a full disk or a read-only filesystem SQLite cannot make the index's shared memory.

`open_reader` then answers from the disk: every store path carries its manifest
(`.llmgw/manifest.json`, world-readable like the rest of the path), and the links under
`profiles/` and `gcroots/` are the truth the index only follows. Nothing is written, nothing under
`var/` is opened, and no temp root is taken: a running engine is kept from gc by its profile and by
gc's scan of /proc. The directories read are checked as layout.ensure checks them (real
directories, not links, writable by no one but their owner), with one difference: the owner may be
the store's owner (the root directory's uid) rather than the running user.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmgw_store.base.errors import AccessDeniedError, DiskFullError, ReadOnlyError
from llmgw_store.core import manifest
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.keys import KEY_RE, is_store_name
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.pathinfo import StorePathInfo

MAX_SCAN = 100_000  # entries of store/ looked at for a bare key: a store holds far fewer


class ManifestIndex:
    """The read side of core.index.Index that naming a store path needs, from the manifests: a
    directory of store/ is a store path when its manifest names it, its key and every field the
    index records (only a finished build writes that manifest, before the rename into place)."""

    readonly = True

    def __init__(self, store_dir: Path):
        self.store_dir = store_dir

    def path_by_name(self, name: str) -> RegisteredPath | None:
        if not is_store_name(name):
            return None
        try:
            doc = manifest.read(self.store_dir / name)
        except (ValueError, OSError):
            return None
        try:
            return RegisteredPath.of(StorePathInfo.from_manifest(doc, name))
        except ValueError:
            return None

    def path_by_key(self, key: str) -> RegisteredPath | None:
        if not KEY_RE.fullmatch(key):
            return None
        with os.scandir(self.store_dir) as it:
            for n, entry in enumerate(it):
                if n >= MAX_SCAN:
                    break
                if entry.name.startswith(key + "-") and is_store_name(entry.name):
                    row = self.path_by_name(entry.name)
                    if row is not None:
                        return row
        return None

    def references(self, name: str) -> list[str]:
        try:
            refs = manifest.read(self.store_dir / name).get("references")
        except (ValueError, OSError, AttributeError):
            return []
        return [r for r in refs if is_store_name(r)] if isinstance(refs, list) else []

    def close(self) -> None:
        pass


def open_reader(root: str | Path | None = None) -> Store:
    """The store for a command that only reads store paths: with its index when this user may open
    it, else (another user's store, a full or read-only disk) with a ManifestIndex."""
    try:
        return Store.open(root, readonly=True)
    except (AccessDeniedError, DiskFullError, ReadOnlyError):
        layout = Layout.at(root)
        layout.check_readable()
        return Store(layout, ManifestIndex(layout.store))  # type: ignore[arg-type]
