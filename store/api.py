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
    from llmgw_store.build.builder import BuildResult
    from llmgw_store.build.plan import BuildOptions
    from llmgw_store.cache.push import PushResult
    from llmgw_store.roots.profiles import Switch
    from llmgw_store.roots.records import Record


def build(recipe: str | Path, options: BuildOptions | None = None, *, substituters: tuple[str, ...] = (),
          trusted_keys: tuple[str, ...] = (), root: str | Path | None = None,
          cache_network: dict | None = None) -> BuildResult:
    """Build a recipe, asking the binary caches `substituters` (signed by `trusted_keys`) first
    (only them with `options.substitute_only`; only the file:// ones with `options.offline`).
    `cache_network`: RetryPolicy's fields (attempts, stall, ...) for talking to them."""
    from llmgw_store.app import retry
    from llmgw_store.build.builder import build as build_recipe
    from llmgw_store.build.plan import BuildOptions

    options = options or BuildOptions()
    # The index's client (build/pypi.py) runs under the same policy as the substituters.
    with retry.using(retry.RetryPolicy.from_env(**(cache_network or {}))):
        return build_recipe(recipe, options, root=root,
                            substituter=_substituter(substituters, trusted_keys, options.offline, cache_network,
                                                     options.substitute_only))


def activate(profile: str, target: str | Path, options: BuildOptions | None = None, *,
             substituters: tuple[str, ...] = (), trusted_keys: tuple[str, ...] = (),
             root: str | Path | None = None, lock_timeout: float = locks.LOCK_TIMEOUT_S,
             cache_network: dict | None = None, **guard) -> Switch:
    """Make TARGET (a store path, name, key, PROFILE@N, or a recipe built first with `options`) the
    profile's current generation, waiting at most `lock_timeout` for the profile's lock. `guard`:
    check, no_check, check_timeout, then_check, keep_records (see roots.profiles.activate)."""
    from llmgw_store.core.names import check_profile
    from llmgw_store.roots import profiles

    check_profile(profile)
    if str(target).endswith(".toml"):
        target = build(target, options, substituters=substituters, trusted_keys=trusted_keys, root=root,
                       cache_network=cache_network).path
    return profiles.activate(profile, target, root=root, lock_timeout=lock_timeout, **guard)


def push(targets: list[str], to: str, secret_key: str, *, root: str | Path | None = None,
         format: int = 2, lock_timeout: float | None = None, policy=None, rewrite_blobs: bool = False,
         drop_signatures: tuple[str, ...] = ()) -> PushResult:
    """Push store paths given as PROFILE, PROFILE@N, a store name, a key or a path (object `format`
    2: shared blobs; 1: one archive; `rewrite_blobs`: upload every blob again; `drop_signatures`:
    the keys whose signatures go, the end of a key rotation)."""
    from llmgw_store.cache.push import push as push_names
    from llmgw_store.core.local_store import Store
    from llmgw_store.roots.resolve import reference

    with Store.open(root) as store:
        names = [reference(store, t).name for t in targets]
    extra = {} if lock_timeout is None else {"lock_timeout": lock_timeout}
    return push_names(names, to, secret_key, root=root, format=format, policy=policy, rewrite_blobs=rewrite_blobs,
                      drop_signatures=tuple(drop_signatures), **extra)


def push_roots(to: str, secret_key: str, *, node: str | None = None, root: str | Path | None = None, policy=None,
               releases: dict[str, str] | None = None):
    """Publish this node's roots to the binary cache `to` (cache/cache_gc.py): the keys of every
    store path its roots hold — profiles' generations, pins, paths in use or in flight, as the local
    gc sees them (roots/gc.py) — and what those reference, and the key of every generation a
    record is kept for (a cold generation's path is gone here: the cache is its way back), signed
    with `secret_key`; and, per profile, the release it follows (`releases`: profile -> release,
    the config file's `releases` table), for `fleet`."""
    from llmgw_store.cache.cache_gc import push_roots as publish
    from llmgw_store.cache.releases import check_release_name
    from llmgw_store.core.keys import key_of_name
    from llmgw_store.core.local_store import Store
    from llmgw_store.core.names import check_profile
    from llmgw_store.roots.holds import list_holds
    from llmgw_store.roots.marking import held_names, roots
    from llmgw_store.roots.profiles import list_profiles
    from llmgw_store.roots.records import recorded_keys

    follows = {check_profile(p): check_release_name(r) for p, r in (releases or {}).items()}
    with Store.open(root) as store:
        held = held_names(roots(store))
        names = store.index.closure(held)
        recorded = recorded_keys(store.layout)
        holds = tuple(sorted(list_holds(store.layout)))
        counter = store.layout.roots_seq  # the last sequence number published (cache_gc.next_sequence)
    keys = {k for k in (key_of_name(n) for n in names) if k}
    running = {p.profile: key_of_name(Path(p.path).name) for p in list_profiles(root=root).profiles}
    return publish(sorted(keys | recorded.keys()), to, secret_key, node, counter=counter, policy=policy,
                   cold=tuple(sorted(recorded.keys() - keys)), profiles={p: k for p, k in running.items() if k},
                   releases={p: r for p, r in follows.items() if running.get(p)}, held=holds)


