"""Barriers for race and crash tests: hold a store process at a named debug point
(store/app/debug.py, `LLMGW_STORE_DEBUG_<POINT>=wait:DIR`) until the test says go.

    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cmd, env={**os.environ, **gate.env("BEFORE_RENAME")})
    gate.reached("BEFORE_RENAME", proc)      # the process is now inside the window
    ...                                      # do what races it (or SIGKILL it there)
    gate.go("BEFORE_RENAME")                 # let it go on

No sleeps decide anything: `reached` waits for the process's own word, bounded by a timeout, and
fails at once if the process exits without reaching the point.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

POLL_S = 0.005


class Barrier:
    def __init__(self, directory: Path):
        self.dir = Path(directory) / "barrier"
        self.dir.mkdir(parents=True, exist_ok=True)

    def env(self, *points: str) -> dict[str, str]:
        """The environment variables that stop a process at each of `points`."""
        return {f"LLMGW_STORE_DEBUG_{p}": f"wait:{self.dir}" for p in points}

    def _file(self, point: str, what: str) -> Path:
        return self.dir / f"{point.lower()}.{what}"

    def reached(self, point: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> int:
        """Wait until a process stands at `point`; its pid. Fails if `proc` ends first."""
        deadline = time.monotonic() + timeout
        f = self._file(point, "reached")
        while not f.exists():
            if proc is not None and proc.poll() is not None:
                out = proc.communicate()[1] if proc.stderr else ""
                raise AssertionError(f"the process exited ({proc.returncode}) before reaching {point}: {out}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no process reached {point} in {timeout} s")
            time.sleep(POLL_S)
        return int(f.read_text())

    def reached_by(self, point: str, count: int, procs: list[subprocess.Popen] = (), timeout: float = 120.0) -> list[int]:
        """Wait until `count` distinct processes have reached `point` (held there, or passed through
        an open one); their pids. Fails if every one of `procs` ends first."""
        deadline = time.monotonic() + timeout
        while len(pids := self.pids(point)) < count:
            if procs and all(p.poll() is not None for p in procs):
                raise AssertionError(f"the processes exited with {len(pids)} of {count} at {point}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(pids)} of {count} processes reached {point} in {timeout} s")
            time.sleep(POLL_S)
        return pids

    def pids(self, point: str) -> list[int]:
        """The processes that have reached `point` so far."""
        prefix = f"{point.lower()}.pid-"
        return sorted(int(p.name[len(prefix):]) for p in self.dir.glob(prefix + "*"))

    def go(self, point: str) -> None:
        """Let every process waiting at `point` go on (and any that reaches it later)."""
        self._file(point, "go").write_text("")

    def reset(self, point: str) -> None:
        """Close `point` again, for a second process to be held there."""
        for f in [self._file(point, "reached"), self._file(point, "go"), *self.dir.glob(f"{point.lower()}.pid-*")]:
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
