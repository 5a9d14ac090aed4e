"""The store's one lock primitive: flock(2) on a file under ROOT/var/locks.

The kernel drops an flock when its holder dies, even by SIGKILL, so a crashed process never blocks
the next one. Every lock file is created here, 0600, in a directory only the store's owner can
enter (see layout.ensure), so no other user can open one and hold it.

    lock file                      held                 protects
    var/locks/gc.lock              exclusive by gc,     the set of roots: from the moment gc has read
                                   shared to add a      the roots until every dead path is out of
                                   temp root            store/, no process can add a root
    var/locks/<key>.lock           exclusive by the     the key's store path and its .partial: only
                                   builder, puller or   the holder creates, clears or registers them
                                   repairer of a key
    var/locks/profile-<p>.lock     exclusive            profile <p>'s links: numbers are taken once,
                                                        switches serialise
    var/temproots/<pid>            exclusive, for the   marks the temp-roots file of a live process
                                   process's lifetime   (gc tells stale files by locking them)

Order (never the other way round): the gc lock, then a key's or a profile's lock. Beside each
lock held exclusively, `<name>.owner` says who holds it (pid, host, what, since when) so that a
waiter can tell a person whom it waits for; the note is advisory only — the flock is the truth.
Every wait is bounded by a timeout the caller passes (the user's --lock-timeout, else the defaults
below) and ends in LockTimeout (exit 75) naming the holder.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmgw_store.app import debug
from llmgw_store.base import defaults
from llmgw_store.base.errors import LockTimeout
from llmgw_store.base.report import say

POLL_S = 0.02
LOCK_MODE = 0o600
# How long a command waits for a lock before it exits 75 (base/defaults.py, where the CLI reads them
# too): keys are held for a whole build; every other lock only for short critical sections.
BUILD_LOCK_TIMEOUT_S = defaults.BUILD_LOCK_TIMEOUT_S
LOCK_TIMEOUT_S = defaults.LOCK_TIMEOUT_S
# The note of a holder appears just after it takes the lock: a waiter gives it this long.
NOTE_GRACE_S = 1.0


def open_lock_file(path: Path) -> int:
    """A descriptor on the lock file `path`, created 0600 if missing; a symlink is never followed."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)


def owner_note(lock: Path) -> Path:
    """`<name>.owner` beside `<name>.lock`: who holds it exclusively."""
    return lock.with_suffix(".owner")


def _owner_text(path: Path, default: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            info = json.loads(f.read(4096))
        pid, host = int(info["pid"]), str(info["host"])[:64]
        age = int(time.time() - info["since"])
        if host == _hostname() and not pid_alive(pid):
            return default  # a note left by a holder that was killed; whoever holds it now left none
        return f"pid {pid} on {host} ({str(info['what'])[:200]}, for {age}s)"
    except (OSError, ValueError, KeyError, TypeError):
        return default


def pid_alive(pid: int) -> bool:
    """Whether `pid` names a running process (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        pass
    return True


def _hostname() -> str:
    return os.uname().nodename  # socket.gethostname()'s answer, without importing socket


def _write_note(owner: Path, what: str) -> None:
    """Replace the note atomically (system/files.write_atomic: a new file renamed over), so a reader
    sees a whole note or the previous one. No fsync: a note only matters while its writer lives. The
    note is advisory: on a full disk the lock is held without one (gc must run there)."""
    from llmgw_store.system.files import write_atomic

    note = json.dumps({"pid": os.getpid(), "host": _hostname(), "what": what, "since": time.time()})
    try:
        write_atomic(owner, note.encode(), mode=LOCK_MODE, fsync=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise


def _acquire(fd: int, path: Path, shared: bool, what: str, timeout: float, default_holder: str) -> bool:
    """Take the flock on `fd`, waiting at most `timeout` seconds; True if it had to wait."""
    import fcntl

    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        pass
    started = time.monotonic()
    deadline = started + max(0.0, timeout)
    owner = owner_note(path)
    while not owner.exists() and time.monotonic() < min(deadline, started + NOTE_GRACE_S):
        time.sleep(POLL_S)
    say(f"{what}: waiting for {_owner_text(owner, default_holder)}, which holds {path.name}")
    debug.pause("LOCK_WAIT")  # tests: this process is queued behind the holder
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"{what}: gave up after {timeout:g}s waiting for {_owner_text(owner, default_holder)}, "
                    f"which holds {path}; try again later or raise --lock-timeout"
                ) from None
            time.sleep(POLL_S)


@contextmanager
def flock(path: Path, *, shared: bool, timeout: float, what: str, default_holder: str = "another process") -> Iterator[bool]:
    """Hold flock(2) on `path`; yields True if it had to wait. An exclusive holder leaves a note
    (`owner_note`) saying who it is, so that a waiter can name it; shared holders leave none, and a
    waiter then names them `default_holder`. After `timeout` seconds of waiting, raises LockTimeout
    naming the holder."""
    fd = open_lock_file(path)
    try:
        waited = _acquire(fd, path, shared, what, timeout, default_holder)
        if shared:
            yield waited
            return
        owner = owner_note(path)
        _write_note(owner, what)
        try:
            yield waited
        finally:
            # Before the flock is released: the next holder's note is never removed by this one.
            owner.unlink(missing_ok=True)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def hold(lock_dir: Path, name: str, what: str, timeout: float):
    """Hold the exclusive lock `lock_dir/<name>.lock` with an owner note; yields True when it had to
    wait for another holder first. Raises LockTimeout after `timeout` seconds of waiting."""
    return flock(lock_dir / f"{name}.lock", shared=False, timeout=timeout, what=what)
