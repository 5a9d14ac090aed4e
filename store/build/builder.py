"""`build`: from a recipe to a registered store path.

The key is computed first, from facts that are memoised in the index (the uv version, the
interpreter, the latest version, the publication time), so a build whose key is already in the
store reads the recipe and the index and returns, asking the network nothing.
Only a miss validates requirements, resolves and installs; see realise.py for the locking.
What decides the key is build/plan.py; making the environment from a plan is build/make.py; this
module ties them to realise and the substituter, and to the build memo.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmgw_store.app import credentials, network
from llmgw_store.app.results import document
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import CacheMiss, StoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.base.text import shown
from llmgw_store.build import bytecode, interpreters, wheelhome
from llmgw_store.build import recipe as recipes
from llmgw_store.build.make import Deadline, make_env, verify_env
from llmgw_store.build.memo import MAX_RECIPE_BYTES
from llmgw_store.build.plan import LATEST_TTL_S, BuildOptions, BuildPlan, check_requirements, plan_build
from llmgw_store.build.realise import realise
from llmgw_store.build.recipe import Build, Recipe, past_time
from llmgw_store.core import footprint
from llmgw_store.core.local_store import Store
from llmgw_store.core.oplog import recorded


class Substituter(Protocol):
    """Something that can put a store path in place instead of building it (a binary cache).
    Called with the key's lock held; returns True once the path is registered, False to build.
    `urls` names the caches it asks (a substitute-only miss names them)."""

    urls: tuple[str, ...]

    def substitute(self, store: Store, key: str, name: str) -> bool: ...

    def refusal(self, key: str, name: str, inputs: dict[str, Any] | None = None) -> StoreError:
        """After substitute() returned False: the typed error saying why (base/errors.py's
        NotSubstituted family, or the node's own failure)."""


NO_CACHE = "--substitute-only needs a binary cache to pull from: pass --substituter URL (and --trusted-key)"


def substitution(substituter: Substituter | None, store: Store, key: str, name: str, *,
                 only: bool = False, inputs: dict[str, Any] | None = None) -> Callable[[], bool] | None:
    """What realise asks before it builds `key`: the substituter, and with `only` (--substitute-only)
    no substitute is the substituter's `refusal` (its cause: miss, unreachable, untrusted, damaged;
    `inputs`, the key's, explain a miss) instead of a build. It runs under the key's lock, before a
    `.partial` or a build-log row exists, so a refused build leaves nothing behind. The one place
    that decides "pull, else build" (build, activate RECIPE, cold rollback)."""
    if substituter is None:
        if only:
            raise UsageError(NO_CACHE)
        return None

    def substitute() -> bool:
        if substituter.substitute(store, key, name):
            return True
        if only:
            refusal = getattr(substituter, "refusal", None)
            if refusal is not None:
                raise refusal(key, name, inputs)
            asked = ", ".join(credentials.public_url(u) for u in getattr(substituter, "urls", ())) or "none"
            raise CacheMiss(f"--substitute-only: no binary cache has {name} (key {key}; asked: {asked}); "
                            "nothing was built: push it from a builder, or drop --substitute-only to build here")
        return False

    return substitute


@dataclass(frozen=True)
class BuildResult:
    path: Path
    name: str
    key: str
    engine: str
    version: str
    variant: str
    as_of: str
    uv: str
    python: str
    how: str  # "hit", "waited" (another process built it), "recovered" (re-registered), "substituted" or "built"
    seconds: float  # the whole build, planning included: the same figure as the summary line
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step of a build that ran
    # The key's inputs (as `info` records them): in the document under -v --json only (the build
    # memo's answer, which has none, is the document otherwise).
    inputs: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def cache_hit(self) -> bool:
        return self.how != "built"

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields.pop("inputs")
        fields["uv_version"] = fields.pop("uv")  # one name per concept across commands (docs/json.md)
        return document({**fields, "path": str(self.path), "cache_hit": self.cache_hit})


@recorded("build")
def build(
    recipe_file: str | Path,
    options: BuildOptions = BuildOptions(),
    *,
    root: str | Path | None = None,
    substituter: Substituter | None = None,
) -> BuildResult:
    """Build the recipe into the store, or find it there. `substituter` (a binary cache, from the
    cache layer) is asked for the key under its lock before anything is built; with
    `options.substitute_only` it is the only way the path may come (nothing is built), and with
    `options.offline` nothing but file:// caches is reached (app/network.py)."""
    with network.offline(options.offline):
        return _build(recipe_file, options, root, substituter)


def _build(recipe_file: str | Path, options: BuildOptions, root: str | Path | None,
           substituter: Substituter | None) -> BuildResult:
    started = time.monotonic()
    memo = _memo_key(recipe_file, options)
    recipe = recipes.load(recipe_file)
    if options.variant is None and len(recipe.builds) > 1:
        from llmgw_store.build import gpu

        chosen, why = gpu.choose(recipe, None, gpu.probe_host())
        say(f"chose build {chosen.variant!r}: {why}")
        memo = None  # the choice follows the host's GPUs, which the memo key does not hold
    else:
        chosen = recipe.build_for(options.variant)
    if options.as_of is not None:
        past_time(options.as_of)  # a bad --as-of is a usage error before the store is touched
    if options.version is not None and not recipes.VERSION_RE.fullmatch(options.version):
        raise UsageError(f"--version {shown(options.version)} is not a version")
    if options.substitute_only and substituter is None:
        raise UsageError(NO_CACHE)  # before the store is touched: a node with no cache cannot pull
    if options.python is not None:
        chosen.with_python(options.python)  # a bad --python is a usage error before the store is touched
        memo = None  # the memo key (and the fast path that reads it) holds no --python
    steps: dict[str, float] = {}
    with Store.open(root, options.lock_timeout, create=True) as store:
        plan = plan_build(store, recipe, chosen, options)
        steps["plan"] = round(time.monotonic() - started, 3)
        deadline = Deadline(plan)
        links = bytecode.links_file(store.layout.tmp, plan.key)
        try:
            for attempt in (1, 2):
                try:
                    path, how = realise(
                        store, plan.key, plan.name, plan.inputs, plan.meta,
                        lambda partial: make_env(store, plan, partial, deadline, steps),
                        verify=lambda tree: verify_env(store, plan, tree, deadline),
                        lock_timeout=options.lock_timeout,
                        check=lambda: check_requirements(plan),
                        substitute=substitution(substituter, store, plan.key, plan.name,
                                                only=options.substitute_only, inputs=plan.inputs),
                    )
                    break
                except wheelhome.DamagedWheel as exc:
                    if attempt == 2:
                        raise
                    # The damaged entry is out of the wheel home: a second try unpacks that wheel again.
                    say(f"{exc}; building again")
            if how == "built" and bytecode.link_cache(store.layout.pyc_cache, path, links):
                footprint.remember(store.index, path.name, path)  # its pycs have the cache's links now
        finally:
            links.unlink(missing_ok=True)
        inputs = plan.inputs
        seconds = round(time.monotonic() - started, 3)
        if how == "built":
            interpreters.warn_if_private(store.layout, path)  # a store others read, an env they cannot run
            # One figure for the whole build, the same as the result's `seconds`; what make_env
            # did not time is freezing, hashing, verifying and registering.
            steps["hash, verify, register"] = round(max(0.0, seconds - sum(steps.values())), 3)
            row = store.index.path_by_key(plan.key)
            say(f"built {plan.name} in {seconds:.1f}s ({human_size(row.size if row else 0)}, {row.files if row else 0} files; "
                + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items()) + ")")
        result = BuildResult(
            path=path, name=plan.name, key=plan.key, engine=recipe.name, version=plan.version,
            variant=chosen.variant, as_of=inputs["as_of"], uv=inputs["uv"],
            python=inputs["python"]["version"], how=how, seconds=seconds, steps=steps, inputs=inputs,
        )
        if memo is not None:
            _remember(store, memo, result, plan, recipe, chosen, options)
        return result


