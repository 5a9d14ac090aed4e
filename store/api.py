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
             root: str | Path | None = None, lock_timeout: float = locks.LOCK_TIMEOUT_S) -> Switch:
    """Make TARGET (a store path, name, key, PROFILE@N, or a recipe built first with `options`) the
    profile's current generation, waiting at most `lock_timeout` for the profile's lock."""
    from llmgw_store.core.names import check_profile
    from llmgw_store.roots import profiles

    check_profile(profile)
    if str(target).endswith(".toml"):
        target = build(target, options, substituters=substituters, trusted_keys=trusted_keys, root=root).path
    return profiles.activate(profile, target, root=root, lock_timeout=lock_timeout)


def push(targets: list[str], to: str, secret_key: str, *, root: str | Path | None = None,
         format: int = 2) -> PushResult:
    """Push store paths given as PROFILE, PROFILE@N, a store name, a key or a path (object `format`
    2: shared blobs; 1: one archive)."""
    from llmgw_store.cache.push import push as push_names
    from llmgw_store.core.local_store import Store
    from llmgw_store.roots.resolve import reference

    with Store.open(root) as store:
        names = [reference(store, t)["name"] for t in targets]
    return push_names(names, to, secret_key, root=root, format=format)


def push_roots(to: str, secret_key: str, *, node: str | None = None, root: str | Path | None = None):
    """Publish this node's roots to the binary cache `to` (cache/cache_gc.py): the keys of every
    store path its roots hold — profiles' generations, pins, paths in use or in flight, as the local
    gc sees them (roots/gc.py) — and what those reference, signed with `secret_key`."""
    from llmgw_store.cache.cache_gc import push_roots as publish
    from llmgw_store.core.keys import key_of_name
    from llmgw_store.core.local_store import Store
    from llmgw_store.roots.gc import roots

    with Store.open(root) as store:
        held = {name for names in roots(store).values() for name in names}
        names = store.index.closure(held)
    return publish([k for k in (key_of_name(n) for n in names) if k], to, secret_key, node)


def cache_gc(url: str, keep_from: list[str], *, grace: str = "1d", dry_run: bool = False,
             allow_no_roots: bool = False):
    """Delete what no published root holds from the binary cache `url` (cache/cache_gc.py)."""
    from llmgw_store.cache.cache_gc import gc
    from llmgw_store.core.units import parse_duration

    return gc(url, keep_from, grace=parse_duration(grace), dry_run=dry_run, allow_no_roots=allow_no_roots)
