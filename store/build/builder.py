"""`build`: from a recipe to a registered store path.

The key is computed first, from facts that are memoised in the index (the uv version, the
interpreter, the latest version, the publication time), so a build whose key is already in the
store reads the recipe and the index and returns, asking the network nothing.
Only a miss validates requirements, resolves and installs; see realise.py for the locking.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmgw_store.app import credentials, debug, network
from llmgw_store.app.credentials import IndexAuth
from llmgw_store.app.results import document
from llmgw_store.app.units import human_size
from llmgw_store.base import defaults
from llmgw_store.base.errors import CacheMiss, CommandError, RecipeError, StoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.base.text import shown
from llmgw_store.build import bytecode, cacheuse, canonical, indexpins, interpreters, lockfiles, wheelhome
from llmgw_store.build import recipe as recipes
from llmgw_store.build import uv as uvmod
from llmgw_store.build.memo import MAX_RECIPE_BYTES
from llmgw_store.build.realise import DEFAULT_LOCK_TIMEOUT_S, HANDOFF, realise
from llmgw_store.build.recipe import ONE_DAY, Build, Recipe, format_time, parse_time, past_time
from llmgw_store.core import footprint
from llmgw_store.core.keys import SCHEMA_VERSION, path_name, store_key
from llmgw_store.core.local_store import Store
from llmgw_store.core.oplog import recorded
from llmgw_store.system.host import platform_facts
from llmgw_store.system.trees import force_rmtree, free_bytes

PYPI_SIMPLE = defaults.PYPI_SIMPLE
DEFAULT_TIMEOUT_S = 3600.0
LATEST_TTL_S = 3600.0  # like Nix's tarball-ttl: "latest" is asked again at most once an hour


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


class Deadline:
    """The build's time limit (the recipe's `timeout`), shared by install and verify."""

    def __init__(self, plan: BuildPlan):
        self.seconds = float(plan.fields.get("timeout", DEFAULT_TIMEOUT_S))
        self.at = time.monotonic() + self.seconds
        self.name = plan.name

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise StoreError(f"the build of {self.name} ran past its timeout of {self.seconds:.0f}s")
        return left


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
        plan = _plan(store, recipe, chosen, options)
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


def _plan(store: Store, recipe: Recipe, chosen: Build, options: BuildOptions) -> BuildPlan:
    """Everything that decides the result, and the key and name that follow from it."""
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


def plan_build(store: Store, recipe: Recipe, chosen: Build, options: BuildOptions) -> BuildPlan:
    """The plan `build` makes for `chosen` (its key, name and inputs), for `build --check`."""
    return _plan(store, recipe, chosen, options)


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


def make_env(store: Store, plan: BuildPlan, partial: Path, deadline: Deadline,
             steps: dict[str, float] | None = None) -> dict[str, Any]:
    """venv, resolve (or take `plan.lock_text` as it is, for a repair), install, check the binary.
    Each step's seconds go into `steps` (the build's result shows them)."""
    fields, uv, interp = plan.fields, plan.uv, plan.interpreter
    steps = {} if steps is None else steps
    mark = [time.monotonic()]

    def step(name: str) -> None:
        now = time.monotonic()
        steps[name] = round(steps.get(name, 0.0) + now - mark[0], 3)
        mark[0] = now
    requirements = check_requirements(plan)
    layout = store.layout
    remaining = deadline.remaining

    if "free_gb" in fields:
        free = free_bytes(layout.store)
        if free < fields["free_gb"] * 1e9:
            raise StoreError(
                f"only {human_size(free)} free under {layout.store}, the build needs {fields['free_gb']} GB "
                f"(free_gb, 10^9 bytes each); "
                "run `llmgw-store gc` or free space"
            )
    env = uvmod.clean_env(
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(plan.uv_cache or layout.uv_cache),
        UV_PYTHON_INSTALL_DIR=str(layout.python_installs),
        UV_PYTHON_DOWNLOADS="never",
        TMPDIR=str(layout.tmp),
        **({"UV_OFFLINE": "1"} if plan.offline or network.is_offline() else {}),
    )
    # uv alone learns the index, and its credentials, from its environment: never from its argv
    # (/proc/<pid>/cmdline is world-readable), never in a log or a line shown (app/credentials.py).
    uv_env = {**env, "UV_INDEX_URL": credentials.with_auth(plan.index_url, plan.index_auth)}
    python = partial / "bin" / "python"
    meta_dir = partial / ".llmgw"
    meta_dir.mkdir()

    def uv_run(args: list, what: str, cwd: Path = layout.tmp) -> str:
        return uvmod.run([uv.path, *args], what=what, env=uv_env, log_dir=layout.logs, cwd=cwd,
                         timeout=remaining(), show=say)

    say(f"creating the environment ({interp.implementation} {interp.version}, {interp.path})")
    uv_run(["venv", "--relocatable", "--allow-existing", "--python", interp.path, partial], "uv venv")
    step("venv")
    debug.pause("BUILD_PAUSE")  # a .partial with a venv exists: concurrent builders meet here
    mark[0] = time.monotonic()
    requirements = requirements + _fetch_extras(store, plan, partial)
    step("fetch")
    extra_index = fields.get("extra_index")
    lock = meta_dir / ("pylock.toml" if extra_index else "requirements.lock")
    index_pins = _index_pins(store, plan, requirements, python, uv_run)
    if extra_index:
        # PEP 751 with an explicit second index: only `index_packages` may come from it; every
        # other package, even one the second index also offers (the 2022 torchtriton confusion),
        # resolves from the main index.
        source = meta_dir / "pyproject.toml"
        source.write_text(lockfiles.pyproject_with_index(indexpins.requirements_with_pins(requirements, index_pins),
                                                         extra_index, fields["index_packages"], interp.version))
    else:
        source = meta_dir / "requirements.in"
        source.write_text("".join(r + "\n" for r in requirements))

    as_of = plan.inputs["as_of"]
    if plan.lock_text is not None:
        lock.write_text(plan.lock_text)
    else:
        where = plan.index_url + (f" (and {extra_index} for {', '.join(fields['index_packages'])})" if extra_index else "")
        say(f"resolving {len(requirements)} requirement(s) as {where} stood at {as_of}")
        fmt = ["--format", "pylock.toml"] if extra_index else ["--generate-hashes"]
        if extra_index:
            indexpins.check_index(extra_index, fields, index_pins, plan.origin, f"build[{plan.build_index}]")
            fmt += indexpins.exempt_args(index_pins)  # pinned: the pin, not a date, decides
        # Run in .llmgw/ with relative names: uv's `# via -r requirements.in` then names no
        # directory, so the lock (a file of the tree) is the same in every root (reproducible).
        uv_run(
            ["pip", "compile", source.name, "-o", lock.name, *fmt, "--exclude-newer", as_of,
             "--python", python, "--no-header", "--quiet"],
            "uv pip compile", cwd=meta_dir,
        )
        indexpins.check_lock(lock.read_text(), index_pins)
    step("resolve")
    lock_text = lock.read_text()
    pinned = lockfiles.pins(lock_text, lock.name)
    _check_engine_version(plan, pinned)
    pins = len(pinned)
    # Linked from the wheel home (uv's archive bucket is the store's, see wheelhome.py): the tree
    # shares inodes only with sealed, checked store files. A private cache (a repair, a check) is
    # copied from, never linked: it is deleted after the build. Not `clone` either: uv 0.13 falls
    # back from a failed reflink to a HARDLINK (ext4, tmpfs).
    linking = plan.uv_cache is None and wheelhome.attach(layout)
    say(f"installing {pins} pinned package(s) with --require-hashes --no-deps"
        + (" (linked from the wheel home)" if linking else " (copied)"))
    uv_run(
        ["pip", "install", "--require-hashes", "--no-deps", "-r", lock,
         "--python", python, "--link-mode", "hardlink" if linking else "copy"],  # not --quiet: progress detail
        "uv pip install",
    )
    debug.pause("WHEELS_LINKED")  # uv has linked the wheel home's files into the .partial
    handoff = wheelhome.adopt(layout, partial) if linking else None
    # what gc keeps for repair and cold rollback
    cacheuse.record(store, plan.name, partial, plan.uv_cache, set(handoff.entries) if handoff else None)
    step("install")
    say("compiling bytecode")
    pyc_cache = plan.pyc_cache or layout.pyc_cache
    # A repair's private cache gets a secret of its own, kept nowhere: nothing outside it is used.
    secret = os.urandom(bytecode.SECRET_BYTES) if plan.pyc_cache else bytecode.cache_secret(layout.pyc_secret)
    compile_env = {**env, **debug.passed_on("COMPILE_PAUSE"), bytecode.SECRET_ENV: secret.hex()}
    # the store's cache only: its entries become links to this path's pycs once it is registered
    links = None if plan.pyc_cache else bytecode.links_file(layout.tmp, plan.key)
    modules, failed, reused = bytecode.compile_tree(python, partial, pyc_cache, lambda argv, what: uvmod.run(
        argv, what=what, env=compile_env, log_dir=layout.logs, cwd=layout.tmp, timeout=remaining(), show=say),
        links=links)
    step("bytecode")
    say(f"{modules} module(s): {modules - reused - failed} compiled, {reused} from the bytecode cache"
             + (f", {failed} left as source (they do not compile)" if failed else ""))
    name = plan.inputs["binary"]
    binary = partial / "bin" / name
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise StoreError(f"the environment has no executable bin/{name} (engine.binary in {plan.origin})")
    # modes and times: not the builder's (the wheel home's files are canonical already, and shared)
    canonical.normalise(partial, parse_time(as_of).timestamp(), keep=handoff.inodes if handoff else frozenset())
    return {
        **({HANDOFF: handoff} if handoff else {}),
        "requirements": requirements,
        "exclude_newer": as_of,
        "index_url": plan.index_url,
        "uv_version": uv.version,
        "python": asdict(interp),
        "lock": lock_text,
        "lock_format": lock.name,
    }


def _index_pins(store: Store, plan: BuildPlan, requirements: list[str], python: Path,
                uv_run) -> dict[str, indexpins.Pin]:
    """The exact pins of the extra index's packages (indexpins.py); none without an extra index.
    A `from-main-index` pin is resolved first: the build's requirements on the main index alone,
    date-bound, in a scratch directory (nothing of it enters the tree); a rebuild from a recorded
    lock reads it from that lock instead."""
    if not plan.fields.get("extra_index"):
        return {}
    where = f"build[{plan.build_index}]"
    names = indexpins.to_derive(plan.fields)
    versions: dict[str, str] = {}
    if names and plan.lock_text is not None:
        versions = indexpins.derived(plan.lock_text, "pylock.toml", names, plan.origin, where)
    elif names:
        scratch = store.layout.tmp / f"derive-{os.getpid()}-{time.monotonic_ns()}"
        scratch.mkdir(mode=0o700)
        try:
            (scratch / "requirements.in").write_text("".join(r + "\n" for r in requirements))
            say(f"resolving on {plan.index_url} alone for the versions of {', '.join(names)} (index_pins)")
            uv_run(["pip", "compile", "requirements.in", "-o", "requirements.lock", "--exclude-newer",
                    plan.inputs["as_of"], "--python", python,
                    "--no-header", "--quiet"], "uv pip compile (main index, for index_pins)", scratch)
            versions = indexpins.derived((scratch / "requirements.lock").read_text(), "requirements.lock", names,
                                         plan.origin, where)
        finally:
            force_rmtree(scratch)
    return indexpins.pinned(plan.fields, requirements, plan.origin, where, versions)


def _fetch_extras(store: Store, plan: BuildPlan, partial: Path) -> list[str]:
    """The build's source archive, release assets and release wheel, each checked against its
    digest; returns the requirements they add (the source's requirements file, the pinned wheel).
    Its paths were checked by `check_requirements`; every write into `partial` goes through fetch's
    no-follow helpers, so nothing lands outside it or on what uv venv made there."""
    from llmgw_store.build import fetch

    fields, origin, where = plan.fields, plan.origin, f"build[{plan.build_index}]"
    downloads = store.layout.downloads
    added: list[str] = []
    if "source" in fields:
        src = fields["source"]
        archive = fetch.cached_download(src["url"], src["sha256"], downloads)
        say(f"unpacking {archive.name} (checked against its sha256)")
        scratch = store.layout.tmp / f"unpack-{os.getpid()}-{time.monotonic_ns()}"
        try:
            # What the recipe says the whole build needs bounds what its source may unpack to.
            bound = int(fields["free_gb"] * 1e9) if fields.get("free_gb") else fetch.SOURCE_MAX_BYTES
            top = fetch.unpack_source(archive, scratch, src.get("top"), origin, f"{where}.source", max_bytes=bound)
            top_rel = top.relative_to(scratch).as_posix()
            if "requirements" in src:
                added += fetch.source_requirements(scratch, f"{top_rel}/{src['requirements']}", origin,
                                                   f"{where}.source")
            fetch.move_tree(scratch, top_rel, partial, src.get("dir", "src"), origin, f"{where}.source")
        finally:
            force_rmtree(scratch)
    if "assets" in fields:
        repo, tag = plan.inputs["repo"], fields["asset_tag"]
        listed = fetch.release(repo, tag)
        asset_dir = fields.get("asset_dir", "bin")
        dir_fd = fetch.env_dir(partial, asset_dir, origin, f"{where}.asset_dir")
        try:
            for name in fields["assets"]:
                asset = fetch.pick(listed, repo, tag, name=name)
                got = fetch.cached_download(asset["url"], asset["sha256"], downloads)
                fetch.install_file(got, dir_fd, name, 0o755 if asset_dir == "bin" else 0o644, f"{asset_dir}/{name}",
                                   origin, f"{where}.assets")
                say(f"asset {name} from release {tag} of {repo} (sha256 {asset['sha256'][:12]}…)")
        finally:
            os.close(dir_fd)
    if "wheel" in fields:
        w = fields["wheel"]
        repo = w.get("repo", plan.inputs["repo"])
        asset = fetch.pick(fetch.release(repo, w["tag"]), repo, w["tag"], prefix=w.get("prefix", ""),
                           suffix=w.get("suffix", ".whl"))
        # Pinned to the digest the release publishes: uv checks the fragment when it downloads.
        added.append(f"{w['project']} @ {asset['url']}#sha256={asset['sha256']}")
        say(f"release wheel {asset['name']} from {repo} {w['tag']} (sha256 {asset['sha256'][:12]}…)")
    return added


def _check_engine_version(plan: BuildPlan, pinned: dict[str, str]) -> None:
    """The store path is named after `plan.version`: the engine's project, where the lock installs
    it, must be at that version (a recipe whose requirements do not say `{version}` could otherwise
    resolve to another release and carry the wrong name)."""
    from packaging.version import InvalidVersion, Version

    project = plan.inputs.get("pypi") or plan.meta.get("engine")
    got = pinned.get(lockfiles.normalize(project)) if project else None
    if got is None:
        return
    try:
        same = Version(got) == Version(plan.version)
    except InvalidVersion:
        same = got == plan.version
    if not same:
        raise RecipeError(
            plan.origin, f"build[{plan.build_index}].requirements",
            f"they resolve {project} to {got} as of {plan.inputs.get('as_of')}, but the store path would be named "
            f"{plan.version}: pass --version {got}, or require {project}=={{version}}")


def verify_env(store: Store, plan: BuildPlan, env_dir: Path, deadline: Deadline) -> None:
    """Run the recipe's verify command, then the GPU check, in the (already frozen) environment."""
    fields = plan.fields
    env = uvmod.clean_env(VIRTUAL_ENV=str(env_dir), TMPDIR=str(store.layout.tmp))
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    command = fields.get("verify")
    if command:
        argv = list(command)
        if (env_dir / "bin" / argv[0]).exists():
            argv[0] = str(env_dir / "bin" / argv[0])
        say(f"verifying: {' '.join(command)}")
        uvmod.run(argv, what=f"verify command `{' '.join(command)}`", env=env, log_dir=store.layout.logs,
                  cwd=store.layout.tmp, timeout=deadline.remaining(), show=say)
    if fields.get("gpu_check"):
        _gpu_probe(store, env_dir, env, deadline)


def _gpu_probe(store: Store, env_dir: Path, env: dict[str, str], deadline: Deadline) -> None:
    """Where an NVIDIA driver is present, torch in the new environment must see the GPU and run a
    kernel on it; the seed's hint is added when the build has no kernels for the card."""
    from llmgw_store.build import gpu

    host = gpu.probe_host()
    if host.driver is None:
        say("no NVIDIA driver on this host: GPU check skipped")
        return
    say(f"GPU check ({host.driver}; {', '.join(f'{g.name} sm {g.capability:g}' for g in host.gpus) or 'no GPU listed'})")
    try:
        out = uvmod.run([env_dir / "bin" / "python", "-c", gpu.PROBE], what="GPU check", env=env,
                        log_dir=store.layout.logs, cwd=store.layout.tmp,
                        timeout=min(600.0, deadline.remaining()), show=say)
    except CommandError as exc:
        raise CommandError(f"GPU check failed{gpu.kernel_hint(exc.output_tail, host)}", output_tail=exc.output_tail,
                           log=exc.log) from None
    say(out.strip().splitlines()[-1] if out.strip() else "GPU check passed")
