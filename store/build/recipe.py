"""Recipes: TOML files that say how to build one engine's environments.

Parsing checks structure, types, names and every path a build names (it is on the cache-hit
path, so it stays cheap: no I/O); the builder checks requirement syntax before it starts a build,
and checks the paths again once `{version}` is filled in. Every error names the file and the
field, so a person can fix the recipe without reading code.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from llmgw_store.base.errors import RecipeError, UsageError
from llmgw_store.base.text import shown
from llmgw_store.core.names import check_engine, check_variant

VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._!-]{0,63}")  # always re.fullmatch: `$` lets "1.0\n" through

# field -> (python types, required): each documented in docs/recipes.md.
ENGINE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), True),
    "pypi": ((str,), False),
    "binary": ((str,), True),
    "repo": ((str,), False),
    "description": ((str,), False),
}
BUILD_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "variant": ((str,), True),
    "python": ((str,), True),
    "requirements": ((list,), True),
    "verify": ((list,), False),
    "health": ((list,), False),  # argv `activate` runs as its check by default (not at build time)
    "as_of": ((str, datetime), False),
    "version": ((str,), False),
    "extra_index": ((str,), False),
    "index_packages": ((list,), False),
    "index_pins": ((dict,), False),
    "free_gb": ((int, float), False),
    "gpu_check": ((bool,), False),
    "min_compute_capability": ((int, float, str), False),
    "max_compute_capability": ((int, float, str), False),
    "timeout": ((int, float), False),
    "source": ((dict,), False),
    "wheel": ((dict,), False),
    "assets": ((list,), False),
    "asset_tag": ((str,), False),
    "asset_dir": ((str,), False),
}
LIST_OF_STR = ("requirements", "verify", "health", "index_packages", "assets")
SOURCE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "url": ((str,), True), "sha256": ((str,), True), "top": ((str,), False), "dir": ((str,), False),
    "requirements": ((str,), False),
}
WHEEL_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "repo": ((str,), False), "tag": ((str,), True), "prefix": ((str,), False), "suffix": ((str,), False),
    "project": ((str,), True),
}
SHA256_RE = re.compile(r"[0-9a-f]{64}")

# Values a build passes to uv or puts in a requirement, a URL or a file name: each must be just
# what it says, never an option (`--install-dir=/x`), a second line (`tinydep @ file:///x\n...`)
# or a path. Always re.fullmatch (`$` would let a trailing newline through).
# build.python (and `build --python`): a version request (3, 3.11, 3.11.7, cpython3.11,
# cpython@3.12, pypy3.10) or an absolute path to an interpreter whose components are plain names —
# a leading dot allowed (`~/.pyenv/versions/...`), never `.` or `..` —, never anything uv could
# read as an option.
PYTHON_RE = re.compile(r"((cpython|pypy)@?)?[0-9]{1,2}(\.[0-9]{1,3}){0,2}"
                       r"|(/(?!\.\.?(?:/|$))[A-Za-z0-9._+-]{1,128}){1,16}")
MAX_PYTHON_CHARS = 255


def python_problem(value: object) -> str | None:
    """Why `value` is not a Python request (the recipe's build.python, `--python`), or None."""
    if isinstance(value, str) and len(value) <= MAX_PYTHON_CHARS and PYTHON_RE.fullmatch(value):
        return None
    return (f"{shown(value)} is not a Python version request such as 3.11, 3.11.7, cpython3.11 or pypy3.10, "
            "nor an absolute path to an interpreter (no `.` or `..` component)")
PROJECT_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")  # a PEP 508 name, at most 100
REPO_PART_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")  # owner and name of a GitHub repository
TAG_RE = re.compile(r"[A-Za-z0-9._+!-]{1,128}")  # a release tag; `!` as in VERSION_RE (an epoch)
# An index URL goes into uv's arguments and a generated pyproject.toml: http(s), and only the
# characters RFC 3986 allows, less the quote characters.
INDEX_URL_RE = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]{1,2048}")
AFFIX_RE = re.compile(r"[^/\\\x00-\x1f\x7f]{1,128}")  # part of an asset's name: no separator or control character

