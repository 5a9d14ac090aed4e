"""`verify`: prove what the store holds, and repair what it cannot prove.

A path verifies when its tree, hashed now, matches the content hash its manifest and the index
record, every entry matches its line in `.llmgw/contents`, and nothing has a write bit. What
differs is named: modified, missing and extra entries (a byte changed, a file added, a symlink
retargeted and an exec bit flipped are all "modified" or "extra" with the path), writable entries.

`--repair` rebuilds a damaged path from what was recorded for it (build/rebuild.py) — its key's
inputs from the index, the exact lock from the manifest when that can be proved
(`lockproof.proved_lock`; else resolved again with the same `--exclude-newer`) — into `.partial`,
with the same uv and interpreter, and private,
empty uv and bytecode caches (nothing shared is trusted to give back the recorded bytes). It checks
the result like any build and swaps it in with one atomic exchange (realise.replace) only if it
hashes to the content hash the index recorded: a repair never records a hash it computed itself.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blake3 import blake3

from llmgw_store.app.results import Result
from llmgw_store.base.errors import NoStoreError
from llmgw_store.base.report import progress, say
from llmgw_store.core import locks, manifest
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.local_store import Store
from llmgw_store.core.oplog import recorded
from llmgw_store.roots.resolve import reference
from llmgw_store.system.trees import force_rmtree


@dataclass(frozen=True)
class VerifyReport(Result):
    """One entry per path checked (name, path, ok, modified, missing, extra, writable, problems,
    and after a repair: repair, ok_after_repair); `damaged` names those still damaged."""

    paths: tuple[dict[str, Any], ...]
    checked: int
    damaged: tuple[str, ...]


def check_path(store: Store, row: RegisteredPath, memo: dict | None = None) -> dict[str, Any]:
    """What differs between the path of `row` and what was recorded for it. `memo` (one dict per
    run) lets a file shared with a path checked before in this run be hashed once: both are named
    if it is damaged."""
    name = row.name
    env = store.layout.path_of(name)
    r: dict[str, Any] = {"name": name, "path": str(env), "ok": False, "modified": [], "missing": [], "extra": [],
                         "writable": [], "foreign": [], "modes": [], "problems": []}
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
    except (OSError, ValueError) as exc:
        r["problems"].append(f"the contents listing cannot be read: {exc}")

    def parsed(actual: list[manifest.Entry] | None) -> list[manifest.Entry] | None:
        # The listing is parsed only when the tree's own listing is not byte for byte the recorded
        # one: listing() and parse_contents() are inverses, so those bytes parse to `actual`.
        if raw is None:
            return None
        if actual is not None and manifest.listing(actual) == raw:
            return actual
        try:
            return manifest.parse_contents(raw)
        except ValueError as exc:
            r["problems"].append(f"the contents listing cannot be read: {exc}")
            return None

    writable: list[str] = []
    foreign: list[dict[str, Any]] = []
    modes: list[tuple[str, int]] = []
    try:
        actual = manifest.scan(env, writable, memo=memo, foreign=foreign, modes=modes)
    except OSError as exc:
        parsed(None)
        if doc is not None:
            r["problems"] += manifest.problems_of(doc, name)
        r["problems"].append(f"the tree cannot be read: {exc}")
        return r
    recorded = parsed(actual)
    if doc is not None:
        r["problems"] += manifest.problems_of(doc, name)
    listed_hash = blake3(raw).hexdigest() if raw is not None else None
    if recorded is not None:
        r.update(manifest.compare(recorded, actual))
        if doc is not None and listed_hash != doc.get("content_hash"):
            r["problems"].append("the contents listing does not match the manifest's hash")
    if doc is not None and doc.get("content_hash") != row.content_hash:
        r["problems"].append("the manifest and the index record different content hashes")
    # The listing's own bytes hash to the recorded content hash only if they are the listing the
    # build wrote (blake3 is collision resistant); if the tree parses back to exactly those entries,
    # the tree's listing is those bytes, and its hash need not be computed again.
    same = listed_hash == row.content_hash and (recorded is actual or recorded == actual)
    if not same and manifest.content_hash(actual) != row.content_hash \
            and not (r["modified"] or r["missing"] or r["extra"]):
        r["problems"].append("the tree's content hash differs from the index")
    r["writable"] = sorted(writable)
    r["foreign"] = [{**f, "path": manifest.shown_path(f["path"])} for f in sorted(foreign, key=lambda f: f["path"])]
    # Not the canonical frozen mode (0444/0555): e.g. 0400, unreadable to the service users that run it.
    r["modes"] = [{"path": manifest.shown_path(p), "mode": f"{m:04o}"} for p, m in sorted(modes)]
    for kind in ("modified", "missing", "extra", "writable"):
        r[kind] = [manifest.shown_path(p) for p in r[kind]]
    r["ok"] = not (r["modified"] or r["missing"] or r["extra"] or r["writable"] or r["foreign"] or r["modes"]
                   or r["problems"])
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
    index_url: str | None = None,
) -> VerifyReport:
    """Check `targets` (default: every path); with `repair`, rebuild the damaged ones, waiting at
    most `lock_timeout` s for each lock (the gc lock to add a temp root, the key's, the index).
    Without `repair` verify only looks: the store is opened read-only. `index_url`: the configured
    index URL, whose credentials (if any) a repair sends to the recorded index when it is that one."""
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
            say(f"{row.name}: {'ok' if r['ok'] else 'DAMAGED'}")
            if not r["ok"] and repair:
                r["repair"] = _repair(store, row, uv, python_preference, lock_timeout, index_url)
                memo.clear()  # the repair made and deleted files: inode numbers may be reused
                after = store.index.path_by_name(row.name)  # None: gone since (nothing to be ok)
                r["ok_after_repair"] = after is not None and check_path(store, after)["ok"]
            results.append(r)
        progress("verifying", len(rows), len(rows), "paths")
        damaged = [r["name"] for r in results if not r["ok"] and not r.get("ok_after_repair")]
        return VerifyReport(tuple(results), len(results), tuple(damaged))


def _repair(store: Store, row: RegisteredPath, uv_path, python_preference, lock_timeout,
            index_url: str | None = None) -> dict[str, Any]:
    """Rebuild a damaged path from its record (build/rebuild.py, as a cold rollback and `build
    --check` do) with private, empty uv and bytecode caches — the shared ones are not trusted to
    give back the recorded bytes: every wheel is fetched and checked against the lock's hashes
    again, every module compiled again — and swap it in only if it hashes to the recorded hash."""
    from llmgw_store.build import rebuild

    name = row.name
    recorded = rebuild.recorded_in_store(store, row, need_lock=False)
    say(f"repairing {name} from its recorded inputs" + (" and lock" if recorded.lock else " (resolving again)"))
    private = store.layout.tmp / f"repair-{os.getpid()}-{time.monotonic_ns()}"
    try:
        new = rebuild.rebuild(store, recorded, rebuild.REPLACE, uv_path=uv_path, python_preference=python_preference,
                              private=private, index_url=index_url, lock_timeout=lock_timeout)
    finally:
        force_rmtree(private)
    say(f"repaired {name}: byte-identical to what was built")
    return {"content_hash": new.content_hash, "identical": new.content_hash == row.content_hash}