def _memo_key(recipe_file: str | Path, options: BuildOptions) -> tuple[str, bytes] | None:
    """(memo key, recipe bytes) for the build memo (build/memo.py), or None when this build's
    result cannot be told from the recipe and options alone (a non-default latest TTL)."""
    from llmgw_store.build import memo as buildmemo

    if options.latest_ttl != LATEST_TTL_S:
        return None
    try:
        with open(recipe_file, "rb") as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
    except OSError:
        return None  # recipes.load says why
    if len(data) > MAX_RECIPE_BYTES:
        return None
    return buildmemo.memo_key(str(recipe_file), data, {k: getattr(options, k) for k in buildmemo.KEY_OPTIONS}), data


def _remember(store: Store, memo: tuple[str, bytes], result: BuildResult, plan: BuildPlan, recipe: Recipe,
              chosen: Build, options: BuildOptions) -> None:
    """Write the build memo entry that lets the next identical `build` answer before loading the CLI:
    only if the recipe's bytes are still those the key was computed from."""
    from llmgw_store.build import memo as buildmemo

    digest, data = memo
    try:
        with open(recipe.file, "rb") as f:
            if f.read(MAX_RECIPE_BYTES + 1) != data:
                return
    except OSError:
        return
    expires = 0.0
    if (not options.version and not chosen.fields.get("version") and options.as_of is None
            and "as_of" not in chosen.fields):  # the version came from "latest", as of now
        fetched = store.index.latest_fetched(plan.index_url, recipe.pypi)
        if fetched is None:
            return
        expires = fetched + options.latest_ttl
    fields = {f: str(getattr(result, f)) for f in buildmemo.FIELDS}
    buildmemo.write(str(store.layout.root), digest, fields, [str(plan.uv.path), plan.interpreter.path], expires)


