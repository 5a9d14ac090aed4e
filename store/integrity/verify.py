"""`verify`: prove what the store holds, and repair what it cannot prove.

A path verifies when its tree, hashed now, matches the content hash its manifest and the index
record, every entry matches its line in `.llmgw/contents`, and nothing has a write bit. What
differs is named: modified, missing and extra entries (a byte changed, a file added, a symlink
retargeted and an exec bit flipped are all "modified" or "extra" with the path), writable entries.

`--repair` rebuilds a damaged path from what was recorded for it — its key's inputs from the index,
the exact lock from the manifest when that can be proved (`_recorded_lock`; else resolved again
with the same `--exclude-newer`) — into `.partial`, with the same uv and interpreter, and private,
empty uv and bytecode caches (nothing shared is trusted to give back the recorded bytes). It checks
the result like any build and swaps it in with one atomic exchange (realise.replace) only if it
hashes to the content hash the index recorded: a repair never records a hash it computed itself.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blake3 import blake3

from llmgw_store.core import locks, manifest
from llmgw_store.core.errors import NoStoreError, NotFoundError, UsageError
from llmgw_store.core.fsutil import force_rmtree
from llmgw_store.core.local_store import Store
from llmgw_store.core.oplog import recorded
from llmgw_store.core.report import progress, say
from llmgw_store.core.results import Result
from llmgw_store.roots.resolve import reference


@dataclass(frozen=True)
class VerifyReport(Result):
    """One entry per path checked (name, path, ok, modified, missing, extra, writable, problems,
    and after a repair: repair, ok_after_repair); `damaged` names those still damaged."""

    paths: tuple[dict[str, Any], ...]
    checked: int
    damaged: tuple[str, ...]


def check_path(store: Store, row: dict[str, Any], memo: dict | None = None) -> dict[str, Any]:
    """What differs between the path of `row` and what was recorded for it. `memo` (one dict per
    run) lets a file shared with a path checked before in this run be hashed once: both are named
    if it is damaged."""
    name = row["name"]
    env = store.layout.path_of(name)
    r: dict[str, Any] = {"name": name, "path": str(env), "ok": False, "modified": [], "missing": [], "extra": [],
                         "writable": [], "foreign": [], "problems": []}
    try:
        is_dir = stat.S_ISDIR(os.lstat(env).st_mode)  # never through a link put in its place
    except FileNotFoundError:
        r["problems"].append("the directory is missing")
        return r
    if not is_dir:
        r["problems"].append("it is not a directory (a link or a file in its place)")
        return r
    try:
        doc = manifest.read(env)
    except (OSError, ValueError) as exc:
        doc = None
        r["problems"].append(f"the manifest cannot be read: {exc}")
    recorded = raw = None
    try:
        raw = manifest.read_contents_bytes(env)
        recorded = manifest.parse_contents(raw)
    except (OSError, ValueError) as exc:
        r["problems"].append(f"the contents listing cannot be read: {exc}")
    if doc is not None:
        r["problems"] += manifest.problems_of(doc, name)
    writable: list[str] = []
    foreign: list[dict[str, Any]] = []
    try:
        actual = manifest.scan(env, writable, memo=memo, foreign=foreign)
    except OSError as exc:
        r["problems"].append(f"the tree cannot be read: {exc}")
        return r
    listed_hash = blake3(raw).hexdigest() if raw is not None else None
    if recorded is not None:
        r.update(manifest.compare(recorded, actual))
        if doc is not None and listed_hash != doc.get("content_hash"):
            r["problems"].append("the contents listing does not match the manifest's hash")
    if doc is not None and doc.get("content_hash") != row["content_hash"]:
        r["problems"].append("the manifest and the index record different content hashes")
    # The listing's own bytes hash to the recorded content hash only if they are the listing the
    # build wrote (blake3 is collision resistant); if the tree parses back to exactly those entries,
    # the tree's listing is those bytes, and its hash need not be computed again.
    same = listed_hash == row["content_hash"] and recorded == actual
    if not same and manifest.content_hash(actual) != row["content_hash"] \
            and not (r["modified"] or r["missing"] or r["extra"]):
        r["problems"].append("the tree's content hash differs from the index")
    r["writable"] = sorted(writable)
    r["foreign"] = [{**f, "path": manifest.shown_path(f["path"])} for f in sorted(foreign, key=lambda f: f["path"])]
    for kind in ("modified", "missing", "extra", "writable"):
        r[kind] = [manifest.shown_path(p) for p in r[kind]]
    r["ok"] = not (r["modified"] or r["missing"] or r["extra"] or r["writable"] or r["foreign"] or r["problems"])
    return r



@recorded("verify")
def verify(
    targets: list[str] | None = None,
    *,
    root: str | Path | None = None,
    repair: bool = False,
    uv: str | Path | None = None,
    python_preference: str | None = None,
    lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S,
) -> VerifyReport:
    """Check `targets` (default: every path); with `repair`, rebuild the damaged ones, waiting at
    most `lock_timeout` s for each lock (the gc lock to add a temp root, the key's, the index).
    Without `repair` verify only looks: the store is opened read-only."""
    try:
        store = Store.open(root, lock_timeout, readonly=not repair)
    except NoStoreError as exc:
        if targets:
            raise  # a path was named: it is not there
        say(exc.nothing_to("verify"))
        return VerifyReport((), 0, ())
    with store:
        rows = [reference(store, t) for t in targets] if targets else store.index.paths()
        results = []
        memo: dict = {}  # shared inodes hashed in this run (see check_path)
        for n, row in enumerate(rows):
            progress("verifying", n, len(rows), "paths")
            r = check_path(store, row, memo)
            say(f"{row['name']}: {'ok' if r['ok'] else 'DAMAGED'}")
            if not r["ok"] and repair:
                r["repair"] = _repair(store, row, uv, python_preference, lock_timeout)
                memo.clear()  # the repair made and deleted files: inode numbers may be reused
                r["ok_after_repair"] = check_path(store, store.index.path_by_name(row["name"]))["ok"]
            results.append(r)
        progress("verifying", len(rows), len(rows), "paths")
        damaged = [r["name"] for r in results if not r["ok"] and not r.get("ok_after_repair")]
        return VerifyReport(tuple(results), len(results), tuple(damaged))


def _repair(store: Store, row: dict[str, Any], uv_path, python_preference, lock_timeout) -> dict[str, Any]:
    from llmgw_store.build import builder, interpreters
    from llmgw_store.build import uv as uvmod
    from llmgw_store.build.realise import replace

    name = row["name"]
    inputs = json.loads(row["inputs"])
    if "build" not in inputs:
        raise UsageError(f"{name} was not built from a recipe ({inputs.get('tool', 'unknown')}); remove it and let the store reinstall it")
    env = store.layout.path_of(name)
    lock_text = _recorded_lock(env, row["content_hash"])
    say(f"repairing {name} from its recorded inputs" + (" and lock" if lock_text else " (resolving again)"))
    uv = uvmod.resolve(store, uv_path, inputs["index_url"])
    if uv.version != inputs["uv"]:
        raise UsageError(f"repairing {name} needs uv {inputs['uv']}, not {uv.version}: pass --uv PATH to a uv {inputs['uv']}")
    want = inputs["python"]
    interp = interpreters.find(store, uv, want["request"], python_preference or interpreters.DEFAULT_PREFERENCE)
    if (interp.implementation, interp.version) != (want["implementation"], want["version"]):
        raise NotFoundError(f"repairing {name} needs {want['implementation']} {want['version']}; found {interp.implementation} {interp.version}")
    # Private, empty uv and bytecode caches: the shared ones are not trusted to give back the
    # recorded bytes; every wheel is fetched and checked against the lock's hashes again, and
    # every module compiled again.
    private = store.layout.tmp / f"repair-{os.getpid()}-{time.monotonic_ns()}"
    plan = builder.BuildPlan(
        key=row["key"], name=name, inputs=inputs, version=row["version"], fields=inputs["build"], uv=uv,
        interpreter=interp, index_url=inputs["index_url"],
        meta={"engine": row["engine"], "version": row["version"], "variant": row["variant"], "binary": inputs["binary"]},
        origin=f"the recorded inputs of {name}", lock_text=lock_text,
        uv_cache=private / "uv", pyc_cache=private / "pyc",
    )
    deadline = builder.Deadline(plan)
    try:
        new = replace(store, plan.key, name, inputs, plan.meta,
                      lambda partial: builder.make_env(store, plan, partial, deadline),
                      expect=row["content_hash"],
                      verify=lambda tree: builder.verify_env(store, plan, tree, deadline),
                      lock_timeout=lock_timeout)
    finally:
        force_rmtree(private)
    say(f"repaired {name}: byte-identical to what was built")
    return {"content_hash": new["content_hash"], "identical": new["content_hash"] == row["content_hash"]}


def _recorded_lock(env: Path, recorded_hash: str) -> str | None:
    """The lock the path was built from, only if it can be proved: the listing hashes to the content
    hash that the manifest and the index record, and the manifest's lock text hashes to the listed
    digest of the lock file. Else None (the repair resolves again, and its result must still hash
    to `recorded_hash`)."""
    try:
        doc = manifest.read(env)
        listing = manifest.read_contents(env)
        if not manifest.content_hash(listing) == doc["content_hash"] == recorded_hash:
            return None
        lock_text, lock_file = doc["lock"], f"{manifest.MANIFEST_DIR}/{doc['lock_format']}"
        listed = [e for e in listing if e.path == lock_file and e.kind == "f"]
        if isinstance(lock_text, str) and listed and blake3(lock_text.encode()).hexdigest() == listed[0].digest:
            return lock_text
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None