# One component of a path a recipe names (source dir/top/requirements, asset_dir, an asset): no
# separator, NUL, newline or space, and no leading `.` or `-`, so never `.`, `..`, `.llmgw` or an
# option. Always re.fullmatch.
COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}")
MAX_PATH_CHARS = 255
MAX_PATH_DEPTH = 16
# What `uv venv` and the store put at the top of every environment. A recipe's files go beside
# them, never over or into them: pyvenv.cfg and bin/python* decide which interpreter runs (and
# bin/python is a link to the base interpreter), lib/ and lib64/ are site-packages, .llmgw/ holds
# the lock and the manifest.
STORE_OWNED = frozenset({".llmgw", "pyvenv.cfg", "lib", "lib64", "include", "CACHEDIR.TAG", ".gitignore"})
# Names in bin/ that the venv made or that a person runs expecting the environment's own tool; an
# asset is never called this, wherever it goes. (Anything else already in the environment is
# refused when the build writes the asset: the write never replaces a file.)
RESERVED_BIN = ("python*", "activate*", "deactivate*", "pydoc*", "pip", "pip3", "pip3.*", "uv", "uvx")


@dataclass(frozen=True)
class Build:
    """One way to install the engine. `fields` is the table as written, `{version}` not yet filled."""

    index: int
    fields: dict[str, Any]

    @property
    def variant(self) -> str:
        return self.fields["variant"]

    def resolved(self, version: str) -> dict[str, Any]:
        """The build's fields with `{version}` filled in: what enters the key."""
        return _fill(self.fields, version)

    def with_python(self, python: str | None) -> Build:
        """This build with `python` in place of its build.python (`build --python`): checked as the
        field is, and entering the key as the field does. None: the build as it is."""
        if python is None or python == self.fields["python"]:
            return self
        problem = python_problem(python)
        if problem is not None:
            raise UsageError(f"--python {problem}")
        return Build(self.index, {**self.fields, "python": python})


@dataclass(frozen=True)
class Recipe:
    file: Path
    name: str
    pypi: str
    binary: str
    engine: dict[str, Any]
    builds: list[Build] = field(default_factory=list)

    def build_for(self, variant: str | None) -> Build:
        if variant is None:
            return self.builds[0]
        for b in self.builds:
            if b.variant == variant:
                return b
        known = ", ".join(b.variant for b in self.builds)
        raise UsageError(f"{self.file}: no build with variant {shown(variant)} (the recipe has: {known})")


MAX_RECIPE_BYTES = 1 << 16  # the largest example is under 4 KiB
MAX_RECIPE_DEPTH = 8  # [[build]] with a table of lists of tables ([[build.index_pins]]) is 5 levels
MAX_RECIPE_KEY_PARTS = 8


def load(path: str | Path) -> Recipe:
    """The recipe in the file `path`, read through the one bounded TOML loader (system/boundedtoml: at
    most MAX_RECIPE_BYTES, MAX_RECIPE_DEPTH levels, keys of MAX_RECIPE_KEY_PARTS dotted parts, so
    parsed in time linear in its size); RecipeError (exit 2) for a file beyond those bounds or not
    valid TOML, never a traceback."""
    from llmgw_store.system.boundedtoml import Limits, TomlRefused, loads

    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such recipe file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the recipe: {exc}") from None
    try:
        data = loads(raw, Limits(MAX_RECIPE_BYTES, MAX_RECIPE_DEPTH, MAX_RECIPE_KEY_PARTS, "the recipe"))
    except TomlRefused as exc:
        raise RecipeError(path, "", str(exc)) from None
    return parse(data, path)


