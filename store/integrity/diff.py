"""What changes between two environments, read from their locks: what an operator checks before
switching vLLM versions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from llmgw_store.app.results import Result
from llmgw_store.build import lockfiles
from llmgw_store.core import manifest
from llmgw_store.core.local_store import Store
from llmgw_store.roots.resolve import reference


class Side(TypedDict):  # one side of the diff: its store path name and size (bytes)
    name: str
    size: int


@dataclass(frozen=True)
class Diff(Result):
    a: Side
    b: Side
    added: tuple[dict[str, str], ...]  # name, version
    removed: tuple[dict[str, str], ...]
    upgraded: tuple[dict[str, str], ...]  # name, from, to
    downgraded: tuple[dict[str, str], ...]
    size_change: int


def lock_pins(env: Path) -> dict[str, str]:
    """Package -> version from an environment's lock, whichever format it has."""
    for name in ("pylock.toml", "requirements.lock"):
        try:  # bounded, never through a link (what a signed object ships is read so)
            text = manifest.read_meta_file(env, name).decode("utf-8", "replace")
        except ValueError:
            continue
        return lockfiles.pins(text, name)
    return {}


def diff(a: str, b: str, *, root: str | Path | None = None) -> Diff:
    from packaging.version import InvalidVersion, Version

    with Store.open(root, readonly=True) as store:
        ra, rb = reference(store, a), reference(store, b)
        pa = lock_pins(store.layout.path_of(ra.name))
        pb = lock_pins(store.layout.path_of(rb.name))
    upgraded: list[dict[str, str]] = []
    downgraded: list[dict[str, str]] = []
    for name in sorted(pa.keys() & pb.keys()):
        if pa[name] == pb[name]:
            continue
        try:
            up = Version(pb[name]) > Version(pa[name])
        except InvalidVersion:
            up = pb[name] > pa[name]
        (upgraded if up else downgraded).append({"name": name, "from": pa[name], "to": pb[name]})
    return Diff(
        a={"name": ra.name, "size": ra.size},
        b={"name": rb.name, "size": rb.size},
        added=tuple({"name": n, "version": pb[n]} for n in sorted(pb.keys() - pa.keys())),
        removed=tuple({"name": n, "version": pa[n]} for n in sorted(pa.keys() - pb.keys())),
        upgraded=tuple(upgraded),
        downgraded=tuple(downgraded),
        size_change=rb.size - ra.size,
    )
