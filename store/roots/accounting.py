"""Bytes a deletion really frees, and the deletion itself.

What a file costs on disk is its blocks (`st_blocks * 512`), not its size: a sparse file costs
less, a small file a whole block. And its blocks come back only when its LAST link goes: a file
hardlinked with another store path (after `optimise`), with optimise's pool or with a cache frees
nothing while that other link lives. So:

- `remove_tree` counts a file's blocks as freed when the lstat taken just before its unlink shows
  one link (the last one; an inode with two links inside the tree is counted at its second unlink);
  a directory's blocks when it is removed. One lstat per entry, the one the walk needs anyway.
- `Tally` predicts the same for a set of trees without touching them (dry runs, byte budgets):
  it counts the links of each inode met inside the set, and an inode is freed once all its links
  are inside (a link in optimise's pool counts as inside: gc prunes a pool entry no path links).

Both walk with directory descriptors opened O_NOFOLLOW, and never follow a symlink: a link
planted in a dead path that points outside is removed (or counted) as the link it is, and nothing
it points to is read, counted or deleted. Every loop is bounded by the entries of the tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from llmgw_store.system import trees

BLOCK = 512
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def on_disk(st: os.stat_result) -> int:
    return st.st_blocks * BLOCK


def _open_dir(parent_fd: int | None, name: str | os.PathLike, st: os.stat_result, writable: bool) -> int:
    """A descriptor of directory `name` (never through a link). With `writable`, one without u+rwx
    (a frozen store directory) gets it first, unless this process is root, whom modes do not stop."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(f"{name}: replaced while gc walked it")
        if writable and os.geteuid() != 0 and stat.S_IMODE(st2.st_mode) & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(st2.st_mode) | 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_tree(path: str | os.PathLike) -> int:
    """Delete `path` (a tree that nothing else writes: one in the trash), returning the bytes its
    deletion freed. A missing path frees nothing; a symlink or file is unlinked itself."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return on_disk(st) if st.st_nlink <= 1 else 0
    top = os.open(path.parent, _DIR_FLAGS)
    freed = 0
    stack: list[tuple[int, os._ScandirIterator[str], int, str, os.stat_result]] = []
    try:
        fd = _open_dir(top, path.name, st, writable=True)
        stack.append((fd, os.scandir(fd), top, path.name, st))
        while stack:
            fd, it, parent, name, dst = stack[-1]
            entry = next(it, None)
            if entry is None:
                it.close()
                os.close(fd)
                stack.pop()
                os.rmdir(name, dir_fd=parent)
                freed += on_disk(dst)
                continue
            try:
                est = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(est.st_mode):
                cfd = _open_dir(fd, entry.name, est, writable=True)
                stack.append((cfd, os.scandir(cfd), fd, entry.name, est))
            else:
                os.unlink(entry.name, dir_fd=fd)
                # this lstat was taken just before the unlink: one link means it was the last
                freed += on_disk(est) if est.st_nlink <= 1 else 0
    finally:
        for fd, it, *_ in stack:
            it.close()
            os.close(fd)
        os.close(top)
    return freed


def walk(path: str | os.PathLike[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of `path` and everything under it, never following a link (the
    one tree walk, system/trees.walk, in the file system's order: gc walks caches of 100k entries)."""
    return trees.walk(path, sort=False)


def inodes_of(directory: str | os.PathLike[str]) -> dict[tuple[int, int], int]:
    """(st_dev, st_ino) -> st_nlink of the plain files directly in `directory` (optimise's pool)."""
    out = {}
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[(st.st_dev, st.st_ino)] = st.st_nlink
    except FileNotFoundError:
        pass
    return out


class Tally:
    """What deleting every tree added so far would free, without deleting anything. `pooled`:
    inodes with one more link in optimise's pool or the wheel home, which gc prunes once no store
    path links them, each with its link count as it is now (the walk of the pool gave it)."""

    def __init__(self, pooled: dict[tuple[int, int], int] | None = None,
                 extra: dict[tuple[int, int], int] | None = None):
        self.pooled = pooled or {}
        # links gc removes itself once no store path links the inode: one (the pool's or the wheel
        # home's) unless `extra` says more (the bytecode cache's too)
        self.extra = extra or {}
        self.links: dict[tuple[int, int], int] = {}
        self.freed = 0
        self.apparent = 0
        self.walked = 0  # trees walked (no usable footprint record)

    def add(self, tree: str | os.PathLike, record: dict | None = None) -> int:
        """Add a tree; returns what it adds to `freed`. With `record` (core/footprint.py: checked
        with footprint.valid against the tree's lstat by the caller), the tree is not walked: its
        own blocks count as they were measured, and each inode it shares with the pool or the
        wheel home against that inode's link count now. One it shares with anything else (another
        store path) needs the links as they are now, so the tree is walked after all."""
        before = self.freed
        if record is not None and self._add_recorded(record):
            return self.freed - before
        self.walked += 1
        for _, st in walk(tree):
            if stat.S_ISDIR(st.st_mode):
                self.freed += on_disk(st)
                continue
            self.apparent += st.st_size if stat.S_ISREG(st.st_mode) else 0
            ident = (st.st_dev, st.st_ino)
            seen = self.links.get(ident, 0) + 1
            self.links[ident] = seen
            outside = st.st_nlink - seen - (self.extra.get(ident, 1) if ident in self.pooled else 0)
            if outside == 0:
                self.freed += on_disk(st)
        return self.freed - before

    def _add_recorded(self, record: dict) -> bool:
        """Add a tree by its footprint; False (nothing added) when an inode it shares is neither
        the pool's nor the wheel home's."""
        dev = record["dev"]
        shared = record["shared"]
        if any((dev, ino) not in self.pooled for ino, _, _ in shared):
            return False
        self.freed += record["own"]
        self.apparent += record["apparent"]
        for ino, blocks, met in shared:
            ident = (dev, ino)
            seen = self.links.get(ident, 0)
            self.links[ident] = seen + met
            # the tree's links and the pool's are all there are: counted once, when the last comes
            left = self.pooled[ident] - self.extra.get(ident, 1) - seen
            if left > 0 >= left - met:
                self.freed += blocks
        return True


LISTING_MAX = 512 << 20  # the same bound manifest.CONTENTS_MAX puts on a listing


def listed_files(tree: str | os.PathLike) -> list[tuple[str, str]] | None:
    """(kind, digest) of every file (`f`, `x`) in `tree`'s `.llmgw/contents`, read without following
    a link or blocking on a FIFO, at most LISTING_MAX bytes; None when there is no such plain file.
    Only the kind and digest columns are used: callers check digests with re.fullmatch."""
    from llmgw_store.core.manifest import CONTENTS
    from llmgw_store.system.files import read_bounded

    try:
        dfd = os.open(tree, _DIR_FLAGS)
    except OSError:
        return None
    try:
        data = read_bounded(CONTENTS, LISTING_MAX, dir_fd=dfd)
    except OSError:  # absent, or refused (FileRefused is an OSError)
        return None
    finally:
        os.close(dfd)
    out = []
    for line in data.decode(errors="replace").split("\n"):
        parts = line.split("\t", 3)
        if len(parts) == 4 and parts[0] in ("f", "x"):
            out.append((parts[0], parts[2]))
    return out
