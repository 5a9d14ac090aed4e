"""Helpers the benchmarks share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = Path(sys.executable)
CLI = PY.with_name("llmgw-store")


def timed(argv: list[str], **kw) -> float:
    """Wall seconds of one command, its output discarded."""
    return measured(argv, **kw)[0]


def measured(argv: list[str], env: dict | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB of the command and every descendant it waited for)."""
    import os
    import time

    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, usage.ru_maxrss


def clone_registered(root: Path, src_name: str, n: int, tag: str = "") -> list[str]:
    """n copies of store path `src_name`, registered under fresh keys (`tag` makes another set)."""
    sys.path.insert(0, str(REPO))
    from llmgw_store.core.index import Index
    from llmgw_store.core.keys import store_key

    idx = Index(root / "var" / "db.sqlite")
    row = idx.path_by_name(src_name)
    names = []
    for i in range(n):
        key = store_key({"bench": i, "src": src_name, **({"tag": tag} if tag else {})})
        name = f"{key}-{src_name.split('-', 1)[1]}"
        subprocess.run(["cp", "-a", str(root / "store" / src_name), str(root / "store" / name)], check=True)
        b = idx.start_build(key, name)
        idx.register({**row, "name": name, "key": key}, b, 0.0)
        names.append(name)
    idx.close()
    return names