def parse(data: dict[str, Any], file: str | Path) -> Recipe:
    unknown = set(data) - {"engine", "build"}
    if unknown:
        raise RecipeError(file, sorted(unknown)[0], "unknown top-level table; a recipe has [engine] and [[build]]")
    engine = data.get("engine")
    if not isinstance(engine, dict):
        raise RecipeError(file, "engine", "missing [engine] table")
    _check_table(engine, ENGINE_FIELDS, file, "engine")
    try:
        check_engine(engine["name"])
    except UsageError as exc:
        raise RecipeError(file, "engine.name", str(exc)) from None
    _check_engine_values(engine, file)
    builds = data.get("build")
    if not isinstance(builds, list) or not builds:
        raise RecipeError(file, "build", "at least one [[build]] table is needed")
    seen: set[str] = set()
    parsed = []
    for i, b in enumerate(builds):
        where = f"build[{i}]"
        if not isinstance(b, dict):
            raise RecipeError(file, where, "must be a table")
        _check_table(b, BUILD_FIELDS, file, where)
        b = dict(b)
        try:
            check_variant(b["variant"])
        except UsageError as exc:
            raise RecipeError(file, f"{where}.variant", str(exc)) from None
        if b["variant"] in seen:
            raise RecipeError(file, f"{where}.variant", f"variant {b['variant']!r} appears twice")
        seen.add(b["variant"])
        problem = python_problem(b["python"])
        if problem is not None:
            raise RecipeError(file, f"{where}.python", problem)
        if not b["requirements"] and "source" not in b and "wheel" not in b:
            raise RecipeError(file, f"{where}.requirements", "must name at least one requirement")
        if "version" in b and not VERSION_RE.fullmatch(b["version"]):
            raise RecipeError(file, f"{where}.version", f"{b['version']!r} is not a version")
        if "as_of" in b:
            b["as_of"] = format_time(past_time(b["as_of"], lambda msg, where=where: RecipeError(file, f"{where}.as_of", msg)))
        if ("extra_index" in b) != ("index_packages" in b) or ("index_packages" in b and not b["index_packages"]):
            raise RecipeError(file, f"{where}.extra_index", "extra_index and a non-empty index_packages go together: "
                              "the second index serves only the packages named for it")
        if "index_pins" in b and "index_packages" not in b:
            raise RecipeError(file, f"{where}.index_pins", "pins packages of the extra index: give extra_index and "
                              "index_packages too")
        if "source" in b:
            _check_table(b["source"], SOURCE_FIELDS, file, f"{where}.source")
            if not SHA256_RE.fullmatch(b["source"]["sha256"]):
                raise RecipeError(file, f"{where}.source.sha256", "must be 64 lowercase hex digits")
        if "wheel" in b:
            _check_table(b["wheel"], WHEEL_FIELDS, file, f"{where}.wheel")
            if "repo" not in b["wheel"] and "repo" not in engine:
                raise RecipeError(file, f"{where}.wheel.repo", "needs a repo (here or engine.repo)")
        if "assets" in b:
            if "asset_tag" not in b:
                raise RecipeError(file, f"{where}.asset_tag", "assets need the release tag they come from")
            if "repo" not in engine:
                raise RecipeError(file, "engine.repo", "assets need the repository they come from")
        check_paths(_fill(b, "0"), file, where)  # again with the real version by the builder
        if "health" in b and not b["health"]:
            raise RecipeError(file, f"{where}.health", "must name a command (a list of its arguments)")
        for name in ("free_gb", "timeout"):
            if name in b and b[name] < 0:
                raise RecipeError(file, f"{where}.{name}", "must not be negative")
        parsed.append(Build(i, b))
    return Recipe(
        file=Path(file),
        name=engine["name"],
        pypi=engine["pypi"] if "pypi" in engine else engine["name"],
        binary=engine["binary"],
        engine=dict(engine),
        builds=parsed,
    )


def _check_engine_values(engine: dict[str, Any], file) -> None:
    """engine.binary is one file name in bin/, engine.pypi a project name, engine.repo owner/name."""
    if not COMPONENT_RE.fullmatch(engine["binary"]):
        raise RecipeError(file, "engine.binary", f"{shown(engine['binary'])} is not a plain file name ({PLAIN})")
    if "pypi" in engine:
        _project(engine["pypi"], file, "engine.pypi")
    if "repo" in engine:
        _repo(engine["repo"], file, "engine.repo")


def check_values(b: dict[str, Any], file, where: str) -> None:
    """The names, tags and URLs a build hands to uv, a requirement or a release lookup (see the
    patterns above). With `{version}` filled in, like check_paths, which calls it."""
    w = b.get("wheel", {})
    if "project" in w:
        _project(w["project"], file, f"{where}.wheel.project")
    if "repo" in w:
        _repo(w["repo"], file, f"{where}.wheel.repo")
    for name, value in (("asset_tag", b.get("asset_tag")), ("wheel.tag", w.get("tag"))):
        if value is not None and not TAG_RE.fullmatch(value):
            raise RecipeError(file, f"{where}.{name}", f"{shown(value)} is not a release tag ([A-Za-z0-9._+!-], "
                              "at most 128 characters)")
    for key in ("prefix", "suffix"):
        if key in w and not AFFIX_RE.fullmatch(w[key]):
            raise RecipeError(file, f"{where}.wheel.{key}", f"{shown(w[key])} must be at most 128 characters "
                              "with no '/', '\\' or control character")
    for name in b.get("index_packages", []):
        _project(name, file, f"{where}.index_packages")
    _check_index_pins(b, file, where)
    if "extra_index" in b and not INDEX_URL_RE.fullmatch(b["extra_index"]):
        raise RecipeError(file, f"{where}.extra_index", f"{shown(b['extra_index'])} is not an http(s) URL "
                          "(no spaces, quotes or control characters, at most 2048 characters)")
    if "extra_index" in b and "@" in b["extra_index"].partition("://")[2].split("/", 1)[0]:
        # The build table is a key input, recorded and pushed everywhere: a token there would be too.
        raise RecipeError(file, f"{where}.extra_index", "holds credentials (user:token@): put them in netrc "
                          "(docs/operations.md, private indexes), the URL in the recipe without them")


