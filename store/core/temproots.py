"""Temporary gc roots: store paths that a live process is building or about to link.

Protocol (after Nix's gc.cc):
- A process keeps `ROOT/var/temproots/<pid>` open with an exclusive flock for as long as it lives;
  the kernel drops the flock when it dies, so gc tells a stale file (lockable) from a live one.
- To add a root, the process takes the gc lock *shared*, appends the name, then releases it. gc
  holds the gc lock *exclusively* from reading the roots until every dead path is out of store/
  (renamed to the trash), so from the moment gc has read the roots the set of roots cannot grow
  under it: an `add` waits for that short window, never for the slow deletion after it.
- After `add` returns, a name that gc had already taken is gone from the index; callers check
  the path again after adding it (realise does).
- The files are 0600 in the 0700 var/temproots (layout.ensure), and never followed: a process
  makes its file with O_EXCL|O_NOFOLLOW after removing whatever had the name (a planted link to
  the gc lock would otherwise have it lock the gc lock exclusively while holding it shared, and
  wait for itself for ever); gc reads them O_NOFOLLOW and counts links, FIFOs and files with
  another hard link as stale.
- `add` waits for the gc lock at most its `timeout` (the command's --lock-timeout).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from llmgw_store.core.errors import StoreError
from llmgw_store.core.layout import Layout
from llmgw_store.core.locks import LOCK_MODE, LOCK_TIMEOUT_S, flock

# Opening never follows a link and never blocks on a FIFO; what is not a plain file of ours with
# one link (a planted symlink or hard link to a lock, a FIFO, a directory) is not a temp-roots file.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EWOULDBLOCK)


def gc_lock(layout: Layout, shared: bool, timeout: float = LOCK_TIMEOUT_S, what: str | None = None):
    """flock(2) on ROOT/var/locks/gc.lock: shared to add roots, exclusive for gc."""
    what = what or ("adding a temp root" if shared else "collecting garbage")
    return flock(layout.gc_lock, shared=shared, timeout=timeout, what=what, default_holder="processes adding temp roots (builds, activations, pins, optimise)")


class TempRoots:
    """This process's temp-roots file, created on first use."""

    _files: dict[Path, int] = {}

    def __init__(self, layout: Layout):
        self.layout = layout
        self.path = layout.temproots / str(os.getpid())

    def _fd(self) -> int:
        fd = TempRoots._files.get(self.path)
        if fd is None:
            fd = self._create()
            TempRoots._files[self.path] = fd
        return fd

    def _create(self) -> int:
        """A fresh file at temproots/<pid>, flocked for this process's lifetime. Whatever was at that
        name (a dead process's file under a recycled pid, or something planted) is removed first,
        never opened: the name is this process's alone while it lives."""
        for _ in range(3):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                raise StoreError(f"{self.path} is a directory, not a temp-roots file; remove it") from None
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _OPEN_FLAGS, LOCK_MODE)
            except FileExistsError:  # created between the unlink and the open: try again
                continue
            # Never blocks: the file was just made by this process and no one else can open it.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        raise StoreError(f"cannot create the temp-roots file {self.path}: something keeps re-creating it")

    def add(self, name: str, timeout: float = LOCK_TIMEOUT_S) -> None:
        """Make `name` a root until this process exits. Waits at most `timeout` seconds for a gc."""
        with gc_lock(self.layout, shared=True, timeout=timeout, what=f"adding a temp root for {name}"):
            os.write(self._fd(), (name + "\n").encode())


def _read_live(path: Path) -> tuple[bool, set[str]]:
    """(stale, names) of one temp-roots file; a planted entry that is not one counts as stale."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return False, set()
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            return True, set()
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return False, set()  # not ours to remove; not a root either
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return True, set()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True, set()  # lockable: its process is gone
        except BlockingIOError:
            pass
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return False, {ln for ln in b"".join(chunks).decode(errors="replace").splitlines() if ln}
    finally:
        os.close(fd)


def read_all(layout: Layout) -> tuple[set[str], list[Path]]:
    """(names held by live processes, stale files). Call with the gc lock held exclusively."""
    live: set[str] = set()
    stale: list[Path] = []
    for f in sorted(layout.temproots.iterdir()) if layout.temproots.is_dir() else []:
        if not f.name.isdigit():
            continue
        dead, names = _read_live(f)
        if dead:
            stale.append(f)
        live |= names
    return live, stale
