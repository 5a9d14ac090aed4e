"""Where a store keeps things on disk: `Layout`, the Path view of the one table of locations
(core/locations.py, which says what each one holds), and the checks of its directories.

Every directory under ROOT is on one filesystem, so `os.rename` between them is atomic.

Other local users can neither block nor redirect the store. `ensure` makes or checks every
directory the store writes, walking from ROOT down with descriptors opened O_NOFOLLOW: each must
be a real directory (never a symlink), owned by the running user or root, and writable by no group
or other user; anything else is refused before a byte is written. Directories get their mode from
locations.DIRS: what holds locks, the index, temp roots, logs and caches is 0700 (no other user
can open a lock file or the database, so none can hold one); store/, python/, profiles/ and
gcroots/ stay 0755 so that every user can run the environments.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.base.errors import IndexError_
from llmgw_store.core import locations as loc
from llmgw_store.core.dirs import PUBLIC_DIR
from llmgw_store.core.dirs import own_dir as _own_dir
from llmgw_store.core.dirs import refuse as _refuse
from llmgw_store.core.keys import is_store_name


def default_root() -> Path:
    """`LLMGW_STORE_ROOT`, else /var/lib/llmgw-store for root, else $XDG_DATA_HOME/llmgw-store."""
    env = os.environ.get("LLMGW_STORE_ROOT")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw-store")
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "llmgw-store"


class _At:
    """A Layout attribute that is ROOT/<a location of core/locations.py>."""

    def __init__(self, rel: str) -> None:
        self.rel = rel

    def __get__(self, layout: Layout, owner: object = None) -> Path:
        return layout.of(self.rel)


@dataclass(frozen=True)
class Layout:
    """Where the store rooted at `root` keeps each thing: the Path view of core/locations.py's table."""

    root: Path

    @classmethod
    def at(cls, root: str | Path | None) -> Layout:
        return cls(Path(root).absolute() if root is not None else default_root().absolute())

    def of(self, rel: str) -> Path:
        """ROOT/rel for a location of core/locations.py."""
        return self.root / rel if rel else self.root

    store = _At(loc.STORE)
    var = _At(loc.VAR)
    db = _At(loc.DB)
    locks = _At(loc.LOCKS)
    logs = _At(loc.LOG)
    tmp = _At(loc.TMP)
    trash = _At(loc.TRASH)
    temproots = _At(loc.TEMPROOTS)
    profiles = _At(loc.PROFILES)
    gcroots = _At(loc.GCROOTS)
    holds = _At(loc.HOLDS)
    gc_reserve = _At(loc.GC_RESERVE)
    seen_marks = _At(loc.SEEN)
    links_pool = _At(loc.LINKS_POOL)
    wheel_home = _At(loc.WHEEL_HOME)
    wheel_seals = _At(loc.WHEEL_SEALS)
    memo = _At(loc.MEMO)
    used = _At(loc.USED)
    ops = _At(loc.OPS)
    lockproofs = _At(loc.LOCKPROOFS)
    roots_seq = _At(loc.ROOTS_SEQ)
    records_key = _At(loc.RECORDS_KEY)
    pyc_secret = _At(loc.PYC_KEY)
    python_installs = _At(loc.PYTHON)
    uv_cache = _At(loc.UV_CACHE)
    pyc_cache = _At(loc.PYC_CACHE)
    downloads = _At(loc.DOWNLOADS)

    @property
    def gc_lock(self) -> Path:
        return self.locks / "gc.lock"

    @property
    def seen_lock(self) -> Path:
        return self.locks / "seen.lock"

    def generation_link(self, profile: str, number: int) -> Path:
        """ROOT/profiles/<p>-<N>-link."""
        return self.profiles / loc.generation_link(profile, number)

    def dir_modes(self) -> list[tuple[Path, int]]:
        """Every directory the store writes and its mode, parents before children (locations.DIRS)."""
        return [(self.of(rel), mode) for rel, mode in loc.DIRS]

    def check_readable(self) -> None:
        """Check the directories a reader uses (the root, store/, profiles/, gcroots/, python/),
        changing nothing, for a user who is not the store's owner (a service running an engine):
        each must be a real directory owned by the store's owner (the root's) or root, and
        writable by no one else. The private ones (var/, cache/) are not this user's to open."""
        try:
            owner = os.stat(self.root, follow_symlinks=False).st_uid
        except OSError:
            owner = os.geteuid()
        self._walk(create=False, fix=False, public_only=True, owner=owner)

    def check(self) -> None:
        """Check every directory of the store that exists, changing nothing (for commands that only
        look): a link, another user's directory or one others may write in is refused all the same."""
        self._walk(create=False, fix=False)

    def ensure(self) -> None:
        """Check every directory the store writes, then make the missing ones (see the module's
        docstring): a refusal comes before anything is created. The pool is checked when it
        exists, made only by `ensure_pool` (store/ holds nothing else until something is built); so is
        the wheel home, made by `ensure_pool(wheels=True)`."""
        self._walk(create=False, fix=True)
        self._walk(create=True, fix=True)

    def ensure_pool(self, wheels: bool = False) -> None:
        """`ensure`, and make optimise's pool store/.links too (with `wheels`, the wheel home
        store/.wheels instead)."""
        self._walk(create=False, fix=True)
        self._walk(create=True, fix=True, pool=not wheels, wheels=wheels)

    def ensure_holds(self) -> None:
        """`ensure`, and make holds/ (the first hold): a hold another user could have planted or
        could remove freezes a profile, or lets it move, behind the node's back."""
        self._walk(create=False, fix=True)
        self._walk(create=True, fix=True, holds=True)

    def _walk(self, *, create: bool, fix: bool, pool: bool = False, wheels: bool = False, holds: bool = False,
              public_only: bool = False, owner: int | None = None) -> None:
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)
        fds: dict[Path, int] = {}
        try:
            for path, mode in self.dir_modes():
                parent = fds.get(path.parent)
                if parent is None and path != self.root:
                    continue  # its parent is missing: checked once made
                if public_only and mode != PUBLIC_DIR:
                    continue
                on_demand = {self.links_pool: pool, self.wheel_home: wheels, self.holds: holds}.get(path, True)
                fd = _own_dir(path, mode, parent, create and on_demand, fix, owner)
                if fd is not None:
                    fds[path] = fd
            if create:
                # uv makes its lock in python/ (which must stay 0755) 0666: made here first, 0600,
                # no other user can open it and hold uv's Python installs up.
                _private_lock(fds[self.python_installs], self.python_installs / ".lock")
        finally:
            for fd in fds.values():
                os.close(fd)

    def path_of(self, name: str) -> Path:
        """`store/<name>`. The one way a name (from the index, a cache, a link) becomes a path: only
        a well-formed store path name (one component, no separator, no dot-dot) gets one, so no
        row, however planted, makes a command touch anything outside store/."""
        return self.store / _checked_name(name)

    def partial_of(self, name: str) -> Path:
        return self.store / (_checked_name(name) + ".partial")


def malformed_name(name: object) -> IndexError_:
    return IndexError_(f"the index holds a malformed store path name {str(name)[:80]!r}; "
                       "run `llmgw-store doctor --rebuild-index` to rebuild it from the store's manifests")


def _checked_name(name: object) -> str:
    if not is_store_name(name):
        raise malformed_name(name)
    return name


def _private_lock(dir_fd: int, path: Path) -> None:
    """`path` (in the checked directory `dir_fd`) as a plain 0600 file. A lax one (made by uv before
    the store made it) is replaced, not chmod-ed: whoever opened the old one keeps only that."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(2):
        try:
            fd = os.open(path.name, flags, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise _refuse(path, "it is not a plain file") from exc
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "it is not a plain file")
        if not stat.S_IMODE(st.st_mode) & 0o077:
            return
        if st.st_uid != os.geteuid():
            return  # root's file in a store another user opens: only root may replace it
        os.unlink(path.name, dir_fd=dir_fd)