MAX_PIN_DIGESTS = 64  # wheels of one version (platforms x Python versions) a pin may list


def _check_index_pins(b: dict[str, Any], file, where: str) -> None:
    """index_pins = { NAME = "VERSION" } or { NAME = { version = "VERSION", sha256 = "HEX" | ["HEX", ...] } },
    each NAME one of index_packages (see indexpins.py)."""
    pins = b.get("index_pins")
    if pins is None:
        return
    packages = {_norm(p) for p in b.get("index_packages", [])}
    if len({_norm(n) for n in pins}) != len(pins):
        raise RecipeError(file, f"{where}.index_pins", "names one package twice (names are compared normalised)")
    for name, value in pins.items():
        field = f"{where}.index_pins"
        _project(name, file, field)
        field = f"{field}.{name}"
        if _norm(name) not in packages:
            raise RecipeError(file, field, f"{name!r} is not one of index_packages; only packages of the extra index "
                              "are pinned here (pin others in requirements)")
        if isinstance(value, dict):
            _check_table(value, PIN_FIELDS, file, field)
            version = value["version"]
            digests = value.get("sha256", [])
            digests = [digests] if isinstance(digests, str) else digests
            if not digests or len(digests) > MAX_PIN_DIGESTS or not all(
                    isinstance(d, str) and SHA256_RE.fullmatch(d) for d in digests):
                raise RecipeError(file, f"{field}.sha256", f"must be one or a list of 1 to {MAX_PIN_DIGESTS} sha256 "
                                  "digests (64 lowercase hex digits)")
        elif isinstance(value, str):
            version = value
        else:
            raise RecipeError(file, field, "must be a version string or a table with version (and sha256)")
        if not VERSION_RE.fullmatch(version):
            raise RecipeError(file, field, f"{shown(version)} is not an exact version such as 2.9.1 or 2.9.1+cu128")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


PIN_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {"version": ((str,), True), "sha256": ((str, list), False)}


def _project(value: str, file, field: str) -> None:
    if not PROJECT_RE.fullmatch(value):
        raise RecipeError(file, field, f"{shown(value)} is not a project name ([A-Za-z0-9._-], starting and "
                          "ending with a letter or digit, at most 100 characters)")


def _repo(value: str, file, field: str) -> None:
    parts = value.split("/")
    if len(parts) != 2 or any(not REPO_PART_RE.fullmatch(p) or p in (".", "..") for p in parts):
        raise RecipeError(file, field, f"{shown(value)} is not a repository owner/name (each [A-Za-z0-9._-], "
                          "at most 100 characters, not '.' or '..')")


def check_paths(b: dict[str, Any], file, where: str) -> None:
    """Every path a build names stays inside its tree and off what the store owns: `source.top` and
    `source.requirements` inside the unpacked archive, `source.dir`, `asset_dir` and each asset in
    the environment; and every other value passes check_values. Run at load time (with `{version}`
    as `0`) and by the builder on the real values; the builder's writes also refuse links and
    existing files, so this is the first of two walls."""
    check_values(b, file, where)
    src = b.get("source", {})
    for key in ("top", "requirements"):
        if key in src:
            _relative(src[key], file, f"{where}.source.{key}", "the archive")
    if "dir" in src:
        _relative(src["dir"], file, f"{where}.source.dir", "the environment", owned=True)
    asset_dir = b.get("asset_dir", "bin")
    # bin itself is where assets go by default; what they are called is checked below.
    _relative(asset_dir, file, f"{where}.asset_dir", "the environment", owned=asset_dir != "bin")
    seen: set[str] = set()
    for name in b.get("assets", []):
        field = f"{where}.assets"
        if "/" in name or not COMPONENT_RE.fullmatch(name):
            raise RecipeError(file, field, f"{name!r} is not a plain file name ({PLAIN})")
        if _reserved(name):
            raise RecipeError(file, field, f"{name!r} is reserved for the environment's own tools "
                              f"({', '.join(RESERVED_BIN)}); rename the asset")
        if name in seen:
            raise RecipeError(file, field, f"{name!r} appears twice")
        seen.add(name)
        _relative(f"{asset_dir}/{name}", file, field, "the environment", owned=True)


