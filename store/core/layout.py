"""Where a store keeps things on disk.

    ROOT/store/<key>-<name>/            immutable environments (read-only once renamed into place)
    ROOT/store/<key>-<name>.partial/    a build in progress; only the holder of the key's lock touches it
    ROOT/var/db.sqlite                  the index (WAL)
    ROOT/var/locks/                     one lock file per key (+ an .owner note saying who holds it,
                                        and a .pgids record of the holder's children, see procs.py)
    ROOT/var/log/                       full output of failed subprocesses
    ROOT/var/trash/                     dead paths gc has renamed out of store/ and is deleting
    ROOT/var/tmp/                       scratch space on the store's filesystem (renames stay atomic)
    ROOT/var/temproots/<pid>            store paths a live process is building or using (gc keeps them)
    ROOT/profiles/<p> -> <p>-<N>-link -> ../store/<key>-<name>     generations of a profile
    ROOT/gcroots/<pin> -> ../store/<key>-<name>                    pins
    ROOT/python/                        interpreters uv manages for the store
    ROOT/cache/{uv,pyc,downloads}       caches that gc may prune

Every directory under ROOT is on one filesystem, so `os.rename` between them is atomic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def default_root() -> Path:
    """`LLMGW_STORE_ROOT`, else /var/lib/llmgw-store for root, else $XDG_DATA_HOME/llmgw-store."""
    env = os.environ.get("LLMGW_STORE_ROOT")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw-store")
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "llmgw-store"


@dataclass(frozen=True)
class Layout:
    root: Path

    @classmethod
    def at(cls, root: str | Path | None) -> "Layout":
        return cls(Path(root).absolute() if root is not None else default_root().absolute())

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def var(self) -> Path:
        return self.root / "var"

    @property
    def db(self) -> Path:
        return self.var / "db.sqlite"

    @property
    def locks(self) -> Path:
        return self.var / "locks"

    @property
    def logs(self) -> Path:
        return self.var / "log"

    @property
    def tmp(self) -> Path:
        return self.var / "tmp"

    @property
    def trash(self) -> Path:
        return self.var / "trash"

    @property
    def temproots(self) -> Path:
        return self.var / "temproots"

    @property
    def profiles(self) -> Path:
        return self.root / "profiles"

    @property
    def gcroots(self) -> Path:
        return self.root / "gcroots"

    @property
    def gc_lock(self) -> Path:
        return self.locks / "gc.lock"

    @property
    def links_pool(self) -> Path:
        """optimise's pool of shared files: one link per distinct content, named by its hash."""
        return self.store / ".links"

    @property
    def python_installs(self) -> Path:
        return self.root / "python"

    @property
    def uv_cache(self) -> Path:
        return self.root / "cache" / "uv"

    @property
    def pyc_cache(self) -> Path:
        return self.root / "cache" / "pyc"

    @property
    def downloads(self) -> Path:
        return self.root / "cache" / "downloads"

    def ensure(self) -> None:
        for d in (self.store, self.locks, self.logs, self.tmp, self.trash, self.temproots, self.profiles, self.gcroots,
                  self.python_installs, self.uv_cache, self.pyc_cache, self.downloads):
            d.mkdir(parents=True, exist_ok=True)

    def path_of(self, name: str) -> Path:
        return self.store / name

    def partial_of(self, name: str) -> Path:
        return self.store / (name + ".partial")
