"""What is inside a store path: its packages (`packages`), why one is there (`why`), and its lock
for other tools (`export`).

Every store path carries what answers these, checked when it was built: the installed
distributions' METADATA (name, version, Requires-Dist) under lib/python*/site-packages, and the lock
it was installed from (`.llmgw/requirements.lock`, uv's `--generate-hashes` output, or
`.llmgw/pylock.toml`, PEP 751) with its manifest (the recipe's requirements, the index, `as_of`).
Nothing here writes, and the store is opened as a reader (core/diskview.py): a service user may
ask too. The files are the store's own, yet every read is bounded (size, count, depth).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import NotFoundError, StoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.base.text import shown
from llmgw_store.core import manifest
from llmgw_store.core.diskview import open_reader
from llmgw_store.roots.resolve import reference

MAX_DISTS = 20_000  # distributions in one environment (vLLM's is ~200)
METADATA_MAX = 4 << 20  # bytes of one METADATA file read (its headers come first)
MAX_CHAINS = 50  # requirement chains `why` prints
MAX_DEPTH = 64  # links in one chain
FORMATS = ("requirements", "pylock")
_HASH_RE = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def normalize(name: str) -> str:
    """PEP 503's normal form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- what the store path holds ------------------------------------------------------------------

@dataclass(frozen=True)
class Dist:
    name: str  # normalised
    version: str
    requires: tuple[str, ...]  # Requires-Dist, as written


@dataclass(frozen=True)
class _Opened:
    path: Path
    name: str
    doc: dict[str, Any]


def _open(target: str, root: str | Path | None) -> _Opened:
    with open_reader(root) as store:
        row = reference(store, target)
        path = store.layout.path_of(row.name)
    try:
        doc = manifest.read(path)
    except ValueError as exc:
        raise StoreError(f"{row.name}: its manifest cannot be read ({exc}); run `llmgw-store verify`") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{row.name}: its manifest is not a JSON object; run `llmgw-store verify`")
    return _Opened(path, row.name, doc)


