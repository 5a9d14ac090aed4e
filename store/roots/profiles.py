"""Profiles: named, numbered generations of store paths, switched atomically.

    ROOT/profiles/vllm            -> vllm-7-link        (the current generation)
    ROOT/profiles/vllm-7-link     -> ../store/<key>-vllm-0.6.3-cu128
    ROOT/profiles/vllm-6-link     -> ../store/<key>-vllm-0.6.2-cu128

All links are relative, so a store root can be moved or mounted elsewhere.

Invariants:
- Switching writes a temporary symlink and renames it over `ROOT/profiles/<p>`; rename(2) replaces
  the link atomically, so a reader resolving the profile sees the old or the new generation, never
  neither. A generation link is made the same way before the profile points at it.
- The profile's lock (`var/locks/profile-<p>.lock`) is held for every change to a profile, so two
  activations serialise and a number is taken once; numbers are never reused (the next is one past
  the highest ever seen on disk or in the index).
- The links on disk are the truth. The index records each generation and each switch for
  history; `generations` compares the two and repairs the index where it differs.
- The target store path is a temp root of this process before it is checked and linked, so gc
  cannot take it between the check and the link.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llmgw_store.core import debug, locks
from llmgw_store.core.errors import NotFoundError, UsageError
from llmgw_store.core.layout import Layout
from llmgw_store.core.links import symlink_atomically
from llmgw_store.core.local_store import Store
from llmgw_store.core.names import check_generation, check_profile
from llmgw_store.core.report import say
from llmgw_store.core.results import Result
from llmgw_store.core.temproots import TempRoots
from llmgw_store.roots.generations import current_generation, disk_generations, gen_link, generation_target
from llmgw_store.roots.resolve import reference, registered


@dataclass(frozen=True)
class Switch(Result):
    """What activate and rollback did: `profile` now at `generation` (from `previous`)."""

    profile: str
    generation: int
    previous: int | None
    path: str
    changed: bool


@dataclass(frozen=True)
class Generation(Result):
    number: int
    path: str
    name: str
    created: str
    current: bool
    engine: str | None
    version: str | None
    variant: str | None



@dataclass(frozen=True)
class GenerationList(Result):
    profile: str
    current: int
    generations: tuple[Generation, ...]
    index_differs: tuple[str, ...]  # where the index's record differs from the links


@dataclass(frozen=True)
class DeletedGenerations(Result):
    profile: str
    deleted: tuple[int, ...]
    dry_run: bool
    current: int


@dataclass(frozen=True)
class ProfileSummary(Result):
    profile: str
    current: int
    generations: int
    path: str


@dataclass(frozen=True)
class ProfileList(Result):
    profiles: tuple[ProfileSummary, ...]

    def to_json(self) -> list[dict[str, Any]]:
        return [p.to_json() for p in self.profiles]


def profile_lock(store: Store, profile: str, timeout: float = locks.LOCK_TIMEOUT_S):
    """The profile's lock: held for every change to its links, so two changes serialise."""
    return locks.hold(store.layout.locks, f"profile-{profile}", f"changing profile {profile}", timeout)


def _switch(store: Store, profile: str, number: int) -> None:
    symlink_atomically(f"{profile}-{number}-link", store.layout.profiles / profile)
    debug.pause("AFTER_SWITCH")  # switched, index not yet told


def activate(
    profile: str,
    target: str | Path,
    *,
    root: str | Path | None = None,
    lock_timeout: float = locks.LOCK_TIMEOUT_S,
) -> Switch:
    """Make `target` (a store path, its name or key, PROFILE or PROFILE@N) the profile's current
    generation. Activating what is already current makes no new generation. (`llmgw_store.api.activate`
    also takes a recipe: it builds first, then calls this.) Each lock is waited for at most
    `lock_timeout` s."""
    check_profile(profile)
    with Store.open(root, lock_timeout) as store:
        name = reference(store, str(target))["name"]
        TempRoots(store.layout).add(name, lock_timeout)
        # Checked again now that gc can no longer take it.
        row = registered(store, name)
        if not store.layout.path_of(row["name"]).is_dir():
            raise NotFoundError(f"{name} is registered but missing on disk; build it again")
        with profile_lock(store, profile, lock_timeout):
            layout = store.layout
            _clear_temporaries(layout, profile)
            gens = disk_generations(layout, profile)
            _sync_index(store, profile, gens, write=True)
            try:
                current = current_generation(layout, profile)
            except NotFoundError:
                current = None
            if current is not None and gens.get(current) == name:
                return Switch(profile, current, current, str(layout.path_of(name)), False)
            number = max([*gens, store.index.max_generation(profile), 0]) + 1
            symlink_atomically(f"../store/{name}", gen_link(layout, profile, number))
            debug.pause("BEFORE_SWITCH")  # the new generation exists, the profile not yet switched
            _switch(store, profile, number)
            store.index.record_generation(profile, number, name, _link_time(gen_link(layout, profile, number)))
            store.index.record_switch(profile, current, number, "activate")
            say(f"profile {profile}: generation {number} -> {name}")
            return Switch(profile, number, current, str(layout.path_of(name)), True)


