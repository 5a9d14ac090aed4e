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
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from llmgw_store.core.layout import Layout
from llmgw_store.core.locks import flock

GC_LOCK_WAIT_S = 120.0


def gc_lock(layout: Layout, shared: bool, timeout: float):
    """flock(2) on ROOT/var/locks/gc.lock: shared to add roots, exclusive for gc."""
    who = "a garbage collection" if shared else "processes adding roots"
    return flock(layout.gc_lock, shared=shared, timeout=timeout,
                 busy=lambda: f"the gc lock {layout.gc_lock} is held by {who}; try again later")


class TempRoots:
    """This process's temp-roots file, created on first use."""

    _files: dict[Path, int] = {}

    def __init__(self, layout: Layout):
        self.layout = layout
        self.path = layout.temproots / str(os.getpid())

    def _fd(self) -> int:
        fd = TempRoots._files.get(self.path)
        if fd is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process exits: marks the file live
            os.ftruncate(fd, 0)  # a recycled pid's leftovers are not ours
            TempRoots._files[self.path] = fd
        return fd

    def add(self, name: str, timeout: float = GC_LOCK_WAIT_S) -> None:
        with gc_lock(self.layout, shared=True, timeout=timeout):
            os.write(self._fd(), (name + "\n").encode())


def read_all(layout: Layout) -> tuple[set[str], list[Path]]:
    """(names held by live processes, stale files). Call with the gc lock held exclusively."""
    live: set[str] = set()
    stale: list[Path] = []
    for f in sorted(layout.temproots.iterdir()) if layout.temproots.is_dir() else []:
        if not f.name.isdigit():
            continue
        try:
            fd = os.open(f, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                stale.append(f)  # lockable: its process is gone
                continue
            except BlockingIOError:
                pass
            live.update(ln for ln in Path(f).read_text().splitlines() if ln)
        finally:
            os.close(fd)
    return live, stale
