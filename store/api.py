"""What the commands do, composed across layers: the one place that may call every layer.

The layers below never reach up (see docs/architecture.md): the builder does not know binary
caches (it asks a `Substituter`), profiles do not build (activating a recipe is build, then
activate, here), push takes store path names (turning PROFILE, PROFILE@N, keys and paths into
names is the roots layer's job, called here).
"""

from __future__ import annotations

from pathlib import Path

from llmgw_store.build.builder import BuildOptions, BuildResult
from llmgw_store.build.builder import build as _build
from llmgw_store.cache.pull import CacheSubstituter
from llmgw_store.cache.push import PushResult
from llmgw_store.cache.push import push as _push
from llmgw_store.core.local_store import Store
from llmgw_store.core.names import check_profile
from llmgw_store.roots import profiles
from llmgw_store.roots.resolve import reference


def build(recipe: str | Path, options: BuildOptions = BuildOptions(), *, substituters: tuple[str, ...] = (),
          trusted_keys: tuple[str, ...] = (), root: str | Path | None = None) -> BuildResult:
    """Build a recipe, asking the binary caches `substituters` (signed by `trusted_keys`) first."""
    substituter = CacheSubstituter(substituters, trusted_keys) if substituters else None
    return _build(recipe, options, root=root, substituter=substituter)


def activate(profile: str, target: str | Path, options: BuildOptions = BuildOptions(), *,
             substituters: tuple[str, ...] = (), trusted_keys: tuple[str, ...] = (),
             root: str | Path | None = None) -> profiles.Switch:
    """Make TARGET (a store path, name, key, or a recipe built first) the profile's current generation."""
    check_profile(profile)
    if str(target).endswith(".toml"):
        target = build(target, options, substituters=substituters, trusted_keys=trusted_keys, root=root).path
    return profiles.activate(profile, target, root=root, lock_timeout=options.lock_timeout)


def push(targets: list[str], to: str, secret_key: str, *, root: str | Path | None = None) -> PushResult:
    """Push store paths given as PROFILE, PROFILE@N, a store name, a key or a path."""
    with Store.open(root) as store:
        names = [reference(store, t)["name"] for t in targets]
    return _push(names, to, secret_key, root=root)