PLAIN = "[A-Za-z0-9._+-], not starting with '.' or '-', at most 128 characters"


def _relative(value: str, file, field: str, inside: str, owned: bool = False) -> tuple[str, ...]:
    """`value` as the components of a plain relative path, or a RecipeError saying what is wrong;
    with `owned`, a path in the environment that must not be (or be under) what the store owns."""
    if value.startswith("/"):
        raise RecipeError(file, field, f"{value!r} is absolute; give a path relative to {inside}")
    parts = tuple(value.split("/"))
    if ".." in parts:
        raise RecipeError(file, field, f"{value!r} climbs out of {inside} with '..'")
    if "" in parts:
        raise RecipeError(file, field, f"{value!r} has an empty component (a leading, trailing or doubled '/')")
    if len(value) > MAX_PATH_CHARS or len(parts) > MAX_PATH_DEPTH:
        raise RecipeError(file, field, f"is longer than {MAX_PATH_CHARS} characters or {MAX_PATH_DEPTH} components")
    if owned and (parts[0] in STORE_OWNED or (parts[0] == "bin" and (len(parts) == 1 or _reserved(parts[1])))):
        listed = ", ".join(sorted(STORE_OWNED))
        raise RecipeError(file, field, f"{value!r} is, or is under, what the store and uv venv own in every "
                          f"environment ({listed}, bin itself, bin/python*, bin/activate* ...); choose another place")
    for part in parts:
        if not COMPONENT_RE.fullmatch(part):
            raise RecipeError(file, field, f"{value!r}: {part!r} is not a plain name ({PLAIN})")
    return parts


def _reserved(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RESERVED_BIN)


def _check_table(table: dict[str, Any], spec: dict[str, tuple[tuple[type, ...], bool]], file, where: str) -> None:
    for key in table:
        if key not in spec:
            raise RecipeError(file, f"{where}.{key}", f"unknown field (known: {', '.join(spec)})")
    for key, (types, required) in spec.items():
        if key not in table:
            if required:
                raise RecipeError(file, f"{where}.{key}", "required field is missing")
            continue
        value = table[key]
        # bool is an int in Python; a number field must not accept `true`.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise RecipeError(file, f"{where}.{key}", f"must be {names}, not {type(value).__name__}")
        if key in LIST_OF_STR and isinstance(value, list) and not all(isinstance(v, str) and v for v in value):
            raise RecipeError(file, f"{where}.{key}", "must be a list of non-empty strings")
        if isinstance(value, str) and not value:
            raise RecipeError(file, f"{where}.{key}", "must not be empty")


def _fill(value: Any, version: str) -> Any:
    if isinstance(value, str):
        return value.replace("{version}", version)
    if isinstance(value, list):
        return [_fill(v, version) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, version) for k, v in value.items()}
    return value


def parse_time(value: str | datetime, error=UsageError) -> datetime:
    """An ISO 8601 time (`2024-03-01T00:00:00Z`, or a date meaning its midnight UTC), as aware UTC."""
    if isinstance(value, datetime):
        dt = value
    else:
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise error(f"{shown(value)} is not an ISO 8601 time such as 2024-03-01T00:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    # Years outside 1970..9000 are typos, and near datetime's own bounds a shift to UTC or the day
    # added to a publication time overflows.
    if not 1970 <= dt.year <= 9000:
        raise error(f"{shown(str(value))} is out of range: a time from 1970 to 9000")
    return dt.astimezone(UTC)


def past_time(value: str | datetime, error=UsageError) -> datetime:
    """`parse_time`, refusing a time still to come: a resolution date (asOf) fixes what the index
    held, and one in the future fixes nothing (what is uploaded before it would change a build of
    the same key)."""
    dt = parse_time(value, error)
    if dt > datetime.now(UTC):
        raise error(f"{format_time(dt)} is in the future: a resolution date must have passed "
                    "(leave it out to resolve as the index stood a day after the release)")
    return dt


def format_time(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ONE_DAY = timedelta(days=1)
