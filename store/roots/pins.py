"""Pins: gc roots that are not profiles, `ROOT/gcroots/<name> -> ../store/<path>`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.app.results import Result
from llmgw_store.base.errors import NotFoundError
from llmgw_store.core.local_store import Store
from llmgw_store.core.locks import LOCK_TIMEOUT_S
from llmgw_store.core.names import check_pin
from llmgw_store.core.temproots import TempRoots
from llmgw_store.roots.resolve import reference, registered
from llmgw_store.system.files import symlink_atomically


@dataclass(frozen=True)
class PinResult(Result):
    pin: str
    path: str
    removed: bool = False


def pin(name: str, target: str | Path, *, root: str | Path | None = None,
        lock_timeout: float = LOCK_TIMEOUT_S) -> PinResult:
    """Pin `target` (a store path, its name or key, PROFILE or PROFILE@N) as `name`."""
    check_pin(name)
    with Store.open(root, lock_timeout) as store:
        path_name = reference(store, str(target)).name
        TempRoots(store.layout).add(path_name, lock_timeout)
        registered(store, path_name)  # still there now that gc cannot take it
        symlink_atomically(f"../store/{path_name}", store.layout.gcroots / name)
        store.index.record_pin(name, path_name)
        return PinResult(name, str(store.layout.path_of(path_name)))


def unpin(name: str, *, root: str | Path | None = None, lock_timeout: float = LOCK_TIMEOUT_S) -> PinResult:
    check_pin(name)
    with Store.open(root, lock_timeout) as store:
        link = store.layout.gcroots / name
        if not link.is_symlink():
            raise NotFoundError(f"no pin {name!r} in {store.layout.gcroots}")
        target = Path(os.readlink(link)).name
        os.unlink(link)
        store.index.record_pin(name, None)
        return PinResult(name, str(store.layout.path_of(target)), removed=True)


def list_pins(layout) -> dict[str, str]:
    """pin name -> store path name, from the links on disk."""
    out = {}
    for entry in os.scandir(layout.gcroots) if layout.gcroots.is_dir() else []:
        if entry.is_symlink() and not entry.name.startswith("."):
            out[entry.name] = Path(os.readlink(entry.path)).name
    return out