def _read_bounded(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `path`, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def installed(env: Path) -> dict[str, Dist]:
    """The distributions installed in `env` (normalised name -> Dist), from their METADATA."""
    out: dict[str, Dist] = {}
    lib = env / "lib"
    try:
        pythons = [e for e in os.scandir(lib) if e.name.startswith("python") and e.is_dir(follow_symlinks=False)]
    except OSError:
        return out
    for py in pythons[:4]:
        site = Path(py.path) / "site-packages"
        try:
            entries = sorted(e.name for e in os.scandir(site) if e.name.endswith(".dist-info"))
        except OSError:
            continue
        for name in entries[:MAX_DISTS]:
            try:
                headers = BytesHeaderParser().parsebytes(_read_bounded(site / name / "METADATA", METADATA_MAX))
            except (OSError, ValueError):
                continue
            dist_name, version = headers.get("Name"), headers.get("Version")
            if not dist_name or not version or not _NAME_RE.fullmatch(str(dist_name).strip()):
                continue
            n = normalize(str(dist_name).strip())
            out[n] = Dist(n, str(version).strip(), tuple(str(r) for r in (headers.get_all("Requires-Dist") or [])))
    return out


def locked_files(lock_text: str, lock_format: str) -> dict[str, dict[str, Any]]:
    """Normalised name -> {"version", "hashes"} from the recorded lock (either format); a pylock's
    packages also keep their files ("wheels", "sdist") and "index"."""
    out: dict[str, dict[str, Any]] = {}
    if lock_format.endswith(".toml"):
        doc = tomllib.loads(lock_text)
        for p in doc.get("packages", []) if isinstance(doc, dict) else []:
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                continue
            files = [w for w in p.get("wheels", []) if isinstance(w, dict)]
            if isinstance(p.get("sdist"), dict):
                files.append(p["sdist"])
            hashes = [f"sha256:{f['hashes']['sha256']}" for f in files
                      if isinstance(f.get("hashes"), dict) and isinstance(f["hashes"].get("sha256"), str)]
            out[normalize(p["name"])] = {"version": str(p.get("version", "")), "hashes": sorted(hashes), "package": p}
        return out
    # requirements.lock: one logical line per package, continued with `\`, its hashes on it.
    logical = re.sub(r"\\\n", " ", lock_text)
    for line in logical.splitlines():
        m = _PIN_RE.match(line.strip())
        if m:
            out[normalize(m.group(1))] = {"version": m.group(2), "hashes": sorted(set(_HASH_RE.findall(line)))}
    return out


# --- packages --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Packages(Result):
    """The distributions in a store path: name (normalised), version, whether the recipe asked for
    it by name, and the file hashes the lock pins for it."""

    path: str
    name: str
    lock_format: str
    packages: tuple[dict[str, Any], ...]


def packages(target: str, *, root: str | Path | None = None) -> Packages:
    p = _open(target, root)
    locked = locked_files(str(p.doc.get("lock", "")), str(p.doc.get("lock_format", "requirements.lock")))
    asked = {normalize(n) for n in _requirement_names(p.doc.get("requirements"))}
    dists = installed(p.path)
    rows = []
    for n in sorted(set(dists) | set(locked)):
        d, lock = dists.get(n), locked.get(n, {})
        rows.append({"name": n, "version": d.version if d else lock.get("version", ""), "requested": n in asked,
                     "installed": d is not None, "hashes": list(lock.get("hashes", []))})
    return Packages(str(p.path), p.name, str(p.doc.get("lock_format", "")), tuple(rows))


def _requirement_names(requirements: Any) -> list[str]:
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for r in requirements if isinstance(requirements, list) else []:
        try:
            out.append(Requirement(str(r)).name)
        except InvalidRequirement:
            continue
    return out


# --- why ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Why(Result):
    """Why `package` is in a store path: each chain of requirements from one of the recipe's
    (`requirements`, as the manifest records them) down to it, as [name, version] links."""

    path: str
    name: str
    package: str
    version: str
    chains: tuple[tuple[tuple[str, str], ...], ...]
    truncated: bool = False


def _marker_env(doc: dict[str, Any]) -> dict[str, str]:
    """The marker environment the path was installed for: this host's (the platform is part of its
    key), with the interpreter's implementation and version from its manifest."""
    from packaging.markers import default_environment

    env = {k: str(v) for k, v in default_environment().items()}  # every value a string already
    python = (doc.get("inputs") or {}).get("python") or {}
    version = str(python.get("version") or "")
    if re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", version):
        env["python_full_version"] = version
        env["python_version"] = ".".join(version.split(".")[:2])
    impl = str(python.get("implementation") or "")
    if impl:
        env["platform_python_implementation"] = impl
        env["implementation_name"] = impl.lower()
    return env


def _edges(req_text: str, extras: frozenset[str], env: dict[str, str]) -> tuple[str, frozenset[str]] | None:
    """(the required name, with its extras) if `req_text` applies here, given the extras its
    requirer was installed with; None when its marker excludes it or it does not parse."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(req_text)
    except InvalidRequirement:
        return None
    if req.marker is not None:
        try:
            if not any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
                return None
        except Exception:
            return None
    return normalize(req.name), frozenset(normalize(e) for e in req.extras)


def why(target: str, package: str, *, root: str | Path | None = None) -> Why:
    if not isinstance(package, str) or not _NAME_RE.fullmatch(package):
        raise UsageError(f"{shown(package)} is not a package name")
    p = _open(target, root)
    wanted = normalize(package)
    dists = installed(p.path)
    if wanted not in dists:
        raise NotFoundError(f"{package} is not installed in {p.name} (see `llmgw-store packages {p.name}`)")
    env = _marker_env(p.doc)
    recorded = p.doc.get("requirements")
    requirements = recorded if isinstance(recorded, list) else []
    starts = [e for e in (_edges(str(r), frozenset(), env) for r in requirements) if e is not None]
    chains: list[tuple[str, ...]] = []
    truncated = False
    # Depth-first over (name, extras); a name is never repeated inside one chain (no cycles), and
    # the walk stops at MAX_CHAINS chains or MAX_DEPTH links.
    stack: list[tuple[tuple[str, ...], frozenset[str]]] = [((n,), x) for n, x in reversed(starts) if n in dists]
    steps = 0
    while stack:
        steps += 1
        if steps > 200_000:
            truncated = True
            break
        chain, extras = stack.pop()
        here = chain[-1]
        if here == wanted:
            if chain not in chains:
                chains.append(chain)
                if len(chains) >= MAX_CHAINS:
                    truncated = bool(stack)
                    break
            continue
        if len(chain) >= MAX_DEPTH:
            truncated = True
            continue
        nexts = [e for e in (_edges(r, extras, env) for r in dists[here].requires) if e is not None]
        for name, sub in reversed(nexts):
            if name in dists and name not in chain:
                stack.append(((*chain, name), sub))
    if not chains:
        say(f"{wanted} is installed in {p.name} but no requirement chain of the recipe's reaches it")
    linked = tuple(tuple((n, dists[n].version) for n in c) for c in chains)
    return Why(str(p.path), p.name, wanted, dists[wanted].version, linked, truncated)


# --- export ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Export(Result):
    """A store path's recorded lock as a file another tool installs: `format` requirements (for
    `uv pip install --require-hashes -r`) or pylock (PEP 751, `pylock.toml`)."""

    path: str
    name: str
    format: str
    index_url: str
    text: str


def export(target: str, fmt: str = "requirements", *, root: str | Path | None = None) -> Export:
    if fmt not in FORMATS:
        raise UsageError(f"--format {shown(fmt)}: one of {', '.join(FORMATS)}")
    p = _open(target, root)
    lock_text, lock_format = str(p.doc.get("lock", "")), str(p.doc.get("lock_format", ""))
    if not lock_text:
        raise StoreError(f"{p.name} records no lock (a path built before locks were recorded)")
    index_url = str(p.doc.get("index_url") or (p.doc.get("inputs") or {}).get("index_url") or "")
    extra = ((p.doc.get("inputs") or {}).get("build") or {}).get("extra_index")
    as_of = str(p.doc.get("exclude_newer") or (p.doc.get("inputs") or {}).get("as_of") or "")
    if fmt == "pylock":
        text = lock_text if lock_format.endswith(".toml") else _pylock_from_requirements(p, lock_text, index_url)
        return Export(str(p.path), p.name, fmt, index_url, text)
    head = [f"# {p.name}: the lock it was installed from, resolved as {index_url} stood at {as_of}",
            f"# install: uv pip install --require-hashes -r THIS-FILE --index-url {index_url}"]
    if lock_format.endswith(".toml"):
        if extra:
            head.append(f"#          --extra-index-url {extra}   (the packages it served; the hashes pin every file)")
        body = "".join(f"{n}=={v['version']}" + "".join(f" \\\n    --hash={h}" for h in v["hashes"]) + "\n"
                       for n, v in sorted(locked_files(lock_text, lock_format).items()))
    else:
        body = lock_text if lock_text.endswith("\n") else lock_text + "\n"
    return Export(str(p.path), p.name, fmt, index_url, "\n".join(head) + "\n" + body)


def _pylock_from_requirements(p: _Opened, lock_text: str, index_url: str) -> str:
    """PEP 751 from a requirements lock: each pinned file looked up by its hash in the index the
    path was resolved from (its URL, name and upload time); a file the index no longer lists is
    an error, never a guess."""
    from llmgw_store.build.pypi import project_files

    python = str(((p.doc.get("inputs") or {}).get("python") or {}).get("version") or "")
    lines = ['lock-version = "1.0"', 'created-by = "llmgw-store"']
    if re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", python):
        lines.append(f'requires-python = "=={".".join(python.split(".")[:2])}.*"')
    for name, pin in sorted(locked_files(lock_text, "requirements.lock").items()):
        wanted = {h.removeprefix("sha256:") for h in pin["hashes"]}
        files = [f for f in project_files(index_url, name) if f.sha256 in wanted]
        if not files:
            raise StoreError(f"{name} {pin['version']}: none of its locked files is listed by {index_url} any "
                             "more; export --format requirements instead")
        lines += ["", "[[packages]]", f"name = {toml_string(name)}", f"version = {toml_string(pin['version'])}",
                  f"index = {toml_string(index_url)}"]
        wheels = [f for f in files if f.filename.endswith(".whl")]
        sdists = [f for f in files if not f.filename.endswith(".whl")]
        if wheels:
            lines.append("wheels = [")
            lines += [f"  {{ name = {toml_string(f.filename)}, url = {toml_string(f.url)}, "
                      f"hashes = {{ sha256 = {toml_string(str(f.sha256))} }} }}," for f in wheels]
            lines.append("]")
        if sdists:
            f = sdists[0]
            lines.append(f"sdist = {{ name = {toml_string(f.filename)}, url = {toml_string(f.url)}, "
                         f"hashes = {{ sha256 = {toml_string(str(f.sha256))} }} }}")
    return "\n".join(lines) + "\n"


def toml_string(value: str) -> str:
    """A TOML basic string. Not JSON's escaping: JSON writes a character outside the BMP as a
    surrogate pair (``\\ud83d\\ude00``), which TOML rejects, and leaves DEL raw, which TOML
    forbids in a string. Every control character and DEL is escaped; everything else is itself."""
    out = []
    for ch in value:
        o = ord(ch)
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
