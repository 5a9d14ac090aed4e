"""Whole trees: the one walk of a tree (`walk`), freezing a finished tree, removing trees that may
be frozen, walking a tree's regular files; and the two facts about a file system a tree needs (a
file's sha256, the bytes free). (One file or one link at a time is system/files.py's.)

`walk` never follows a link: each directory is opened by its name relative to its parent's
descriptor with O_NOFOLLOW|O_DIRECTORY and must be the inode its lstat showed (a directory swapped
for a link or another directory between the two is not entered); nothing but directories is
opened, so a FIFO or a device is listed, never waited on. One descriptor per level is open.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Literal

from llmgw_store.base.errors import StoreError

WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeTooLarge(StoreError):
    """A walk met more entries, or deeper directories, than its caller allows."""

    def __init__(self, root: str, bound: Literal["entries", "depth"], limit: int) -> None:
        self.root = root
        self.bound: Literal["entries", "depth"] = bound
        self.limit = limit
        what = f"holds more than {limit} entries" if bound == "entries" else f"is nested deeper than {limit} directories"
        super().__init__(f"{root} {what}; refusing to walk it further")


class Replaced(OSError):
    """A directory the walk was to open is no longer the inode its lstat showed."""


def _open_dir(parent_fd: int | None, name: str, st: os.stat_result) -> int:
    """A descriptor of directory `name`, never through a link, and only if it is still the inode `st`."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        now = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise Replaced(f"{name}: replaced by another directory during the walk")
    return fd


def walk(root: str | os.PathLike[str], *, sort: bool = True, max_depth: int | None = None,
         max_entries: int | None = None, strict: bool = False) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of `root` (as "") and of everything under it, depth first: a
    directory comes right before what it holds, its entries in sorted name order with `sort` (the
    order of a listing; without, the file system's). Nothing is followed (see the module's note);
    a missing `root` yields nothing, a `root` that is not a directory yields itself only.
    `max_depth` is the deepest directory listed (root is 0: a directory "a/b" is 2) and
    `max_entries` the entries yielded (root counted); past either, TreeTooLarge.
    An entry gone between its directory's listing and its lstat, and a directory below `root` that
    cannot be opened (unreadable, replaced: Replaced), are skipped; with `strict`, they raise
    OSError instead. A `root` that cannot be opened always raises.
    The caller may stop early: the descriptors are closed when the generator is."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        if strict:
            raise
        return
    count = 1
    if max_entries is not None and count > max_entries:
        raise TreeTooLarge(os.fspath(root), "entries", max_entries)
    yield "", st
    if not stat.S_ISDIR(st.st_mode):
        return
    stack: list[tuple[int, Generator[os.DirEntry[str], None, None], str, int]] = []

    def listing(fd: int) -> Generator[os.DirEntry[str], None, None]:
        with os.scandir(fd) as it:
            if sort:
                entries = sorted(it, key=lambda e: e.name)
            else:
                yield from it
                return
        yield from entries

    try:
        fd = _open_dir(None, os.fspath(root), st)
        stack.append((fd, listing(fd), "", 0))
        while stack:
            fd, it, rel, depth = stack[-1]
            entry = next(it, None)
            if entry is None:
                stack.pop()
                os.close(fd)
                continue
            try:
                est = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                if strict:
                    raise
                continue
            count += 1
            if max_entries is not None and count > max_entries:
                raise TreeTooLarge(os.fspath(root), "entries", max_entries)
            sub = f"{rel}/{entry.name}" if rel else entry.name
            yield sub, est
            if stat.S_ISDIR(est.st_mode):
                if max_depth is not None and depth + 1 > max_depth:
                    raise TreeTooLarge(os.fspath(root), "depth", max_depth)
                try:
                    cfd = _open_dir(fd, entry.name, est)
                except OSError:
                    if strict:
                        raise
                    continue
                stack.append((cfd, listing(cfd), sub, depth + 1))
    finally:
        for fd, it, _, _ in stack:
            it.close()
            os.close(fd)


def freeze(root: Path, keep_writable: Path | None = None) -> None:
    """Drop every write bit under `root` (files first, then directories, deepest first), so nothing
    can add, remove or change a file of a finished store path without first undoing this on purpose.
    Symlinks are skipped: their own mode means nothing on Linux and chmod would follow them.
    `keep_writable` (a directory under root) and what it holds are left alone."""
    skip = os.fspath(keep_writable) if keep_writable is not None else None
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        if skip is not None and (dirpath == skip or dirpath.startswith(skip + os.sep)):
            continue
        for name in filenames + dirnames:
            if skip is not None and os.path.join(dirpath, name) == skip:
                continue
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & WRITE_BITS:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~WRITE_BITS)
    st = os.lstat(root)
    os.chmod(root, stat.S_IMODE(st.st_mode) & ~WRITE_BITS)


def force_rmtree(root: Path) -> None:
    """Remove a tree even where `freeze` took the write bits; a missing tree is not an error."""
    if not os.path.lexists(root):
        return
    if os.path.islink(root) or not os.path.isdir(root):
        os.unlink(root)
        return
    import shutil

    from llmgw_store.base.report import heartbeat

    with heartbeat(f"deleting {Path(root).name}"):  # a vLLM tree is 100k entries: seconds
        # each directory gets u+rwx as the walk meets it, before the walk opens it
        for rel, st in walk(root, sort=False):
            if stat.S_ISDIR(st.st_mode):
                os.chmod(os.path.join(root, rel) if rel else root,
                         stat.S_IMODE(st.st_mode) | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
        shutil.rmtree(root)


def sha256_of(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def walk_files(tree: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of every non-directory under `tree`; entries that vanish meanwhile are skipped."""
    top = os.fspath(tree)
    for rel, st in walk(tree, sort=False):
        if rel and not stat.S_ISDIR(st.st_mode):
            yield os.path.join(top, rel), st
