"""Packages from an extra index that serves no upload dates (PyTorch's: uv issue 16846).

`--exclude-newer` cannot bound a file whose index does not say when it was uploaded (uv 0.13 then
drops every such file, and the build cannot resolve). So each of `index_packages` is either:
- pinned exactly, by `index_pins = { torch = "2.9.1+cu128" }` (or a table with `version` and
  `sha256`, the digests its wheels may have), by `torch==2.9.1+cu128` in `requirements`, or by
  `torch = "from-main-index"` (the version a date-bound resolution on the main index gives: the
  engine's own pin, taken from its metadata as the main index stood at asOf): the pin
  becomes a requirement, and the package is exempt from the date filter
  (`--exclude-newer-package torch=false`): the pin, not a date, decides what resolves. Every other
  package stays bound by `--exclude-newer`;
- or not pinned, and then its index must publish upload times for it (asked once per build, PEP
  691 JSON); if it publishes none the build is refused (exit 2) naming the package and the pin to add.
After resolving, the lock is checked against every pin (version, and digests where given).

Pins are part of the recipe's fields (and so of the key); `pinned` is computed from them alone, so a
rebuild from a recorded lock (repair, `build --check`) writes the same pyproject the build wrote.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from llmgw_store.base.errors import IntegrityError, NetworkError, RecipeError, UsageError
from llmgw_store.base.report import say
from llmgw_store.base.text import shown
from llmgw_store.build.lockfiles import normalize

MAX_SHOWN_VERSIONS = 8
# index_pins = { torch = "from-main-index" }: the version a date-bound resolution of the build's
# requirements on the main index gives (the engine's own pin, e.g. vllm's torch==2.9.0), pinned on
# the extra index (2.9.0 takes 2.9.0+cu128 there).
FROM_MAIN = "from-main-index"


@dataclass(frozen=True)
class Pin:
    project: str  # normalised
    version: str
    sha256: tuple[str, ...] = ()  # empty: any file of that version
    from_requirements: bool = False


def to_derive(fields: dict) -> list[str]:
    """The (normalised) packages whose pin is FROM_MAIN."""
    return sorted(normalize(n) for n, v in fields.get("index_pins", {}).items()
                  if FROM_MAIN in (v, v.get("version") if isinstance(v, dict) else None))


def derived(lock_text: str, lock_name: str, names: list[str], origin, where: str) -> dict[str, str]:
    """name -> the public version (no `+local`) that `lock_text` holds for each of `names`: from the
    main-index resolution when resolving, from the recorded lock when rebuilding (the same version:
    the pin `==V` took `V+local`), so both write the same pyproject."""
    from packaging.version import InvalidVersion, Version

    from llmgw_store.build.lockfiles import pins as lock_pins

    locked = lock_pins(lock_text, lock_name)
    out = {}
    for name in names:
        if name not in locked:
            raise RecipeError(origin, f"{where}.index_pins.{name}", f"\"{FROM_MAIN}\": nothing the build requires "
                              f"needs {name} (the main index's resolution has none); pin a version instead")
        try:
            out[name] = Version(locked[name]).public
        except InvalidVersion:
            raise RecipeError(origin, f"{where}.index_pins.{name}", f"{shown(locked[name])} is not a PEP 440 "
                              "version") from None
    return out


def pinned(fields: dict, requirements: list[str], origin, where: str,
           derived_versions: dict[str, str] | None = None) -> dict[str, Pin]:
    """Normalised name -> Pin for each of `index_packages` that `index_pins` or an exact `==`
    requirement pins (the two must agree when both are given). Requirements are those the
    builder already checked (PEP 508 strings). A FROM_MAIN pin takes its version from
    `derived_versions` (see `derived`)."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    packages = {normalize(p) for p in fields.get("index_packages", [])}
    out: dict[str, Pin] = {}
    for line in requirements:
        req = Requirement(line)
        name = normalize(req.name)
        if name in packages and req.marker is not None:
            # A marker can make the pin inactive (`dual==1.0; python_version<'3'`): uv then takes
            # the package from the main index, unpinned and unbounded by the date. Refused.
            raise RecipeError(origin, f"{where}.requirements", f"{shown(line, 120)} names {name}, one of "
                              "index_packages, with an environment marker; a requirement of an index package "
                              f"must hold on every host: drop the marker or pin it with index_pins = {{ {name} = "
                              "\"VERSION\" }")
        specs = list(req.specifier)
        if name in packages and len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            out[name] = Pin(name, specs[0].version, from_requirements=True)
    for raw, value in fields.get("index_pins", {}).items():
        name = normalize(raw)
        version, digests = (value, ()) if isinstance(value, str) else (value["version"], tuple(_digests(value)))
        if version == FROM_MAIN:
            version = (derived_versions or {}).get(name, version)
        try:
            Version(version)
        except InvalidVersion:
            raise RecipeError(origin, f"{where}.index_pins.{raw}", f"{shown(version)} is not a PEP 440 version") from None
        if name in out and Version(out[name].version) != Version(version):
            raise RecipeError(origin, f"{where}.index_pins.{raw}", f"pins {version}, but requirements pin "
                              f"{name}=={out[name].version}; give one version")
        out[name] = Pin(name, version, digests)
    return out


