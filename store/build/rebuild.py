"""Rebuilding a store path from what was recorded for it: the one way a cold rollback (api.py),
`verify --repair` (integrity/verify.py) and `build --check` (build/check.py) bring its bytes back.

    Recorded        what is known of the path (core/pathinfo.StorePathInfo: key, name, the key's
                    inputs, its content hash) and the lock it was installed from: from a
                    generation record (roots/records.py proves that lock by the record's digests)
                    or from the index and the manifest (`lockproof.proved_lock`)
    plan_for        the inputs must hash to the key; the recorded build table must be one a recipe
                    could have; the recorded uv version (the store's own, or --uv of that version)
                    and interpreter (implementation and version) must be found on this host
    rebuild         make_env with that plan — the recorded lock installed as it is, with
                    --require-hashes, never resolved again — into one of
                      STORE    the store path, absent (realise: a cold generation), registered only
                               if the frozen tree hashes to the recorded content hash
                      REPLACE  a replacement for the damaged path (realise.replace: a repair),
                               swapped in only if it hashes to the recorded content hash
                      a Path   a scratch tree the caller compares (build --check)

A rebuild never records a hash it computed: the recorded one is the only one a path can come
back with. `private` caches (repair, check) share nothing with the store's, so the bytes are the
lock's and the build's, not a cache's. A recorded index URL has no credentials (app/credentials.py):
they come from the URL the user configured, when it names the same index, or from netrc.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.app import credentials
from llmgw_store.base.errors import CommandError, IntegrityError, NotFoundError, RecipeError, UsageError
from llmgw_store.base.report import say
from llmgw_store.build import interpreters
from llmgw_store.build import recipe as recipes
from llmgw_store.build import uv as uvmod
from llmgw_store.build.lockproof import proved_lock
from llmgw_store.build.make import Deadline, make_env, verify_env
from llmgw_store.build.plan import BuildPlan, check_requirements
from llmgw_store.core import locks, manifest
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.keys import store_key
from llmgw_store.core.local_store import Store
from llmgw_store.core.pathinfo import StorePathInfo

STORE = "store"
REPLACE = "replace"


@dataclass(frozen=True)
class Recorded:
    """What was recorded of a store path (its identity, the key's inputs, its content hash: `info`)
    and the lock it was installed from: enough to rebuild it and to know the result is it."""

    info: StorePathInfo
    lock: str | None = None
    lock_format: str | None = None
    what: str = ""  # how messages name it: "generation 3 of vllm (<name>)", else the name

    @property
    def shown(self) -> str:
        return self.what or self.info.name

    @property
    def rebuildable(self) -> bool:
        """A lock to install and a build table to install it with (else only a cache can bring it)."""
        return self.lock is not None and isinstance(self.info.inputs.get("build"), dict)


@dataclass(frozen=True)
class Rebuilt:
    how: str  # STORE: realise's ("built", "substituted", "waited", ...); REPLACE: "repaired"; a Path: "rebuilt"
    content_hash: str | None  # what the path now has (STORE, REPLACE); None for a scratch tree


def recorded_in_store(store: Store, row: RegisteredPath, *, need_lock: bool) -> Recorded:
    """The record of a registered path: its index row and the lock its manifest proves. Without
    `need_lock` an unproved lock is None (a repair then resolves again, and its result must still
    hash to the recorded content hash); with it, the IntegrityError of `proved_lock`."""
    name = row.name
    lock: str | None
    fmt: str | None
    try:
        lock, fmt = proved_lock(store.layout.path_of(name), name, row.content_hash)
    except IntegrityError:
        if need_lock:
            raise
        lock = fmt = None
    return Recorded(StorePathInfo.from_row(row), lock=lock, lock_format=fmt)


def plan_for(store: Store, rec: Recorded, *, uv_path: str | Path | None = None, python_preference: str | None = None,
             private: Path | None = None, offline: bool = False, index_url: str | None = None) -> BuildPlan:
    """The build plan that gives `rec` back: its recorded inputs, lock, uv and interpreter."""
    what, inputs = rec.shown, rec.info.inputs
    if not isinstance(inputs, dict) or not isinstance(inputs.get("build"), dict):
        tool = inputs.get("tool") if isinstance(inputs, dict) else None
        if tool:
            raise UsageError(f"{what} was not built from a recipe ({tool}); remove it and let the store make it again")
        raise IntegrityError(f"the record of {what} does not say how to rebuild it (no build table); pull it with "
                             "--substituter instead")
    if store_key(inputs) != rec.info.key:
        raise IntegrityError(f"the recorded inputs of {what} do not hash to its key {rec.info.key}; they are not used")
    origin = f"the record of {what}"
    try:
        engine = {k: inputs[k] for k in ("pypi", "binary", "repo") if inputs.get(k)}
        recipes.parse({"engine": {"name": inputs["engine"], **engine}, "build": [inputs["build"]]}, origin)
        index_url_recorded, uv_version, want = inputs["index_url"], inputs["uv"], inputs["python"]
        request, implementation, version = want["request"], want["implementation"], want["version"]
    except RecipeError as exc:
        raise IntegrityError(f"{origin} holds a build table no recipe could have ({exc})") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{origin} does not say how to rebuild it (missing {exc}); pull it with "
                             "--substituter instead") from None
    if uv_path is None and uv_version != uvmod.UV_VERSION:
        raise UsageError(f"rebuilding {what} needs uv {uv_version}, and the store's own is {uvmod.UV_VERSION}: "
                         f"pass --uv PATH to a uv {uv_version}")
    auth = credentials.for_index(index_url_recorded, index_url)
    uv = uvmod.resolve(store, uv_path, index_url_recorded, auth=auth)
    assert isinstance(uv, uvmod.UvTool), "resolve waits for an --uv's version unless asked to answer later"
    if uv.version != uv_version:
        raise UsageError(f"rebuilding {what} needs uv {uv_version}, not {uv.version}: pass --uv PATH to a uv {uv_version}")
    interp = interpreters.find(store, uv, request, python_preference or interpreters.DEFAULT_PREFERENCE)
    if (interp.implementation, interp.version) != (implementation, version):
        raise NotFoundError(f"rebuilding {what} needs {implementation} {version}; found "
                            f"{interp.implementation} {interp.version}")
    info = rec.info
    if info.version is None:
        raise NotFoundError(f"rebuilding {what} needs the engine version its record lacks")
    return BuildPlan(
        key=info.key, name=info.name, inputs=inputs, version=info.version, fields=inputs["build"], uv=uv,
        interpreter=interp, index_url=index_url_recorded,
        meta={"engine": info.engine, "version": info.version, "variant": info.variant, "binary": inputs.get("binary")},
        origin=origin, lock_text=rec.lock, offline=offline, index_auth=auth,
        uv_cache=private / "uv" if private else None, pyc_cache=private / "pyc" if private else None,
    )


def rebuild(store: Store, rec: Recorded, into: str | Path, *, uv_path: str | Path | None = None,
            python_preference: str | None = None, private: Path | None = None, offline: bool = False,
            online_fallback: bool = False, index_url: str | None = None,
            lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S,
            substitute: Callable[[], bool] | None = None) -> Rebuilt:
    """Rebuild `rec` into STORE (the absent store path; `substitute` is asked first, under the
    key's lock), REPLACE (the damaged one) or a scratch directory. `offline`: uv reads only its
    cache; with `online_fallback` a failed offline install is tried once more from the recorded
    index, with the same locked hashes. `private`: a directory for private uv and bytecode caches
    (the caller removes it)."""
    from llmgw_store.build.realise import realise, replace
    from llmgw_store.system.trees import freeze

    plan = plan_for(store, rec, uv_path=uv_path, python_preference=python_preference, private=private,
                    offline=offline, index_url=index_url)
    if isinstance(into, Path):
        make_env(store, plan, into, Deadline(plan))
        freeze(into)
        return Rebuilt("rebuilt", None)
    if into == REPLACE:
        deadline = Deadline(plan)
        info = replace(store, plan.key, plan.name, plan.inputs, plan.meta,
                      lambda partial: make_env(store, plan, partial, deadline),
                      expect=rec.info.content_hash, verify=lambda tree: verify_env(store, plan, tree, deadline),
                      lock_timeout=lock_timeout)
        return Rebuilt("repaired", info.content_hash)
    if into != STORE:
        raise ValueError(f"rebuild into {into!r}")

    def expect(tree: Path) -> None:
        # Runs on the frozen tree before it is registered (realise's verify step): the tree must
        # hash to the recorded content hash, or it never becomes a store path. The hash got is not
        # in the one line (a forger of records would need it); -v shows it.
        got = manifest.content_hash(manifest.scan(tree))
        if got != rec.info.content_hash:
            err = IntegrityError(f"the rebuild of {rec.shown} gives a content hash other than the recorded one; "
                                 "it is not registered and nothing switched (-v shows both)")
            err.output_tail = f"rebuilt: {got}\nrecorded: {rec.info.content_hash}"
            raise err

    def attempt(p: BuildPlan) -> str:
        deadline = Deadline(p)

        def verify(tree: Path) -> None:
            verify_env(store, p, tree, deadline)
            expect(tree)

        return realise(
            store, p.key, p.name, p.inputs, p.meta,
            lambda partial: make_env(store, p, partial, deadline),
            verify=verify,
            lock_timeout=lock_timeout, check=lambda: check_requirements(p), substitute=substitute,
        )[1]

    try:
        how = attempt(plan)
    except CommandError as exc:
        if not (offline and online_fallback):
            raise
        # uv's cache lacks a file the lock names: the recorded index, still the same hashes.
        say(f"offline rebuild failed ({exc}); trying again with {plan.index_url}")
        how = attempt(dataclasses.replace(plan, offline=False))
    return Rebuilt(how, rec.info.content_hash)