def cache_gc(url: str, keep_from: list[str], *, grace: str = "1d", dry_run: bool = False,
             allow_no_roots: bool = False, release_keys: list[str] | tuple[str, ...] = (), policy=None,
             root: str | Path | None = None):
    """Delete what no published root and no release pointer holds from the binary cache `url`
    (cache/cache_gc.py). The high-water marks of the roots documents and release pointers this
    host has seen there are kept in ROOT/var/seen.json (cache/seen.py)."""
    from llmgw_store.app.units import parse_duration
    from llmgw_store.cache.cache_gc import gc
    from llmgw_store.core.layout import Layout

    return gc(url, keep_from, grace=parse_duration(grace), var=Layout.at(root).var, release_keys=release_keys,
              dry_run=dry_run, allow_no_roots=allow_no_roots, policy=policy)


def rollback(profile: str, *, to: int | None = None, substituters: tuple[str, ...] = (),
             trusted_keys: tuple[str, ...] = (), uv: str | Path | None = None, python_preference: str | None = None,
             root: str | Path | None = None, lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S,
             substitute_only: bool = False, offline: bool = False, index_url: str | None = None,
             cache_network: dict | None = None) -> Switch:
    """Switch PROFILE to generation `to` (default: the previous one). A cold generation (deleted, its
    store path gone to gc) comes back from its record first: pulled from `substituters` (signed by
    `trusted_keys`), else rebuilt from its recorded lock, offline from uv's cache when it can be,
    then from the recorded index, with the recorded uv and interpreter; either way the path must
    have the recorded key and content hash before the profile switches (IntegrityError otherwise,
    and nothing switched). `substitute_only`: pulled, never rebuilt (no substitute is a NotSubstituted naming its
    cause); `offline`: no network but file:// caches, and no second try from the index. `index_url`:
    the index URL the user configured, whose credentials (if any) a rebuild sends to the recorded
    index when it is the same one."""
    from dataclasses import replace

    from llmgw_store.app import network, retry
    from llmgw_store.roots import profiles

    with network.offline(offline), retry.using(retry.RetryPolicy.from_env(**(cache_network or {}))):
        if to is not None:
            rec = profiles.cold_record(profile, to, root=root, lock_timeout=lock_timeout)
            if rec is not None:
                how = _realise_record(rec, substituters, trusted_keys, uv, python_preference, root, lock_timeout,
                                      substitute_only=substitute_only, offline=offline, index_url=index_url,
                                      cache_network=cache_network)
                switched = profiles.rollback(profile, to=to, root=root, lock_timeout=lock_timeout, record=rec)
                return replace(switched, rebuilt=None if how == "hit" else how)  # "hit": it was still there
        return profiles.rollback(profile, to=to, root=root, lock_timeout=lock_timeout)


def _substituter(substituters: tuple[str, ...], trusted_keys: tuple[str, ...], offline: bool,
                 cache_network: dict | None = None, substitute_only: bool = False):
    """The binary caches to ask, as the build layer's Substituter (None: none given). Offline, a
    cache that needs the network is passed over with one line (only file:// ones are asked); when
    that leaves none under `substitute_only`, the usage error says so."""
    if offline:
        from llmgw_store.app.credentials import public_url
        from llmgw_store.base.report import say

        passed = [public_url(u) for u in substituters if not u.startswith("file://")]
        for url in passed:
            say(f"cache {url}: passed over (--offline: file:// caches only)")
        substituters = tuple(u for u in substituters if u.startswith("file://"))
        if passed and not substituters and substitute_only:
            from llmgw_store.base.errors import UsageError

            raise UsageError(f"--substitute-only with --offline: the binary caches given ({' '.join(passed)}) were "
                             "passed over because of --offline (it asks file:// caches only): pass a file:// "
                             "--substituter, or drop --offline")
    if not substituters:
        return None
    if not trusted_keys:
        from llmgw_store.app.credentials import public_url
        from llmgw_store.base.errors import UsageError

        # Nothing a cache serves could be checked: every object would be refused and the command
        # would build (or, substitute-only, fail) as if the caches were empty.
        raise UsageError(f"binary caches given ({' '.join(public_url(u) for u in substituters)}) but no trusted "
                         "key: pass --trusted-key (config trusted_keys, LLMGW_STORE_TRUSTED_KEYS) with the "
                         "builder's public key")
    from llmgw_store.cache.backends import RetryPolicy
    from llmgw_store.cache.pull import CacheSubstituter

    return CacheSubstituter(substituters, trusted_keys, RetryPolicy.from_env(**(cache_network or {})))