def _digests(value: dict) -> list[str]:
    d = value.get("sha256", [])
    return [d] if isinstance(d, str) else list(d)


def requirements_with_pins(requirements: list[str], pins: dict[str, Pin]) -> list[str]:
    """`requirements` and, for each pin not already a requirement, `name==version`."""
    extra = [f"{p.project}=={p.version}" for p in pins.values() if not p.from_requirements]
    return requirements + extra


def exempt_args(pins: dict[str, Pin]) -> list[str]:
    """uv arguments that lift the date filter from the pinned packages only (uv >= 0.9:
    `--exclude-newer-package NAME=false`). Names are PEP 503 normalised project names."""
    out = []
    for name in sorted(pins):
        out += ["--exclude-newer-package", f"{name}=false"]
    return out


def check_index(index_url: str, fields: dict, pins: dict[str, Pin], origin, where: str) -> None:
    """Ask the extra index about each of `index_packages` (before resolving): an unpinned one must
    have upload times there, a pinned one its pinned version (and a file with a pinned digest).
    RecipeError (exit 2) naming the package otherwise."""
    from llmgw_store.build import pypi

    for raw in fields.get("index_packages", []):
        name = normalize(raw)
        pin = pins.get(name)
        try:
            files = pypi.project_files(index_url, name)
        except UsageError:
            raise RecipeError(origin, f"{where}.index_packages", f"the extra index {index_url} has no project "
                              f"{name!r}") from None
        except NetworkError as exc:
            if pin is not None:
                say(f"cannot list {name} on {index_url} ({exc}); the resolution checks the pin")
                continue
            raise RecipeError(origin, f"{where}.index_pins", f"cannot tell whether {index_url} publishes upload "
                              f"times for {name} ({exc}); pin it exactly: index_pins = {{ {name} = \"VERSION\" }}") from None
        if pin is None:
            if files and not any(f.upload_time for f in files):
                latest = _versions(files)[:1]
                example = latest[0] if latest else "VERSION"
                raise RecipeError(origin, f"{where}.index_pins",
                                  f"{name} comes from {index_url}, which publishes no upload-time for it, so the "
                                  f"resolution date cannot bound it (uv issue 16846): pin it exactly, e.g. "
                                  f"index_pins = {{ {name} = \"{example}\" }} or {name}=={example} in requirements, or "
                                  f"{name} = \"{FROM_MAIN}\" for the version the engine gets on the main index")
            continue
        mine = [f for f in files if _matches(f.version, pin.version)]
        if not mine:
            have = ", ".join(_versions(files)[:MAX_SHOWN_VERSIONS]) or "nothing"
            raise RecipeError(origin, f"{where}.index_pins", f"the extra index {index_url} has no {name} {pin.version} "
                              f"(it has: {have})")
        if pin.sha256 and not any(f.sha256 in pin.sha256 for f in mine):
            raise RecipeError(origin, f"{where}.index_pins", f"no file of {name} {pin.version} on {index_url} has a "
                              f"pinned sha256 ({', '.join(d[:12] + '…' for d in pin.sha256)})")
        say(f"{name} pinned to {pin.version}" + (" and its sha256" if pin.sha256 else "")
            + f": exempt from the resolution date on {index_url}")


def check_lock(lock_text: str, pins: dict[str, Pin]) -> None:
    """Every pinned package is in the lock at its pinned version, and where digests are pinned
    every file the lock records for it has one of them. IntegrityError otherwise. (Only a build
    with an extra index has pins, and its lock is a pylock.toml.)"""
    if not pins:
        return
    doc = tomllib.loads(lock_text)
    locked = {normalize(p.get("name", "")): p for p in doc.get("packages", [])}
    for name, pin in pins.items():
        p = locked.get(name)
        if p is None or not _matches(str(p.get("version", "")), pin.version):
            got = "nothing" if p is None else shown(str(p.get("version")))
            raise IntegrityError(f"the lock resolved {name} to {got}, not the pinned {pin.version}")
        if pin.sha256:
            files = list(p.get("wheels", [])) + ([p["sdist"]] if "sdist" in p else [])
            for f in files:
                digest = (f.get("hashes") or {}).get("sha256")
                if digest not in pin.sha256:
                    raise IntegrityError(f"the lock's {name} {pin.version} file {shown(str(f.get('url', '?')), 200)} has "
                                         f"sha256 {shown(str(digest), 80)}, which index_pins does not list")


def _matches(version: str | None, pin: str) -> bool:
    """PEP 440 `==pin`: `2.9.1` takes `2.9.1+cu128` too; `2.9.1+cu128` only itself."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version is None:
        return False
    try:
        return SpecifierSet(f"=={pin}").contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def _versions(files) -> list[str]:
    from packaging.version import InvalidVersion, Version

    seen = set()
    for f in files:
        try:
            seen.add(Version(f.version))
        except (InvalidVersion, TypeError):
            continue
    return [str(v) for v in sorted(seen, reverse=True)]

