"""Canonical metadata for a finished environment, before it is frozen (as Nix's
canonicalisePathMetaData): what a build leaves must depend on the recipe, not on the builder.

- Modes: a regular file with the owner's exec bit becomes 0755, any other file 0644, a directory
  0755 (freeze then drops the write bits: 0555, 0444). The umask of whoever ran the build (077 in
  a root shell that hardened it) would otherwise decide who may read the environment and make two
  builds of one key differ in mode. setuid, setgid and sticky bits never reach the store.
- Times: every entry's mtime (and atime) is the build's resolution date (asOf), so a tree, and an
  archive made of it, says nothing of when it was built. (The content hash leaves times out;
  bytecode is `unchecked-hash`, so no pyc depends on a source's time either.)

Runs on a `.partial` this process alone writes (the key's lock is held and every child of the
build has exited), so an entry seen by lstat is the entry changed; symlinks are never followed
(their mode means nothing on Linux; their time is set with follow_symlinks=False).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from llmgw_store.base.errors import StoreError

FILE_MODE, EXEC_MODE, DIR_MODE = 0o644, 0o755, 0o755


def canonical_mode(st_mode: int) -> int | None:
    """The mode an entry of this kind gets in the store, or None for a symlink (left alone)."""
    if stat.S_ISDIR(st_mode):
        return DIR_MODE
    if stat.S_ISREG(st_mode):
        return EXEC_MODE if st_mode & stat.S_IXUSR else FILE_MODE
    return None


def normalise(tree: Path, mtime: float, keep: set[tuple[int, int]] | frozenset = frozenset()) -> int:
    """Give every entry under `tree` (and `tree`) its canonical mode and the time `mtime`; return
    how many entries were visited. Directories are done after what they hold (their time would
    otherwise move again as their entries change). The inodes in `keep` (st_dev, st_ino) are left
    as they are: files linked from the wheel home, canonical already (frozen, time 1) and shared
    with other store paths, whose metadata no build may change (build/wheelhome.py)."""
    times = (mtime, mtime)
    count = 0
    for dirpath, dirnames, filenames in os.walk(tree, topdown=False):
        for name in filenames + dirnames:
            _one(os.path.join(dirpath, name), times, keep)
            count += 1
    _one(os.fspath(tree), times, keep)
    return count + 1


def _one(path: str, times: tuple[float, float], keep: set[tuple[int, int]] | frozenset = frozenset()) -> None:
    st = os.lstat(path)
    if keep and (st.st_dev, st.st_ino) in keep:
        return
    mode = canonical_mode(st.st_mode)
    if mode is not None and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    if mode is None and not stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path} is neither a file, a directory nor a symlink; an environment holds no other kind")
    os.utime(path, times=times, follow_symlinks=False)
