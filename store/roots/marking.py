"""What gc keeps: every root (roots/gc.py lists the kinds) and the closure of what they hold.

`roots` reads them (the runtime ones from roots/liveroots.py), `closure` adds what they reference,
`adopt_unregistered` registers again a complete directory the index lost so that it is judged like
any registered path, and `print_roots` answers `gc --print-roots` under the gc lock.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result, fields_of
from llmgw_store.base.errors import DiskFullError, NoStoreError
from llmgw_store.base.report import say
from llmgw_store.core.keys import is_store_name
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import split_generation_link
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.temproots import gc_lock, read_all
from llmgw_store.roots.liveroots import runtime_roots


@dataclass(frozen=True)
class Root:
    """One gc root and the store path names it holds directly. `kind` is one of
    generation (with `profile`, `generation`), pin (with `pin`), hold (with `profile`: roots/holds.py), temp (builds and activations in
    flight), process (with `pid`: a running process uses the paths) and uv (the store's pinned uv);
    the fields a kind does not have are None and left out of its JSON."""

    kind: str
    paths: tuple[str, ...]
    profile: str | None = None
    generation: int | None = None
    pin: str | None = None
    pid: int | None = None

    @property
    def description(self) -> str:
        """The root in words, for people (`gc --print-roots`)."""
        return {"generation": f"profile {self.profile} generation {self.generation}", "pin": f"pin {self.pin}",
                "hold": f"hold of profile {self.profile}",
                "temp": "temp roots of live processes", "process": f"in use by pid {self.pid}",
                "uv": "the store's pinned uv"}[self.kind]

    def body(self) -> dict[str, Any]:
        return {k: v for k, v in fields_of(self).items() if v is not None}




def roots(store: Store, excluded_generations: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset(),
          temp: set[str] | None = None) -> list[Root]:
    """Every root and the store path names it holds directly. `temp`: the names live temp roots
    hold, when the caller has read them (under the gc lock) already."""
    from llmgw_store.build.uv import UV_VERSION
    from llmgw_store.roots.holds import list_holds
    from llmgw_store.roots.pins import list_pins

    layout = store.layout
    out: list[Root] = []
    for entry in sorted(os.scandir(layout.profiles) if layout.profiles.is_dir() else [], key=lambda e: e.name):
        gen = split_generation_link(entry.name)
        if gen and entry.is_symlink() and gen not in excluded_generations:
            out.append(Root("generation", (os.readlink(entry.path).rpartition("/")[2],), profile=gen[0],
                            generation=gen[1]))
    for pin, name in sorted(list_pins(layout).items()):
        out.append(Root("pin", (name,), pin=pin))
    for profile, name in sorted(list_holds(layout).items()):
        out.append(Root("hold", (name,), profile=profile))
    live = read_all(layout)[0] if temp is None else temp
    if live:
        out.append(Root("temp", tuple(sorted(live))))
    by_pid: dict[int, set[str]] = {}
    for name, pids in runtime_roots(layout).items():
        for pid in pids:
            by_pid.setdefault(int(pid), set()).add(name)
    out += [Root("process", tuple(sorted(names)), pid=pid) for pid, names in sorted(by_pid.items())]
    uv = [r.name for r in store.index.paths() if r.engine == "uv" and r.version == UV_VERSION]
    if uv:
        out.append(Root("uv", tuple(uv)))
    return out


def held_names(found: list[Root]) -> set[str]:
    """Every store path name the roots hold directly."""
    return {n for r in found for n in r.paths}


@dataclass(frozen=True)
class Roots(Result):
    """Each gc root and the store paths it holds (closure included): `gc --print-roots`."""

    roots: tuple[Root, ...]

    def body(self) -> dict[str, Any]:
        return {"roots": [r.body() for r in self.roots]}


def closure(store: Store, names: set[str]) -> set[str]:
    """The roots and what they reference (recorded at registration, read from the index)."""
    live = set(names) | set(store.index.closure(names))
    # a build in flight is rooted by its final name; its .partial is live with it
    return live | {n + ".partial" for n in live}


def adopt_unregistered(store: Store, busy: set[str], spared: set[str]) -> list[str]:
    """Register again each complete directory of store/ that the index does not know (Store.adopt,
    tree rehashed), so that it, and what it references, is judged like any registered path: kept
    when a root holds it, collected when none does. Called with the gc lock held exclusively: no
    temp root can be added, so a directory no live temp root names has no builder (a builder adds
    its temp root before it takes the key's lock) and nothing else writes it meanwhile."""
    known = {r.name for r in store.index.paths()}
    adopted = []
    for entry in os.scandir(store.layout.store):
        name = entry.name
        if (name in known or name in busy or not is_store_name(name)
                or not entry.is_dir(follow_symlinks=False)):
            continue
        try:
            why = store.adopt(name, rehash=True, busy=busy)
        except DiskFullError:
            # Not registered, so its references are unknown: kept whole until a gc can record it.
            say(f"kept {name} for now: complete but not in the index, which the full disk keeps from recording it")
            spared.add(name)
            continue
        if why is None:
            say(f"registered {name} again from its manifest (complete, but not in the index)")
            adopted.append(name)
    return adopted


def print_roots(*, root: str | Path | None = None, lock_timeout: float = LOCK_TIMEOUT_S) -> Roots:
    """Each root and the store paths it holds (closure included), as gc would see them now."""
    try:
        store = Store.open(root, lock_timeout)
    except NoStoreError as exc:
        say(exc.nothing_to("hold"))
        return Roots(())
    with store, gc_lock(store.layout, shared=False, timeout=lock_timeout):
        return Roots(tuple(dataclasses.replace(r, paths=tuple(sorted(
            n for n in closure(store, set(r.paths)) if not n.endswith(".partial")))) for r in roots(store)))