def _realise_record(rec: Record, substituters: tuple[str, ...], trusted_keys: tuple[str, ...], uv_path,
                    python_preference: str | None, root, lock_timeout: float, *, substitute_only: bool = False,
                    offline: bool = False, index_url: str | None = None, cache_network: dict | None = None) -> str:
    """Put the store path a generation record names back in the store; returns how ("built",
    "substituted", or "hit" when another process brought it back meanwhile). The record was checked
    when read (records.load: names, key recomputed from the inputs, lock digest, document digest);
    the rebuild (build/rebuild.py, the one shared with repair and `build --check`) checks its build
    table again as a recipe's would be, and compares the tree with the recorded content hash
    before it is registered: a rebuild that gives other bytes never becomes a store path. A pulled
    path is checked by the cache layer (signature, key, listing), then against the record."""
    from llmgw_store.base.errors import IntegrityError, NotFoundError
    from llmgw_store.base.report import say
    from llmgw_store.build import builder, rebuild
    from llmgw_store.build.realise import realise
    from llmgw_store.core.local_store import Store

    what = f"generation {rec.generation} of {rec.profile} ({rec.name})"
    with Store.open(root, lock_timeout, readonly=True) as store:
        # Only the link went: the recorded path is still here, registered with the recorded key and
        # content hash. Nothing to bring back (profiles.rollback checks it again under its locks).
        row = store.index.path_by_name(rec.name)
        if row is not None and row.key == rec.key and row.content_hash == rec.content_hash \
                and store.layout.path_of(rec.name).is_dir():
            say(f"{what}: its store path is still there, as recorded")
            return "hit"
    substituter = _substituter(substituters, trusted_keys, offline, cache_network, substitute_only)
    recorded = rebuild.Recorded(rec.info, lock=rec.lock, lock_format=rec.lock_format, what=what)
    if not recorded.rebuildable and substituter is None:
        raise NotFoundError(f"{what} is cold and its record holds no lock to rebuild it from: pass --substituter "
                            "(and --trusted-key) to pull it from a binary cache")
    with Store.open(root, lock_timeout) as store:
        substitute = builder.substitution(substituter, store, rec.key, rec.name, only=substitute_only,
                                          inputs=rec.inputs)
        if substitute_only or not recorded.rebuildable:
            def nothing_to_build(partial):
                raise NotFoundError(f"no binary cache given has {rec.name}, and its record holds no lock to rebuild "
                                    "it from")

            say(f"{what} is cold: pulling it")
            meta = {"engine": rec.engine, "version": rec.version, "variant": rec.variant,
                    "binary": rec.inputs.get("binary")}
            _, how = realise(store, rec.key, rec.name, rec.inputs, meta, nothing_to_build, lock_timeout=lock_timeout,
                             substitute=substitute)
        else:
            say(f"{what} is cold: bringing it back from its record ({rec.lock_format}, hashes as recorded)")
            how = rebuild.rebuild(store, recorded, rebuild.STORE, uv_path=uv_path, python_preference=python_preference,
                                  offline=True, online_fallback=not offline, index_url=index_url,
                                  lock_timeout=lock_timeout, substitute=substitute).how
        row = store.index.path_by_name(rec.name)
        if row is None or row.key != rec.key or row.content_hash != rec.content_hash:
            err = IntegrityError(f"{rec.name} came back with a content hash other than the one {what} recorded; "
                                 f"nothing switched (`llmgw-store verify {rec.name}`; -v shows both)")
            err.output_tail = f"in the store: {row.content_hash if row else 'nothing'}\nrecorded: {rec.content_hash}"
            raise err
        say(f"{rec.name}: back in the store ({how}), content hash {rec.content_hash[:16]}… as recorded")
        return how


def release_set(release: str, target: str, to: str, secret_key: str, *, trusted_keys: tuple[str, ...] = (),
                root: str | Path | None = None, policy=None):
    """Point the release `release` in the cache `to` at TARGET (PROFILE, PROFILE@N, a store path, its
    name or key in this store; a key or name this store lacks is taken as the cache's metadata
    names it), signed with `secret_key` (cache/releases.py)."""
    from llmgw_store.base.errors import NotFoundError
    from llmgw_store.cache import releases
    from llmgw_store.core.keys import KEY_RE, is_store_name, key_of_name
    from llmgw_store.core.local_store import Store
    from llmgw_store.roots.resolve import reference

    with Store.open(root, create=True) as store:
        try:
            row = reference(store, target)
            point: dict[str, str | None] = {"key": row.key, "name": row.name, "engine": row.engine, "version": row.version,
                     "variant": row.variant}
        except NotFoundError:
            if KEY_RE.match(target):
                point = {"key": target, "name": None}
            elif is_store_name(target):
                point = {"key": key_of_name(target), "name": target}
            else:
                raise
        var = store.layout.var
    return releases.write(to, release, point, secret_key, trusted=trusted_keys, var=var, policy=policy)


def release_promote(source: str, dest: str, to: str, secret_key: str, *, trusted_keys: tuple[str, ...] = (),
                    root: str | Path | None = None, policy=None):
    """Point the release `dest` at what the release `source` points at in the cache `to` (the
    source pointer checked against `trusted_keys` and the signer's own key)."""
    from llmgw_store.cache import releases
    from llmgw_store.cache.signing import load_secret
    from llmgw_store.core.local_store import Store

    secret = load_secret(secret_key)
    with Store.open(root, create=True) as store:
        var = store.layout.var
    src = releases.read([to], source, (*trusted_keys, secret.public_key), var=var, policy=policy)
    point = {"key": src.key, "name": src.name, "engine": src.engine, "version": src.version, "variant": src.variant}
    return releases.write(to, dest, point, secret, trusted=trusted_keys, var=var, policy=policy)


def held_at(profile: str, *, root: str | Path | None = None):
    """The hold of `profile` (roots/holds.py), or None: a held profile does not follow its release."""
    from llmgw_store.core.layout import Layout
    from llmgw_store.core.names import check_profile
    from llmgw_store.roots import holds

    layout = Layout.at(root)
    layout.check()  # holds/ of another user's, or one others may write: refused, never believed
    return holds.held(layout, check_profile(profile))


def hold(profile: str, target: str | None = None, *, root: str | Path | None = None,
         lock_timeout: float = locks.LOCK_TIMEOUT_S, **guard):
    """Hold `profile` at `target` (default: its current generation), then, when that is not the
    current generation, activate it (`guard`: the activation's check options). Returns (Hold, Switch | None)."""
    from llmgw_store.roots import holds, profiles

    made = holds.hold(profile, target, root=root, lock_timeout=lock_timeout)
    switched = None
    if target is not None:
        switched = profiles.activate(profile, made.name, root=root, lock_timeout=lock_timeout, **guard)
    return made, switched


def activate_release(profile: str, release: str, *, substituters: tuple[str, ...] = (),
                     trusted_keys: tuple[str, ...] = (), root: str | Path | None = None,
                     lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S, cache_network: dict | None = None,
                     offline: bool = False, **guard):
    """Make what the release pointer `release` names the profile's current generation: the pointer
    read from the substituters (checked, and no older than the newest this node has seen:
    cache/releases.py), its key pulled as any pull is checked — unless this store holds it already —
    then switched to. No recipe, no key computed, no index. Returns (Switch, Release); roots.holds.Held
    (exit 0, nothing switched) when the profile is held, before anything is read or at the switch."""
    from llmgw_store.app import debug, network
    from llmgw_store.base.errors import UsageError
    from llmgw_store.cache import releases
    from llmgw_store.cache.backends import RetryPolicy
    from llmgw_store.cache.pull import pull
    from llmgw_store.core.local_store import Store
    from llmgw_store.core.names import check_profile
    from llmgw_store.roots import holds, profiles

    check_profile(profile)
    releases.check_release_name(release)
    hold = held_at(profile, root=root)
    if hold is not None:  # nothing read; checked again under the profile's lock before the switch
        raise holds.Held(hold)
    if offline:
        substituters = tuple(u for u in substituters if u.startswith("file://"))
    if not substituters:
        raise UsageError("activate --release reads the release from a binary cache: pass --substituter URL (or set "
                         "LLMGW_STORE_SUBSTITUTERS; with --offline, a file:// one)")
    policy = RetryPolicy.from_env(**(cache_network or {}))
    with network.offline(offline):
        with Store.open(root, lock_timeout, create=True) as store:
            var = store.layout.var
        pointer = releases.read(substituters, release, trusted_keys, var=var, record=True, policy=policy)
        with Store.open(root, lock_timeout) as store:
            row = store.index.path_by_key(pointer.key)
            here = row is not None and row.name == pointer.name and store.layout.path_of(row.name).is_dir()
        if not here:
            pull(pointer.name, list(substituters), list(trusted_keys), root=root, lock_timeout=lock_timeout,
                 policy=policy)
        debug.pause("RELEASE_BEFORE_SWITCH")  # the pointer read, its path here; the profile not yet switched
        switched = profiles.activate(profile, pointer.name, root=root, lock_timeout=lock_timeout, unless_held=True,
                                     **guard)
    return switched, pointer
