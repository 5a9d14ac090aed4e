"""Looking for processes in /proc, as an operator would after a crash: which live processes still
mention a path (in their command line, working directory or environment)?"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} (ppid {self.ppid}, pgid {self.pgid}): {self.cmdline[:160]}"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid), or None if the process is gone."""
    raw = _read(f"/proc/{pid}/stat").decode(errors="replace")
    if not raw:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def mentioning(text: str) -> list[Proc]:
    """Live processes (not zombies, not this one) whose cmdline, cwd or environment contains `text`."""
    needle = os.fsencode(text)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        cmdline = _read(f"/proc/{pid}/cmdline")
        try:
            cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            cwd = b""
        if needle in cmdline or needle in cwd or needle in _read(f"/proc/{pid}/environ"):
            found.append(Proc(pid, st[1], st[2], cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is `pid` or one of its ancestors (an orphan has been reparented: its
    chain no longer leads to the process that started it)."""
    seen = 0
    while pid > 1 and seen < 1000:
        if pid == ancestor:
            return True
        st = _stat(pid)
        if st is None:
            return False
        pid, seen = st[1], seen + 1
    return False


def gone_within(text: str, seconds: float, but: int | None = None) -> list[Proc]:
    """Wait up to `seconds` for every process mentioning `text` to be gone (but `but` and its
    descendants); returns those left."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in mentioning(text) if but is None or not descends_from(p.pid, but)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def wait_for(predicate, seconds: float, what: str):
    """Poll `predicate()` until it returns something truthy; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")


def kill_all(procs: list[Proc]) -> None:
    """Clean up after a failed assertion: SIGKILL the given leftovers (processes the test started)."""
    import signal

    for p in procs:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass
