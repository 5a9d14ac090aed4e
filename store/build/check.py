"""`build --check`: rebuild a key that is in the store, and compare the two trees file by file.

    plan the recipe (the key, as `build` computes it; a key not in the store is refused)
    temp root for the store path   (gc keeps it while it is compared)
    the lock the path records      (lockproof.proved_lock: listing -> manifest -> index; never resolved again)
    rebuild it from its record     (build/rebuild.py, as a repair and a cold rollback do) into
                                   ROOT/var/tmp/check-<pid>-<ns>/env with private, empty uv and
                                   bytecode caches; canonical and frozen, as a build makes it
    compare with the store path as it is now: kind, bytes (blake3), size, mode, symlink target,
                                   owner and xattrs, the store path's own directory (".") too;
                                   and its .llmgw/manifest.json and contents: read-only, the
                                   store's owner, no xattrs, inputs that hash to its key
    remove the temporary tree      (on every way out; a SIGKILLed check's is removed by the next)

The store path is only read: nothing here writes under store/ or takes the key's lock, so a check
runs beside builds and activations of the same key. The rebuild is what a repair would install
(verify.py): the same recorded lock, the same uv and interpreter (both in the key), caches that
share nothing with the store's, so a difference is the build's or the store path's, not a cache's.
The store path is compared as it is on disk, not as its listing says: a file changed in place
(chmod u+w and write, as root can) and a listing changed to match are both seen.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import NotFoundError
from llmgw_store.base.report import say
from llmgw_store.build import rebuild
from llmgw_store.build import recipe as recipes
from llmgw_store.build.plan import BuildOptions, plan_build
from llmgw_store.core import manifest
from llmgw_store.core.local_store import Store
from llmgw_store.core.scratch import sweep_dead
from llmgw_store.system.signals import raising
from llmgw_store.system.trees import force_rmtree

SCRATCH_RE = re.compile(r"check-([0-9]{1,7})-[0-9]{1,20}")  # Linux pids are at most 2^22
MAX_STALE_SCAN = 10_000  # names of ROOT/var/tmp looked at for a dead check's leftovers


@dataclass(frozen=True)
class CheckResult(Result):
    """`identical` when every entry of the rebuilt tree matches the store path's; `differences`
    lists the others, each with what the store holds and what the rebuild made (None: absent)."""

    path: str
    name: str
    key: str
    identical: bool
    content_hash: str
    rebuilt_content_hash: str
    files: int
    differences: tuple[dict[str, Any], ...]
    problems: tuple[str, ...]  # of the store path's metadata (.llmgw/manifest.json, contents)
    seconds: float


def check(recipe_file: str | Path, options: BuildOptions | None = None, *,
          root: str | Path | None = None) -> CheckResult:
    """Rebuild the recipe's key into a temporary tree and compare it with the store path."""
    started = time.monotonic()
    options = options or BuildOptions()
    recipe = recipes.load(recipe_file)
    chosen = _chosen(recipe, options)
    if options.as_of is not None:
        recipes.past_time(options.as_of)
    with Store.open(root, options.lock_timeout) as store:
        plan = plan_build(store, recipe, chosen, options)
        layout = store.layout
        final = layout.path_of(plan.name)
        row = store.index.path_by_key(plan.key)
        if row is None or not final.is_dir():
            raise NotFoundError(f"{plan.name} is not in the store; build it first (`llmgw-store build {recipe_file}`), "
                                "then check it")
        from llmgw_store.core.temproots import TempRoots

        # From here until this process exits, gc keeps the path; checked again now that it cannot go.
        TempRoots(layout).add(plan.name, options.lock_timeout)
        row = store.index.path_by_key(plan.key)
        if row is None or not final.is_dir():
            raise NotFoundError(f"{plan.name} was collected while the check started; build it again")
        recorded = rebuild.recorded_in_store(store, row, need_lock=True)  # a check never resolves again
        sweep_dead(layout.tmp, SCRATCH_RE, MAX_STALE_SCAN, "a check")
        scratch = layout.tmp / f"check-{os.getpid()}-{time.monotonic_ns()}"
        problems: list[str] = []
        with raising():  # SIGTERM/SIGHUP as ^C: the scratch tree is removed (exit 143/129)
            scratch.mkdir(mode=0o700)
            try:
                tree = scratch / "env"
                tree.mkdir()
                say(f"rebuilding {plan.name} from its recorded lock into {tree}")
                rebuild.rebuild(store, recorded, tree, uv_path=options.uv, python_preference=options.python_preference,
                                private=scratch, index_url=options.index_url, lock_timeout=options.lock_timeout)
                say("comparing the rebuilt tree with the store path")
                ours, theirs = describe(tree), describe(final, problems)
            finally:
                force_rmtree(scratch)
    try:
        problems += manifest.problems_of(manifest.read(final), plan.name)
    except ValueError as exc:
        problems.append(f"the manifest cannot be read: {exc}")
    differences = tuple(compare(theirs, ours))
    rebuilt_hash = manifest.content_hash([d.entry for p, d in ours.items() if p != ROOT])
    return CheckResult(
        path=str(final), name=plan.name, key=plan.key, identical=not differences and not problems,
        content_hash=row.content_hash, rebuilt_content_hash=rebuilt_hash, files=len(ours) - 1,
        differences=differences, problems=tuple(problems), seconds=round(time.monotonic() - started, 3),
    )


def _chosen(recipe: recipes.Recipe, options: BuildOptions) -> recipes.Build:
    """The build `build` would pick: --variant, else the host's GPUs, else the only one."""
    if options.variant is None and len(recipe.builds) > 1:
        from llmgw_store.build import gpu

        chosen, why = gpu.choose(recipe, None, gpu.probe_host())
        say(f"chose build {chosen.variant!r}: {why}")
        return chosen
    return recipe.build_for(options.variant)


@dataclass(frozen=True)
class Described:
    entry: manifest.Entry
    mode: int | None  # permission bits; None for a symlink (its mode means nothing on Linux)
    uid: int  # a build's entries are all the euid's (the store's owner)
    xattrs: tuple[str, ...]  # a build makes none


ROOT = "."  # the store path's own directory, compared as an entry


def describe(tree: Path, problems: list[str] | None = None) -> dict[str, Described]:
    """Every entry of `tree` (as the contents listing has them, and `tree` itself as ".") with its
    permission bits, owner and xattr names. With `problems`, what is wrong with the metadata files
    the listing leaves out is appended to it (manifest.metadata_problems)."""
    foreign: list[dict[str, Any]] = []
    entries = manifest.scan(tree, foreign=foreign)
    alien = {f["path"]: f for f in foreign}
    euid = os.geteuid()
    out = {}
    for e in [manifest.Entry(ROOT, "d", 0, ""), *entries]:
        st = os.lstat(tree / e.path)
        f = alien.get(e.path)
        out[e.path] = Described(e, None if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode),
                                f["uid"] if f else euid, tuple(f["xattrs"]) if f else ())
    if problems is not None:
        problems += manifest.metadata_problems(tree, foreign)
    return out


KINDS = {"f": "file", "x": "executable", "d": "directory", "l": "symlink", "o": "other"}


def _side(d: Described | None) -> dict[str, Any] | None:
    if d is None:
        return None
    e = d.entry
    out: dict[str, Any] = {"kind": KINDS.get(e.kind, e.kind)}
    if e.kind in "fx":
        out.update(size=e.size, digest=e.digest)
    if e.kind == "l":
        out["target"] = manifest.shown_path(e.digest)
    if d.mode is not None:
        out["mode"] = f"{d.mode:04o}"
    out["uid"] = d.uid
    if d.xattrs:
        out["xattrs"] = list(d.xattrs)
    return out


def compare(store: dict[str, Described], rebuilt: dict[str, Described]) -> Iterator[dict[str, Any]]:
    """The entries that differ in kind, bytes, size, mode, target, owner or xattrs, or exist on one
    side only, in path order (names that are not UTF-8 shown with backslash escapes)."""
    for path in sorted(store.keys() | rebuilt.keys()):
        a, b = store.get(path), rebuilt.get(path)
        if a != b:
            yield {"path": manifest.shown_path(path), "store": _side(a), "rebuilt": _side(b)}


