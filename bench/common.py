"""Helpers the benchmarks share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = Path(sys.executable)
CLI = PY.with_name("llmgw-store")


def timed(argv: list[str], env: dict | None = None) -> float:
    """Wall seconds of one command, its output discarded."""
    import time

    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t


def peak_rss_mb(argv: list[str], env: dict | None = None) -> float | None:
    """Peak RSS (MB) of one run of a command and the children it waited for, measured by GNU time:
    a small parent, so the figure is not the benchmark's own memory copied into the fork before exec
    (what wait4 from this process would report). None where /usr/bin/time is missing."""
    import os
    import tempfile

    if not os.access("/usr/bin/time", os.X_OK):
        return None
    with tempfile.NamedTemporaryFile("r") as out:
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", out.name, *argv], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env)
        return round(int(out.read().split()[-1]) / 1024, 1)


def clone_registered(root: Path, src_name: str, n: int, tag: str = "") -> list[str]:
    """n copies of store path `src_name`, registered under fresh keys (`tag` makes another set)."""
    sys.path.insert(0, str(REPO))
    import dataclasses

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
        idx.register(dataclasses.replace(row, name=name, key=key), b, 0.0)
        names.append(name)
    idx.close()
    return names
