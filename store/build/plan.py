"""Planning a build: what decides its result (the recipe's build, the options, the facts the
index memoises: uv's version, the interpreter, the latest version, the publication time), and the
key and name that follow from it. Nothing here writes the environment; a plan is frozen once made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.app import credentials, network
from llmgw_store.app.credentials import IndexAuth
from llmgw_store.base import defaults
from llmgw_store.base.errors import RecipeError, UsageError
from llmgw_store.base.report import say
from llmgw_store.build import interpreters
from llmgw_store.build import recipe as recipes
from llmgw_store.build import uv as uvmod
from llmgw_store.build.realise import DEFAULT_LOCK_TIMEOUT_S
from llmgw_store.build.recipe import ONE_DAY, Build, Recipe, format_time, parse_time, past_time
from llmgw_store.core.keys import SCHEMA_VERSION, path_name, store_key
from llmgw_store.core.local_store import Store
from llmgw_store.system.host import platform_facts

PYPI_SIMPLE = defaults.PYPI_SIMPLE
LATEST_TTL_S = 3600.0  # like Nix's tarball-ttl: "latest" is asked again at most once an hour


@dataclass(frozen=True)
class BuildOptions:
    version: str | None = None
    variant: str | None = None
    as_of: str | None = None
    index_url: str = field(default=PYPI_SIMPLE, repr=False)  # may carry a token: never shown
    uv: str | Path | None = None
    python_preference: str = interpreters.DEFAULT_PREFERENCE
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S
    latest_ttl: float = LATEST_TTL_S
    # --substitute-only: pull from the substituters, never build (no substitute: a NotSubstituted, by cause).
    substitute_only: bool = False
    # --offline: no network but file:// caches (app/network.py); uv runs with UV_OFFLINE.
    offline: bool = False
    python: str | None = None  # `--python`: in place of the recipe's build.python, entering the key as it would


@dataclass(frozen=True)
class BuildPlan:
    """Everything that decides a build's result, and the key and name that follow from it.
    Frozen: once the key is computed from `inputs`, nothing the build does may change them."""

    key: str
    name: str
    inputs: dict[str, Any]
    version: str
    fields: dict[str, Any]
    uv: uvmod.UvTool
    interpreter: interpreters.Interpreter
    index_url: str
    meta: dict[str, Any]
    origin: str
    build_index: int = 0
    lock_text: str | None = None  # install exactly this lock (a repair) instead of resolving
    uv_cache: Path | None = None  # a private uv cache (a repair) instead of the store's
    pyc_cache: Path | None = None  # a private bytecode cache (a repair) instead of the store's
    offline: bool = False  # uv reads only its cache (a cold generation rebuilt from its recorded lock)
    # The credentials of `index_url` (which never holds any): given to uv in its environment and
    # to the store's own index queries, never recorded (app/credentials.py).
    index_auth: IndexAuth | None = field(default=None, repr=False, compare=False)


def plan_build(store: Store, recipe: Recipe, chosen: Build, options: BuildOptions) -> BuildPlan:
    """Everything that decides the result, and the key and name that follow from it (for `build`,
    and for `build --check`)."""
    chosen = chosen.with_python(options.python)
    # The key, the memo tables and every message take the URL without its userinfo; the token
    # (if any) travels beside it as `auth`, to uv's environment and to httpx only.
    auth = credentials.auth_of(options.index_url)
    index_url = credentials.public_url(options.index_url).rstrip("/")
    # A fresh store asks uv its version, asks the index (the latest version, a publication time)
    # and finds an interpreter: independent waits, so the first two run in threads meanwhile.
    # A substitute-only command never builds, so it never installs the store's own uv either.
    pending = uvmod.resolve(store, options.uv, index_url, later=True, auth=auth, install=not options.substitute_only)
    files = _prefetch(store, recipe, chosen, options, index_url, auth)
    interp = None
    if (files is not None or getattr(pending, "pending", False)) and "{" not in chosen.fields["python"]:
        try:
            interp = interpreters.find(store, pending, chosen.fields["python"], options.python_preference,
                                       downloads=not options.substitute_only)
        except Exception:
            if isinstance(pending, uvmod.PendingUv):
                pending.tool()  # an --uv that is not uv is the error to report, not what it "found"
            raise
    uv = pending.tool() if isinstance(pending, uvmod.PendingUv) else pending
    fixed_as_of = format_time(past_time(options.as_of)) if options.as_of is not None else chosen.fields.get("as_of")
    version = (options.version or chosen.fields.get("version")
               or (_latest_as_of(store, recipe, index_url, fixed_as_of, files, auth) if fixed_as_of
                   else _latest(store, recipe, index_url, options, files, auth)))
    if not recipes.VERSION_RE.fullmatch(version):
        raise UsageError(f"{version!r} is not a version")
    fields = chosen.resolved(version)
    if options.as_of is not None:
        as_of = format_time(past_time(options.as_of))
    elif "as_of" in fields:
        as_of = fields["as_of"]
    else:
        as_of = _published_plus_a_day(store, recipe, version, index_url, files, auth)
    if interp is None or fields["python"] != chosen.fields["python"]:
        interp = interpreters.find(store, uv, fields["python"], options.python_preference,
                                   downloads=not options.substitute_only)
    inputs = {
        "schema": SCHEMA_VERSION,
        "engine": recipe.name,
        "pypi": recipe.pypi,
        "binary": recipe.binary,
        "repo": recipe.engine.get("repo"),
        "version": version,
        "variant": chosen.variant,
        "build": fields,
        "as_of": as_of,
        "index_url": index_url,
        "uv": uv.version,
        "python": interp.key_facts(fields["python"]),
        "platform": platform_facts(),
    }
    key = store_key(inputs)
    return BuildPlan(
        key=key, name=path_name(key, recipe.name, version, chosen.variant), inputs=inputs, version=version,
        fields=fields, uv=uv, interpreter=interp, index_url=index_url,
        meta={"engine": recipe.name, "version": version, "variant": chosen.variant, "binary": recipe.binary},
        origin=str(recipe.file), build_index=chosen.index, offline=options.offline, index_auth=auth,
    )


def _prefetch(store: Store, recipe: Recipe, chosen: Build, options: BuildOptions, index_url: str,
              auth: IndexAuth | None = None):
    """The project's file list, asked in a thread (a Future), when planning will need it: the latest
    version is not remembered, or the publication time of a known version is not. Else None.
    The thread only reads the network; the index (one SQLite connection, this thread's) is written
    by the caller once the answer is in."""
    fixed = options.version or chosen.fields.get("version")
    if fixed:
        if (options.as_of is not None or "as_of" in chosen.fields or not recipes.VERSION_RE.fullmatch(fixed)
                or store.index.published(index_url, recipe.pypi, fixed) is not None):
            return None
        asking = f"when {recipe.pypi} {fixed} was published"
    elif options.as_of is not None or "as_of" in chosen.fields:
        as_of = format_time(past_time(options.as_of)) if options.as_of is not None else chosen.fields["as_of"]
        if store.index.latest(index_url, f"{recipe.pypi}@{as_of}", float("inf")) is not None:
            return None
        asking = f"for the latest release of {recipe.pypi} as of {as_of}"
    else:
        if store.index.latest(index_url, recipe.pypi, options.latest_ttl) is not None:
            return None
        asking = f"for the latest release of {recipe.pypi}"
    # The key needs the index: a pinned version and as_of (or a memo of them) would not.
    network.require(f"the key of {recipe.name} (asking {index_url} {asking})",
                    "pin version and as_of in the recipe (or pass --version and --as-of) to compute it offline")
    say(f"asking {index_url} {asking}")
    from concurrent.futures import ThreadPoolExecutor

    from llmgw_store.build import pypi

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(pypi.project_files, index_url, recipe.pypi, auth)
    finally:
        pool.shutdown(wait=False)


def _latest(store: Store, recipe: Recipe, index_url: str, options: BuildOptions, prefetched=None,
            auth: IndexAuth | None = None) -> str:
    version = store.index.latest(index_url, recipe.pypi, options.latest_ttl)
    if version is None:
        from llmgw_store.build import pypi

        if prefetched is None:
            say(f"asking {index_url} for the latest release of {recipe.pypi}")
        files = prefetched.result() if prefetched is not None else pypi.project_files(index_url, recipe.pypi, auth)
        version = pypi.latest_version(files, recipe.pypi)
        store.index.remember_latest(index_url, recipe.pypi, version)
        _remember_published(store, files, recipe.pypi, version, index_url)
    return version


def _latest_as_of(store: Store, recipe: Recipe, index_url: str, as_of: str, prefetched=None,
                  auth: IndexAuth | None = None) -> str:
    """The latest release as the index stood at `as_of` (the path's name must say the version the
    resolution, bound by that date, installs). Remembered for good: what was uploaded by a past date
    does not change (a yank does not change what `--exclude-newer` resolved)."""
    memo = f"{recipe.pypi}@{as_of}"
    version = store.index.latest(index_url, memo, float("inf"))
    if version is None:
        from llmgw_store.build import pypi

        if prefetched is None:
            say(f"asking {index_url} for the latest release of {recipe.pypi} as of {as_of}")
        files = prefetched.result() if prefetched is not None else pypi.project_files(index_url, recipe.pypi, auth)
        version = pypi.latest_version(files, recipe.pypi, parse_time(as_of))
        store.index.remember_latest(index_url, memo, version)
    return version


def _published_plus_a_day(store: Store, recipe: Recipe, version: str, index_url: str, prefetched=None,
                          auth: IndexAuth | None = None) -> str:
    published = store.index.published(index_url, recipe.pypi, version)
    if published is None:
        from llmgw_store.build import pypi

        if prefetched is None:
            say(f"asking {index_url} when {recipe.pypi} {version} was published")
        files = prefetched.result() if prefetched is not None else pypi.project_files(index_url, recipe.pypi, auth)
        published = _remember_published(store, files, recipe.pypi, version, index_url)
    return format_time(parse_time(published) + ONE_DAY)


def _remember_published(store: Store, files, project: str, version: str, index_url: str) -> str:
    from llmgw_store.build import pypi

    published = format_time(pypi.publication_time(files, project, version))
    store.index.remember_published(index_url, project, version, published)
    return published


def check_requirements(plan: BuildPlan) -> list[str]:
    """Requirements must be PyPI requirement specifiers: a URL or `@` reference would bypass the
    index, `--exclude-newer` and the published hashes. Run on a miss only (packaging is slow to
    import), before anything is locked or written, and again by `make_env`. The build's paths are
    checked here too, now that `{version}` is filled in (the recipe was checked with `0`)."""
    from packaging.requirements import InvalidRequirement, Requirement

    recipes.check_paths(plan.fields, plan.origin, f"build[{plan.build_index}]")
    where = f"build[{plan.build_index}].requirements"
    out = []
    for line in plan.fields["requirements"]:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise RecipeError(plan.origin, where, f"{line!r} is not a requirement: {str(exc).splitlines()[0]}") from None
        if req.url:
            raise RecipeError(plan.origin, where, f"{line!r} is a direct reference; only PyPI packages are allowed")
        out.append(str(req))
    return out
