"""Holds: a profile held at a store path ignores its release until released,
`ROOT/holds/<profile> -> ../store/<path>` (a gc root, made the way pins are: temp root, check
again, then the link).

A hold is the node's own decision over the builder's: `activate PROFILE --release NAME` and the
config-driven follow (`releases = {PROFILE = NAME}`) of a held profile switch nothing and say
"held at …" (exit 0); a hand `activate PROFILE TARGET` or `rollback` still works. The link is the
truth; its mtime is when the hold was made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from llmgw_store.app.results import Result
from llmgw_store.base.errors import EX_OK, LockTimeout, NotFoundError, StoreError
from llmgw_store.core import locks
from llmgw_store.core.keys import key_of_name
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import profile_lock_name
from llmgw_store.core.names import check_profile
from llmgw_store.core.temproots import TempRoots
from llmgw_store.roots.generations import current_generation
from llmgw_store.roots.resolve import reference, registered
from llmgw_store.system.files import symlink_atomically


def holds_dir(layout: Layout) -> Path:
    return layout.holds


@dataclass(frozen=True)
class Hold(Result):
    profile: str
    name: str  # the store path name it is held at
    key: str | None  # None: the hold's link names no store path (it was changed outside the store)
    path: str
    since: str | None = None  # when the hold was made (ISO, UTC)
    removed: bool = False


class Held(StoreError):
    """A follow found the profile held (under the profile's lock, roots/profiles.activate): nothing
    switched. Not a failure (exit 0): the CLI says "held at …"."""

    exit_code = EX_OK

    def __init__(self, hold: Hold):
        super().__init__(f"{hold.profile} is held at {hold.name}: nothing switched (`llmgw-store unhold "
                         f"{hold.profile}` to follow its release again)")
        self.hold = hold


def _since(link: Path) -> str:
    return datetime.fromtimestamp(link.lstat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def hold(profile: str, target: str | None = None, *, root: str | Path | None = None,
         lock_timeout: float = locks.LOCK_TIMEOUT_S) -> Hold:
    """Hold `profile` at `target` (a store path, its name or key, PROFILE@N); by default at its
    current generation. A target that is not the current generation is activated after the hold
    is made (api.hold), so no follow can move the profile in between."""
    check_profile(profile)
    with Store.open(root, lock_timeout) as store:
        layout = store.layout
        if target is None:
            current_generation(layout, profile)  # NotFoundError naming the profile when it has none
        name = reference(store, profile if target is None else str(target)).name
        TempRoots(layout).add(name, lock_timeout)
        registered(store, name)  # still there now that gc cannot take it
        layout.ensure_holds()
        link = holds_dir(layout) / profile
        # Under the profile's lock (roots/profiles.profile_lock): a follow checks for a hold under it
        # before it switches, so a hold made while a follow runs is seen by it.
        with locks.hold(layout.locks, profile_lock_name(profile), f"changing profile {profile}", lock_timeout):
            if target is None and reference(store, profile).name != name:
                raise LockTimeout(f"profile {profile} switched while it was being held: nothing held; hold it again")
            symlink_atomically(f"../store/{name}", link)
        return Hold(profile, name, key_of_name(name), str(layout.path_of(name)), _since(link))


def unhold(profile: str, *, root: str | Path | None = None) -> Hold:
    """Release the hold: the next follow moves the profile to its release again."""
    check_profile(profile)
    layout = Layout.at(root)
    layout.check()
    link = holds_dir(layout) / profile
    if not link.is_symlink():
        raise NotFoundError(f"{profile} is not held (no {link})")
    name = Path(os.readlink(link)).name
    since = _since(link)
    os.unlink(link)
    return Hold(profile, name, key_of_name(name), str(layout.path_of(name)), since, removed=True)


def held(layout: Layout, profile: str) -> Hold | None:
    """The hold of `profile`, or None."""
    link = holds_dir(layout) / profile
    if not link.is_symlink():
        return None
    name = Path(os.readlink(link)).name
    return Hold(profile, name, key_of_name(name), str(layout.path_of(name)), _since(link))


def list_holds(layout: Layout) -> dict[str, str]:
    """profile -> store path name, from the links on disk."""
    folder = holds_dir(layout)
    out = {}
    for entry in os.scandir(folder) if folder.is_dir() and not folder.is_symlink() else []:
        if entry.is_symlink() and not entry.name.startswith("."):
            out[entry.name] = Path(os.readlink(entry.path)).name
    return out