def rollback(profile: str, *, to: int | None = None, root: str | Path | None = None,
             lock_timeout: float = locks.LOCK_TIMEOUT_S) -> Switch:
    """Switch to generation `to`, or to the newest generation older than the current one."""
    check_profile(profile)
    if to is not None:
        check_generation(to)
    with Store.open(root, lock_timeout) as store:
        with profile_lock(store, profile, lock_timeout):
            layout = store.layout
            current = current_generation(layout, profile)
            gens = disk_generations(layout, profile)
            if to is None:
                older = [n for n in gens if n < current]
                if not older:
                    raise NotFoundError(f"profile {profile!r} has no generation before {current} to roll back to")
                to = max(older)
            name = generation_target(layout, profile, to)
            if not layout.path_of(name).is_dir():
                raise NotFoundError(f"generation {to} of {profile!r} points at {name}, which is no longer in the store")
            if to != current:
                _switch(store, profile, to)
                store.index.record_switch(profile, current, to, "rollback")
                say(f"profile {profile}: generation {current} -> {to} ({name})")
            return Switch(profile, to, current, str(layout.path_of(name)), to != current)


def generations(profile: str, *, root: str | Path | None = None,
                lock_timeout: float = locks.LOCK_TIMEOUT_S) -> GenerationList:
    """The profile's generations from disk (the truth), and where the index differs from them
    (the next change of the profile, or `doctor --rebuild-index`, records it). Read-only."""
    check_profile(profile)
    with Store.open(root, lock_timeout, readonly=True) as store:
        layout = store.layout
        current = current_generation(layout, profile)
        gens = disk_generations(layout, profile)
        differs = _sync_index(store, profile, gens, write=False)
        out = []
        for number, name in gens.items():
            row = store.index.path_by_name(name) or {}
            out.append(Generation(
                number=number, path=str(layout.path_of(name)), name=name,
                created=_link_time(gen_link(layout, profile, number)), current=number == current,
                engine=row.get("engine"), version=row.get("version"), variant=row.get("variant"),
            ))
        return GenerationList(profile, current, tuple(out), tuple(differs))


def delete_generations(
    profile: str,
    *,
    numbers: list[int] | None = None,
    older_than: float | None = None,
    keep: int | None = None,
    dry_run: bool = False,
    root: str | Path | None = None,
    lock_timeout: float = locks.LOCK_TIMEOUT_S,
) -> DeletedGenerations:
    """Delete generation links (never the current one). Store paths are freed by a later gc."""
    check_profile(profile)
    for n in numbers or []:
        check_generation(n)
    with Store.open(root, lock_timeout) as store:
        with profile_lock(store, profile, lock_timeout):
            return delete_generations_locked(store, profile, numbers, older_than, keep, dry_run)


def delete_generations_locked(store: Store, profile: str, numbers, older_than, keep, dry_run) -> DeletedGenerations:
    layout = store.layout
    current = current_generation(layout, profile)
    gens = disk_generations(layout, profile)
    doomed: set[int] = set()
    for n in numbers or []:
        if n not in gens:
            raise NotFoundError(f"profile {profile!r} has no generation {n} (it has: {', '.join(map(str, gens))})")
        if n == current:
            raise UsageError(f"refusing to delete generation {n} of {profile!r}: it is the current one (roll back first)")
        doomed.add(n)
    if older_than is not None:
        cutoff = time.time() - older_than
        doomed |= {n for n in gens if n != current and os.lstat(gen_link(layout, profile, n)).st_mtime < cutoff}
    if keep is not None:
        if keep < 1:
            raise UsageError("--keep must be at least 1")
        newest = sorted(gens, reverse=True)[:keep]
        doomed |= {n for n in gens if n not in newest and n != current}
    for n in sorted(doomed):
        say(f"{'would remove' if dry_run else 'removing'} generation {n} of {profile} ({gens[n]})")
        if not dry_run:
            os.unlink(gen_link(layout, profile, n))
            store.index.mark_generation_deleted(profile, n)
    return DeletedGenerations(profile, tuple(sorted(doomed)), dry_run, current)


def list_profiles(*, root: str | Path | None = None) -> ProfileList:
    with Store.open(root, readonly=True) as store:
        out = []
        for entry in sorted(os.scandir(store.layout.profiles), key=lambda e: e.name):
            if entry.name.startswith(".") or entry.name.endswith("-link") or not entry.is_symlink():
                continue
            current = current_generation(store.layout, entry.name)
            gens = disk_generations(store.layout, entry.name)
            out.append(ProfileSummary(entry.name, current, len(gens), str(store.layout.path_of(gens.get(current, "?")))))
        return ProfileList(tuple(out))


def _sync_index(store: Store, profile: str, gens: dict[int, str], *, write: bool) -> list[str]:
    """Where the index's record of the profile's generations differs from the links (a change
    killed between link and record): said, and with `write` (under the profile's lock) repaired."""
    rows = store.index.generation_rows(profile)
    differs = []
    for n, name in gens.items():
        row = rows.get(n)
        if row is None or row["deleted"] or row["name"] != name:
            if write:
                store.index.record_generation(profile, n, name, _link_time(gen_link(store.layout, profile, n)))
            differs.append(f"generation {n} was on disk but not in the index")
    for n, row in rows.items():
        if n not in gens and not row["deleted"]:
            if write:
                store.index.mark_generation_deleted(profile, n)
            differs.append(f"generation {n} was in the index but not on disk")
    return differs


def _clear_temporaries(layout: Layout, profile: str) -> None:
    """Temporary links left by an activation that was killed (we hold the profile's lock)."""
    pat = re.compile(rf"^\.{re.escape(profile)}(-\d+-link)?\.tmp-\d+$")
    for entry in os.scandir(layout.profiles):
        if pat.match(entry.name):
            os.unlink(entry.path)


def _link_time(link: Path) -> str:
    return datetime.fromtimestamp(os.lstat(link).st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
