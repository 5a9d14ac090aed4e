"""Temporary gc roots: store paths that a live process is building or about to link.

Protocol (after Nix's gc.cc):
- A process keeps `ROOT/var/temproots/<pid>-<token>` open with an exclusive flock for as long as it
  lives; the kernel drops the flock when it dies, so gc tells a stale file (lockable) from a live
  one. The token (64 random bits, made once per process) makes the name unique across pid
  namespaces: containers sharing a root each have a pid 1, and a name by pid alone made the
  second one delete the first one's file — and gc then the first one's live `.partial`.
- To add a root, the process takes the gc lock *shared*, appends the name, then releases it. gc
  holds the gc lock *exclusively* from reading the roots until every dead path is out of store/
  (renamed to the trash), so from the moment gc has read the roots the set of roots cannot grow
  under it: an `add` waits for that short window, never for the slow deletion after it.
- After `add` returns, a name that gc had already taken is gone from the index; callers check
  the path again after adding it (realise does).
- The files are 0600 in the 0700 var/temproots (layout.ensure), and never followed: a process
  makes its file with O_EXCL|O_NOFOLLOW on its fresh name and never removes a file it did not
  make (a name taken — a planted link included — means another token); gc reads them O_NOFOLLOW
  and counts links, FIFOs and files with another hard link as stale.
- Only gc removes a temp-roots file, and only a stale one (`remove_stale`): it takes the file's
  flock first and unlinks the name while holding it, after checking the name still is that file,
  so a file whose process lives (and holds its lock) is never removed. Files are made under the
  gc lock held shared and removed under it held exclusively, so none is made meanwhile.
- `add` waits for the gc lock at most its `timeout` (the command's --lock-timeout).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from pathlib import Path

from llmgw_store.base.errors import StoreError
from llmgw_store.core.layout import Layout
from llmgw_store.core.locks import LOCK_MODE, LOCK_TIMEOUT_S, flock

# Opening never follows a link and never blocks on a FIFO; what is not a plain file of ours with
# one link (a planted symlink or hard link to a lock, a FIFO, a directory) is not a temp-roots file.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EWOULDBLOCK)
# `<pid>-<token>`; a bare `<pid>` is a file of an older llmgw-store (read, and removed once stale).
NAME_RE = re.compile(r"[0-9]{1,10}(-[0-9a-f]{16})?")
_tokens: dict[int, str] = {}  # pid -> this process's token (a forked child makes its own)


def _token() -> str:
    pid = os.getpid()
    token = _tokens.get(pid)
    if token is None:
        token = _tokens[pid] = os.urandom(8).hex()
    return token


def gc_lock(layout: Layout, shared: bool, timeout: float = LOCK_TIMEOUT_S, what: str | None = None):
    """flock(2) on ROOT/var/locks/gc.lock: shared to add roots, exclusive for gc."""
    what = what or ("adding a temp root" if shared else "collecting garbage")
    return flock(layout.gc_lock, shared=shared, timeout=timeout, what=what, default_holder="processes adding temp roots (builds, activations, pins, optimise)")


class TempRoots:
    """This process's temp-roots file, created on first use."""

    _files: dict[Path, int] = {}

    def __init__(self, layout: Layout):
        self.layout = layout
        self.path = layout.temproots / f"{os.getpid()}-{_token()}"

    def _fd(self) -> int:
        fd = TempRoots._files.get(self.path)
        if fd is None:
            fd = self._create()
            TempRoots._files[self.path] = fd
        return fd

    def _create(self) -> int:
        """A fresh file at temproots/<pid>-<token>, flocked for this process's lifetime. Nothing is
        ever removed to make it: a name that is taken (by a planted file, or by a process of the
        same pid and — 2^-64 — the same token) makes this process draw another token."""
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _OPEN_FLAGS, LOCK_MODE)
            except FileExistsError:
                _tokens[os.getpid()] = os.urandom(8).hex()
                self.path = self.layout.temproots / f"{os.getpid()}-{_token()}"
                continue
            # Never blocks: the file was just made by this process and no one else can open it.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        raise StoreError(f"cannot create a temp-roots file in {self.layout.temproots}: every name tried is taken")

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
        if not NAME_RE.fullmatch(f.name):
            continue
        dead, names = _read_live(f)
        if dead:
            stale.append(f)
        live |= names
    return live, stale


def remove_stale(stale: list[Path]) -> int:
    """Remove temp-roots files `read_all` found stale, each only while holding its flock (so never
    one whose process lives) and only if its name still is the file locked; a planted link, FIFO
    or hard link is unlinked as the name it is. Call with the gc lock held exclusively. How many
    were removed."""
    removed = 0
    for f in stale:
        try:
            fd = os.open(f, os.O_RDONLY | _OPEN_FLAGS)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno in _NOT_A_FILE and exc.errno != errno.EISDIR:
                f.unlink(missing_ok=True)  # a link or a FIFO: nobody's lock
                removed += 1
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its process is alive after all: it stays
            st, now = os.fstat(fd), os.lstat(f)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino) and not stat.S_ISDIR(st.st_mode):
                os.unlink(f)  # under its flock: no live process holds it
                removed += 1
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed
