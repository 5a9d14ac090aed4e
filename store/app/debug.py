"""Test hooks that hold a process at a named point on purpose, like Nix's NIX_DEBUG_GC_WAIT.

`LLMGW_STORE_DEBUG_<POINT>` set to
  - `wait:DIR` makes the process write `DIR/<point>.reached` (its pid; and `DIR/<point>.pid-<pid>`,
    so that several processes at one point can be counted) and wait there until
    `DIR/<point>.go` exists: a barrier a test opens when it has done what it wanted to do inside
    the window (tests/support/barrier.py). The wait is bounded (MAX_WAIT_S), so a test that
    forgets to open it fails instead of hanging;
  - a number of seconds makes it sleep that long (kept for benches and manual widening of a window).
Unset, a point costs a dict lookup. Children run in a clean environment, so a point inside a child
(COMPILE_PAUSE, in each bytecode compile worker) is handed to it explicitly with `passed_on`."""

from __future__ import annotations

import os
import time

PREFIX = "LLMGW_STORE_DEBUG_"
MAX_WAIT_S = 300.0
POLL_S = 0.005


def pause(point: str) -> None:
    """Hold here as $LLMGW_STORE_DEBUG_<POINT> says, if set."""
    value = os.environ.get(PREFIX + point)
    if not value:
        return
    if value.startswith("wait:"):
        wait_at(value[len("wait:"):], point)
    else:
        time.sleep(float(value))


def wait_at(directory: str, point: str) -> None:
    """Say `<point>.reached` in `directory`, then wait for `<point>.go` (at most MAX_WAIT_S)."""
    import threading

    base = os.path.join(directory, point.lower())
    tmp = f"{base}.reached.{os.getpid()}.{threading.get_ident()}"  # several threads may reach one point
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    try:
        os.link(tmp, f"{base}.pid-{os.getpid()}")  # one per process: a test can count who is here
    except FileExistsError:
        pass  # another thread of this process is here already
    os.replace(tmp, base + ".reached")  # the test never sees a half-written pid
    deadline = time.monotonic() + MAX_WAIT_S
    while not os.path.exists(base + ".go"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"debug point {point}: nobody opened {base}.go in {MAX_WAIT_S:.0f} s")
        time.sleep(POLL_S)


def passed_on(point: str) -> dict[str, str]:
    """{LLMGW_STORE_DEBUG_<POINT>: value} if set, for a child's environment; else {}."""
    name = PREFIX + point
    value = os.environ.get(name)
    return {name: value} if value else {}
