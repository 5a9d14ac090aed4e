"""`verify`: prove what the store holds, and repair what it cannot prove.

A path verifies when its tree, hashed now, matches the content hash its manifest and the index
record, every entry matches its line in `.llmgw/contents`, and nothing has a write bit. What
differs is named: modified, missing and extra entries (a byte changed, a file added, a symlink
retargeted and an exec bit flipped are all "modified" or "extra" with the path), writable entries.

`--repair` rebuilds a damaged path from what was recorded for it — its key's inputs from the index,
the exact lock from the manifest when that is intact (else resolved again with the same
`--exclude-newer`) — into `.partial`, with the same uv and interpreter, checks it like any build,
and swaps it in with one atomic exchange (realise.replace). The rebuild uses a private, empty uv
cache, since the shared one is hardlinked into environments and may be damaged with them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from llmgw_store.core import locks
from llmgw_store.core import manifest
from llmgw_store.core.errors import NotFoundError, UsageError
from llmgw_store.core.fsutil import force_rmtree
from llmgw_store.core.local_store import Store
from llmgw_store.roots.resolve import registered


def _quiet(_: str) -> None:
    pass


def check_path(store: Store, row: dict[str, Any]) -> dict[str, Any]:
    name = row["name"]
    env = store.layout.path_of(name)
    r: dict[str, Any] = {"name": name, "path": str(env), "ok": False, "modified": [], "missing": [], "extra": [],
                         "writable": [], "problems": []}
    if not env.is_dir():
        r["problems"].append("the directory is missing")
        return r
    try:
        doc = manifest.read(env)
    except (OSError, ValueError) as exc:
        doc = None
        r["problems"].append(f"the manifest cannot be read: {exc}")
    try:
        recorded = manifest.read_contents(env)
    except (OSError, ValueError) as exc:
        recorded = None
        r["problems"].append(f"the contents listing cannot be read: {exc}")
    writable: list[str] = []
    actual = manifest.scan(env, writable)
    now = manifest.content_hash(actual)
    if recorded is not None:
        r.update(manifest.compare(recorded, actual))
        if doc is not None and manifest.content_hash(recorded) != doc.get("content_hash"):
            r["problems"].append("the contents listing does not match the manifest's hash")
    if doc is not None and doc.get("content_hash") != row["content_hash"]:
        r["problems"].append("the manifest and the index record different content hashes")
    if now != row["content_hash"] and not (r["modified"] or r["missing"] or r["extra"]):
        r["problems"].append("the tree's content hash differs from the index")
    r["writable"] = sorted(writable)
    r["ok"] = not (r["modified"] or r["missing"] or r["extra"] or r["writable"] or r["problems"])
    return r


def verify(
    targets: list[str] | None = None,
    *,
    root: str | Path | None = None,
    repair: bool = False,
    uv: str | Path | None = None,
    python_preference: str | None = None,
    lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """Check `targets` (default: every path); with `repair`, rebuild the damaged ones, waiting at
    most `lock_timeout` s for each lock (the gc lock to add a temp root, the key's, the index)."""
    with Store.open(root, lock_timeout) as store:
        rows = [registered(store, t) for t in targets] if targets else store.index.paths()
        results = []
        for row in rows:
            r = check_path(store, row)
            progress(f"{row['name']}: {'ok' if r['ok'] else 'DAMAGED'}")
            if not r["ok"] and repair:
                r["repair"] = _repair(store, row, uv, python_preference, lock_timeout, progress)
                r["ok_after_repair"] = check_path(store, store.index.path_by_name(row["name"]))["ok"]
            results.append(r)
        damaged = [r["name"] for r in results if not r["ok"] and not r.get("ok_after_repair")]
        return {"paths": results, "checked": len(results), "damaged": damaged}


def _repair(store: Store, row: dict[str, Any], uv_path, python_preference, lock_timeout, progress) -> dict[str, Any]:
    from llmgw_store.build import builder
    from llmgw_store.build import interpreters
    from llmgw_store.build import uv as uvmod
    from llmgw_store.build.realise import replace

    name = row["name"]
    inputs = json.loads(row["inputs"])
    if "build" not in inputs:
        raise UsageError(f"{name} was not built from a recipe ({inputs.get('tool', 'unknown')}); remove it and let the store reinstall it")
    env = store.layout.path_of(name)
    lock_text = None
    try:
        doc = manifest.read(env)
        if manifest.content_hash(manifest.read_contents(env)) == doc["content_hash"] == row["content_hash"]:
            lock_text = doc["lock"]
    except (OSError, ValueError, KeyError):
        pass
    progress(f"repairing {name} from its recorded inputs" + (" and lock" if lock_text else " (resolving again)"))
    uv = uvmod.resolve(store, uv_path, inputs["index_url"], progress)
    if uv.version != inputs["uv"]:
        raise UsageError(f"repairing {name} needs uv {inputs['uv']}, not {uv.version}: pass --uv PATH to a uv {inputs['uv']}")
    want = inputs["python"]
    interp = interpreters.find(store, uv, want["request"], python_preference or interpreters.DEFAULT_PREFERENCE, progress)
    if (interp.implementation, interp.version) != (want["implementation"], want["version"]):
        raise NotFoundError(f"repairing {name} needs {want['implementation']} {want['version']}; found {interp.implementation} {interp.version}")
    # A private, empty uv cache: the shared one may be damaged like this path; every wheel is
    # fetched and checked against the lock's hashes again.
    plan = builder.BuildPlan(
        key=row["key"], name=name, inputs=inputs, version=row["version"], fields=inputs["build"], uv=uv,
        interpreter=interp, index_url=inputs["index_url"],
        meta={"engine": row["engine"], "version": row["version"], "variant": row["variant"], "binary": inputs["binary"]},
        origin=f"the recorded inputs of {name}", lock_text=lock_text,
        uv_cache=store.layout.tmp / f"repair-cache-{os.getpid()}",
    )
    deadline = builder.Deadline(plan)
    try:
        new = replace(store, plan.key, name, inputs, plan.meta,
                      lambda partial: builder.make_env(store, plan, partial, deadline, progress),
                      verify=lambda tree: builder.verify_env(store, plan, tree, deadline, progress),
                      progress=progress, lock_timeout=lock_timeout)
    finally:
        force_rmtree(plan.uv_cache)
    identical = new["content_hash"] == row["content_hash"]
    progress(f"repaired {name}" + (" (byte-identical to what was built)" if identical else " (content hash changed)"))
    return {"content_hash": new["content_hash"], "identical": identical}
