"""Whole trees: freezing a finished tree, removing trees that may be frozen, walking a tree's
regular files; and the two facts about a file system a tree needs (a file's sha256, the bytes free).
(One file or one link at a time is system/files.py's.)"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


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
        for dirpath, _, _ in os.walk(root):
            os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
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
    for dirpath, _, filenames in os.walk(tree):
        for n in filenames:
            p = os.path.join(dirpath, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            yield p, st
