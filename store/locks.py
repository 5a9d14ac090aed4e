"""Per-key build locks.

`ROOT/var/locks/<key>.lock` is an flock(2) lock (filelock): the kernel drops it when its holder
dies, even by SIGKILL, so a crashed build never blocks the next one. Beside it, `<key>.owner` says
who holds it (pid, host, what, since when) so that a waiter can tell a person whom it waits for;
the note is advisory only — the flock is the truth.

Profile locks and the gc lock are plain flock(2) through `flock` below: they are on the hot path
of `activate` and `rollback`, where importing filelock would cost more than the switch itself.

Lock order (never take them the other way round): the gc lock, then a key's or a profile's lock.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .errors import LockTimeout

POLL_S = 0.02


@contextmanager
def flock(path: Path, *, shared: bool, timeout: float, busy: Callable[[], str]) -> Iterator[bool]:
    """Hold flock(2) on `path` (created if missing); yields True if it had to wait. After `timeout`
    seconds of waiting, raises LockTimeout with the message `busy()` returns."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
        info = json.loads(path.read_text())
        age = int(time.time() - info["since"])
        return f"pid {info['pid']} on {info['host']} ({info['what']}, for {age}s)"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def hold(lock_dir: Path, name: str, what: str, timeout: float, progress: Callable[[str], None]) -> Iterator[bool]:
    """Hold the lock `name`; yields True when it had to wait for another holder first.
    Raises LockTimeout after `timeout` seconds of waiting."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(lock_dir / f"{name}.lock"))
    owner = lock_dir / f"{name}.owner"
    waited = False
    try:
        lock.acquire(timeout=0)
    except Timeout:
        waited = True
        # The holder writes its note just after it takes the lock: give it a moment to appear.
        note_deadline = time.monotonic() + 1.0
        while not owner.exists() and time.monotonic() < note_deadline:
            time.sleep(0.02)
        progress(f"waiting for {_owner_text(owner)} to finish {what}")
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise LockTimeout(
                f"gave up after {timeout:.0f}s waiting for {_owner_text(owner)} to finish {what}; "
                "try again later or raise --lock-timeout"
            ) from None
    import socket

    try:
        tmp = owner.with_name(f".{owner.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": time.time()}))
        os.replace(tmp, owner)
        yield waited
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
