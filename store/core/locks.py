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

Order (never the other way round): the gc lock, then a key's or a profile's lock. Beside a key's
lock, `<key>.owner` says who holds it (pid, host, what, since when) so that a waiter can tell a
person whom it waits for; the note is advisory only — the flock is the truth.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from llmgw_store.core.errors import LockTimeout
from llmgw_store.core.report import say

POLL_S = 0.02
LOCK_MODE = 0o600


def open_lock_file(path: Path) -> int:
    """A descriptor on the lock file `path`, created 0600 if missing; a symlink is never followed."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)


@contextmanager
def flock(path: Path, *, shared: bool, timeout: float, busy: Callable[[], str]) -> Iterator[bool]:
    """Hold flock(2) on `path`; yields True if it had to wait. After `timeout` seconds of waiting,
    raises LockTimeout with the message `busy()` returns."""
    import fcntl

    fd = open_lock_file(path)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = time.monotonic() + timeout
    waited = False
    try:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(busy()) from None
                waited = True
                time.sleep(POLL_S)
        yield waited
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _owner_text(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            info = json.loads(f.read(4096))
        age = int(time.time() - info["since"])
        return f"pid {int(info['pid'])} on {str(info['host'])[:64]} ({str(info['what'])[:200]}, for {age}s)"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def hold(lock_dir: Path, name: str, what: str, timeout: float) -> Iterator[bool]:
    """Hold the exclusive lock `name` with an owner note; yields True when it had to wait for
    another holder first. Raises LockTimeout after `timeout` seconds of waiting."""
    import fcntl

    owner = lock_dir / f"{name}.owner"
    fd = open_lock_file(lock_dir / f"{name}.lock")
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            # The holder writes its note just after it takes the lock: give it a moment to appear.
            note_deadline = time.monotonic() + min(1.0, timeout)
            while not owner.exists() and time.monotonic() < note_deadline:
                time.sleep(POLL_S)
            say(f"waiting for {_owner_text(owner)} to finish {what}")
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(
                            f"gave up after {timeout:.0f}s waiting for {_owner_text(owner)} to finish {what}; "
                            "try again later or raise --lock-timeout"
                        ) from None
                    time.sleep(POLL_S)
        import socket

        tmp = owner.with_name(f".{owner.name}.{os.getpid()}")
        note = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": time.time()})
        tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, LOCK_MODE)
        with os.fdopen(tfd, "w") as f:
            f.write(note)
        os.replace(tmp, owner)
        try:
            yield waited
        finally:
            owner.unlink(missing_ok=True)
    finally:
        os.close(fd)
