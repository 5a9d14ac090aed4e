"""Runtime roots: the store paths running processes use, read from /proc as Nix's gc reads it.

roots/marking.py makes them `process` roots; a name is kept if any process names it anywhere gc
looks (exe, cwd, maps, open fds, cmdline, environ), so a mismatch can only keep more.
"""

from __future__ import annotations

import os
import re

from llmgw_store.core.keys import NIX_BASE32, STORE_NAME_MAX
from llmgw_store.core.layout import Layout

# A store path name after any `/store/` (core/keys.STORE_NAME_RE's shape, bounded): a process names
# its environment through whatever prefix reaches the root where it runs (the root bind-mounted
# elsewhere in a container's mount namespace, a symlinked parent), and /proc shows
# that prefix, not ours. Matching the name alone can only keep more (the safe direction); names
# that are not entries of this store are dropped.
_RUNTIME_NAME = re.compile(rf"/store/([{NIX_BASE32}]{{32}}-[A-Za-z0-9._+!-]{{1,{STORE_NAME_MAX - 33}}})")


def runtime_roots(layout: Layout) -> dict[str, set[str]]:
    """Store path names used by running processes (those /proc shows: the pid namespace gc runs
    in) -> the pids using them."""
    pattern = _RUNTIME_NAME
    found: dict[str, set[str]] = {}

    def note(text: str, pid: str) -> None:
        for m in pattern.finditer(text):
            found.setdefault(m.group(1), set()).add(pid)

    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        base = f"/proc/{pid}"
        for link in ("exe", "cwd"):
            try:
                note(os.readlink(f"{base}/{link}"), pid)
            except OSError:
                pass
        try:
            for fd in os.listdir(f"{base}/fd"):
                try:
                    note(os.readlink(f"{base}/fd/{fd}"), pid)
                except OSError:
                    pass
        except OSError:
            pass
        for name in ("maps", "cmdline", "environ"):
            try:
                with open(f"{base}/{name}", "rb") as f:
                    note(f.read().decode(errors="replace").replace("\0", "\n"), pid)
            except OSError:
                pass
    return {name: pids for name, pids in found.items() if os.path.lexists(layout.store / name)}
