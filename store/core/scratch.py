"""Scratch trees under ROOT/var/tmp named after the process that made them (`check-<pid>-…`,
`pull-<pid>-…`): removed by their maker on every way out it can see, SIGTERM included (its maker
runs inside system/signals.py's guard), and by the next command of their kind when the maker was
killed by SIGKILL. `to_trash` removes one in an instant: a rename into ROOT/var/trash (the same
file system), whose contents the next `gc` deletes (roots/gc.py), not the command that goes on."""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmgw_store.base.report import say
from llmgw_store.core.locks import pid_alive
from llmgw_store.system.trees import force_rmtree


def to_trash(tree: Path, trash: Path | None) -> None:
    """Take `tree` out of the way at once: renamed into `trash` under a name no other rename takes;
    deleted here only when that cannot be (no trash given or made, another file system)."""
    import time

    if not os.path.lexists(tree):
        return
    if trash is not None:
        try:
            os.rename(tree, trash / f"{tree.name}.{os.getpid()}.{time.monotonic_ns()}")
            return
        except OSError:
            pass
    force_rmtree(tree)


def sweep_dead(tmp: Path, pattern: re.Pattern[str], max_scan: int, what: str, trash: Path | None = None) -> None:
    """Remove the entries of `tmp` whose name `pattern` matches whole with the maker's pid as group 1,
    when that pid is not this process and no longer runs (into `trash` when given: `to_trash`); at
    most `max_scan` names are looked at. (A pid reused since is taken as alive: its tree waits for
    the next sweep.)"""
    try:
        with os.scandir(tmp) as it:
            names = [e.name for _, e in zip(range(max_scan), it, strict=False)]
    except FileNotFoundError:
        return
    for n in names:
        m = pattern.fullmatch(n)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            say(f"removing {n}, left by {what} that did not finish")
            to_trash(tmp / n, trash)
