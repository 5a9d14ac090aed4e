"""What the commands do, composed across layers: the one place that may call every layer.

The layers below never reach up (see docs/architecture.md): the builder does not know binary
caches (it asks a `Substituter`), profiles do not build (activating a recipe is build, then
activate, here), push takes store path names (turning PROFILE, PROFILE@N, keys and paths into
names is the roots layer's job, called here).

Each function imports the layers it runs when it runs: a cache-hit `build` or an `activate` of a
store path is a hot path (start-up is most of its time), and must not load binary caches, or the
builder, that it does not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.core import locks

if TYPE_CHECKING:
    from llmgw_store.build.builder import BuildOptions, BuildResult
    from llmgw_store.cache.push import PushResult
    from llmgw_store.roots.profiles import Switch
    from llmgw_store.roots.records import Record


def build(recipe: str | Path, options: BuildOptions | None = None, *, substituters: tuple[str, ...] = (),
          trusted_keys: tuple[str, ...] = (), root: str | Path | None = None) -> BuildResult:
    """Build a recipe, asking the binary caches `substituters` (signed by `trusted_keys`) first."""
    from llmgw_store.build.builder import BuildOptions
    from llmgw_store.build.builder import build as build_recipe

    substituter = None
    if substituters:
        from llmgw_store.cache.pull import CacheSubstituter

        substituter = CacheSubstituter(substituters, trusted_keys)
    return build_recipe(recipe, options or BuildOptions(), root=root, substituter=substituter)


def activate(profile: str, target: str | Path, options: BuildOptions | None = None, *,
             substituters: tuple[str, ...] = (), trusted_keys: tuple[str, ...] = (),
             root: str | Path | None = None, lock_timeout: float = locks.LOCK_TIMEOUT_S,
             **guard) -> Switch:
    """Make TARGET (a store path, name, key, PROFILE@N, or a recipe built first with `options`) the
    profile's current generation, waiting at most `lock_timeout` for the profile's lock. `guard`:
    check, no_check, check_timeout, then_check, keep_records (see roots.profiles.activate)."""
    from llmgw_store.core.names import check_profile
    from llmgw_store.roots import profiles

    check_profile(profile)
    if str(target).endswith(".toml"):
        target = build(target, options, substituters=substituters, trusted_keys=trusted_keys, root=root).path
    return profiles.activate(profile, target, root=root, lock_timeout=lock_timeout, **guard)


def push(targets: list[str], to: str, secret_key: str, *, root: str | Path | None = None,
         format: int = 2, lock_timeout: float | None = None) -> PushResult:
    """Push store paths given as PROFILE, PROFILE@N, a store name, a key or a path (object `format`
    2: shared blobs; 1: one archive)."""
    from llmgw_store.cache.push import push as push_names
    from llmgw_store.core.local_store import Store
    from llmgw_store.roots.resolve import reference

    with Store.open(root) as store:
        names = [reference(store, t)["name"] for t in targets]
    extra = {} if lock_timeout is None else {"lock_timeout": lock_timeout}
    return push_names(names, to, secret_key, root=root, format=format, **extra)


def push_roots(to: str, secret_key: str, *, node: str | None = None, root: str | Path | None = None):
    """Publish this node's roots to the binary cache `to` (cache/cache_gc.py): the keys of every
    store path its roots hold — profiles' generations, pins, paths in use or in flight, as the local
    gc sees them (roots/gc.py) — and what those reference, signed with `secret_key`."""
    from llmgw_store.cache.cache_gc import push_roots as publish
    from llmgw_store.core.keys import key_of_name
    from llmgw_store.core.local_store import Store
    from llmgw_store.roots.gc import held_names, roots

    with Store.open(root) as store:
        held = held_names(roots(store))
        names = store.index.closure(held)
    return publish([k for k in (key_of_name(n) for n in names) if k], to, secret_key, node)


def cache_gc(url: str, keep_from: list[str], *, grace: str = "1d", dry_run: bool = False,
             allow_no_roots: bool = False):
    """Delete what no published root holds from the binary cache `url` (cache/cache_gc.py)."""
    from llmgw_store.cache.cache_gc import gc
    from llmgw_store.core.units import parse_duration

    return gc(url, keep_from, grace=parse_duration(grace), dry_run=dry_run, allow_no_roots=allow_no_roots)


def rollback(profile: str, *, to: int | None = None, substituters: tuple[str, ...] = (),
             trusted_keys: tuple[str, ...] = (), uv: str | Path | None = None, python_preference: str | None = None,
             root: str | Path | None = None, lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S) -> Switch:
    """Switch PROFILE to generation `to` (default: the previous one). A cold generation (deleted, its
    store path gone to gc) comes back from its record first: pulled from `substituters` (signed by
    `trusted_keys`), else rebuilt from its recorded lock, offline from uv's cache when it can be,
    then from the recorded index, with the recorded uv and interpreter; either way the path must
    have the recorded key and content hash before the profile switches (IntegrityError otherwise,
    and nothing switched)."""
    from dataclasses import replace

    from llmgw_store.roots import profiles

    if to is not None:
        rec = profiles.cold_record(profile, to, root=root, lock_timeout=lock_timeout)
        if rec is not None:
            how = _realise_record(rec, substituters, trusted_keys, uv, python_preference, root, lock_timeout)
            switched = profiles.rollback(profile, to=to, root=root, lock_timeout=lock_timeout, record=rec)
            return replace(switched, rebuilt=None if how == "hit" else how)  # "hit": it was still there
    return profiles.rollback(profile, to=to, root=root, lock_timeout=lock_timeout)


def _realise_record(rec: Record, substituters: tuple[str, ...], trusted_keys: tuple[str, ...], uv_path,
                    python_preference: str | None, root, lock_timeout: float) -> str:
    """Put the store path a generation record names back in the store; returns how ("built",
    "substituted", or "hit" when another process brought it back meanwhile). The record was checked
    when read (records.load: names, key recomputed from the inputs, lock digest, document digest);
    its build table is checked again here as a recipe's would be. A tree built here is compared
    with the recorded content hash before it is registered: a rebuild that gives other bytes never
    becomes a store path. A pulled path is checked by the cache layer (signature, key, listing),
    then against the record."""
    from dataclasses import replace

    from llmgw_store.build import builder, interpreters
    from llmgw_store.build import recipe as recipes
    from llmgw_store.build import uv as uvmod
    from llmgw_store.build.realise import realise
    from llmgw_store.core import manifest
    from llmgw_store.core.errors import CommandError, IntegrityError, NotFoundError, RecipeError, UsageError
    from llmgw_store.core.local_store import Store
    from llmgw_store.core.report import say

    what = f"generation {rec.generation} of {rec.profile} ({rec.name})"
    with Store.open(root, lock_timeout, readonly=True) as store:
        # Only the link went: the recorded path is still here, registered with the recorded key and
        # content hash. Nothing to bring back (profiles.rollback checks it again under its locks).
        row = store.index.path_by_name(rec.name)
        if row is not None and row["key"] == rec.key and row["content_hash"] == rec.content_hash \
                and store.layout.path_of(rec.name).is_dir():
            say(f"{what}: its store path is still there, as recorded")
            return "hit"
    substituter = None
    if substituters:
        from llmgw_store.cache.pull import CacheSubstituter

        substituter = CacheSubstituter(substituters, trusted_keys)
    inputs = rec.inputs
    rebuildable = rec.lock is not None and isinstance(inputs.get("build"), dict)
    if not rebuildable and substituter is None:
        raise NotFoundError(f"{what} is cold and its record holds no lock to rebuild it from: pass --substituter "
                            "(and --trusted-key) to pull it from a binary cache")
    meta = {"engine": rec.engine, "version": rec.version, "variant": rec.variant, "binary": inputs.get("binary")}
    substitute = (lambda: substituter.substitute(store, rec.key, rec.name)) if substituter else None
    with Store.open(root, lock_timeout) as store:
        if not rebuildable:
            def nothing_to_build(partial):
                raise NotFoundError(f"no binary cache given has {rec.name}, and its record holds no lock to rebuild "
                                    "it from")

            say(f"{what} is cold: pulling it")
            _, how = realise(store, rec.key, rec.name, inputs, meta, nothing_to_build, lock_timeout=lock_timeout,
                             substitute=substitute)
        else:
            origin = f"the record of {what}"
            try:
                engine = {k: inputs[k] for k in ("pypi", "binary", "repo") if inputs.get(k)}
                recipes.parse({"engine": {"name": inputs["engine"], **engine}, "build": [inputs["build"]]}, origin)
                if uv_path is None and inputs["uv"] != uvmod.UV_VERSION:
                    raise UsageError(f"rebuilding {what} needs uv {inputs['uv']}, and the store's own is "
                                     f"{uvmod.UV_VERSION}: pass --uv PATH to a uv {inputs['uv']}")
                uv = uvmod.resolve(store, uv_path, inputs["index_url"])
                if uv.version != inputs["uv"]:
                    raise UsageError(f"rebuilding {what} needs uv {inputs['uv']}, not {uv.version}: pass --uv PATH to "
                                     f"a uv {inputs['uv']}")
                want = inputs["python"]
                interp = interpreters.find(store, uv, want["request"],
                                           python_preference or interpreters.DEFAULT_PREFERENCE)
                if (interp.implementation, interp.version) != (want["implementation"], want["version"]):
                    raise NotFoundError(f"rebuilding {what} needs {want['implementation']} {want['version']}; found "
                                        f"{interp.implementation} {interp.version}")
                plan = builder.BuildPlan(
                    key=rec.key, name=rec.name, inputs=inputs, version=rec.version, fields=inputs["build"], uv=uv,
                    interpreter=interp, index_url=inputs["index_url"], meta=meta, origin=origin,
                    lock_text=rec.lock, offline=True,
                )
            except RecipeError as exc:
                raise IntegrityError(f"{origin} holds a build table no recipe could have ({exc})") from None
            except (KeyError, TypeError, AttributeError) as exc:
                raise IntegrityError(f"{origin} does not say how to rebuild it (missing {exc}); pull it with "
                                     "--substituter instead") from None

            def expect(tree) -> None:
                # Runs on the frozen tree before it is registered (realise's verify step): the tree
                # must hash to the recorded content hash, or it never becomes a store path.
                # The hash got is not in the one line (a forger of records would need it); -v shows it.
                got = manifest.content_hash(manifest.scan(tree))
                if got != rec.content_hash:
                    err = IntegrityError(f"the rebuild of {what} gives a content hash other than the recorded one; "
                                         "it is not registered and nothing switched (-v shows both)")
                    err.output_tail = f"rebuilt: {got}\nrecorded: {rec.content_hash}"
                    raise err

            def attempt(p: builder.BuildPlan) -> str:
                deadline = builder.Deadline(p)
                return realise(
                    store, p.key, p.name, p.inputs, p.meta,
                    lambda partial: builder.make_env(store, p, partial, deadline),
                    verify=lambda tree: (builder.verify_env(store, p, tree, deadline), expect(tree)),
                    lock_timeout=lock_timeout, check=lambda: builder.check_requirements(p), substitute=substitute,
                )[1]

            say(f"{what} is cold: bringing it back from its record ({rec.lock_format}, hashes as recorded)")
            try:
                how = attempt(plan)  # offline: uv's cache and the locked hashes, no index asked
            except CommandError as exc:
                # uv's cache lacks a file the lock names: the recorded index, still the same hashes.
                say(f"offline rebuild failed ({exc}); trying again with {inputs['index_url']}")
                how = attempt(replace(plan, offline=False))
        row = store.index.path_by_name(rec.name)
        if row is None or row["key"] != rec.key or row["content_hash"] != rec.content_hash:
            err = IntegrityError(f"{rec.name} came back with a content hash other than the one {what} recorded; "
                                 f"nothing switched (`llmgw-store verify {rec.name}`; -v shows both)")
            err.output_tail = f"in the store: {row['content_hash'] if row else 'nothing'}\nrecorded: {rec.content_hash}"
            raise err
        say(f"{rec.name}: back in the store ({how}), content hash {rec.content_hash[:16]}… as recorded")
        return how
