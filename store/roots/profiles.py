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
- Every generation has a record beside its link (records.py): made before the profile switches to
  it, kept when the generation is deleted (it is then "cold"), removed only by `--forget` or the
  `keep_records` bound. A cold generation comes back through `llmgw_store.api.rollback`, which
  rebuilds (or pulls) its store path from the record and then calls `rollback` here.
- A check (`activate --check`, or the recipe's `health`) runs in the target before the profile's
  lock is taken; the profile is changed only if it passes. With `then_check` the profile switches
  first and the check runs with the lock held, so nothing else can switch the profile meanwhile;
  if it fails, times out or is interrupted, the profile is switched back (one atomic rename) before
  the lock is released. A SIGKILL in between leaves the profile at the old or the new generation,
  both complete; the new one's record then says its check never finished.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.results import Result
from llmgw_store.base.errors import IntegrityError, NotFoundError, UsageError
from llmgw_store.base.report import say
from llmgw_store.core import locks
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import LINK_SUFFIX, generation_link, is_generation_link, profile_lock_name
from llmgw_store.core.names import check_generation, check_profile
from llmgw_store.core.temproots import TempRoots
from llmgw_store.roots import health, holds, records
from llmgw_store.roots.generations import (
    current_generation,
    disk_generations,
    gen_link,
    generation_target,
    scan_profile,
)
from llmgw_store.roots.resolve import reference, registered
from llmgw_store.system.files import symlink_atomically
from llmgw_store.system.signals import Window


@dataclass(frozen=True)
class Switch(Result):
    """What activate and rollback did: `profile` now at `generation` (from `previous`)."""

    profile: str
    generation: int
    previous: int | None
    path: str
    changed: bool
    check: dict[str, Any] | None = None  # the check that ran (argv, mode, result, exit, timed_out, seconds, tail)
    rebuilt: str | None = None  # a cold generation brought back: "built" (from its record), "substituted", ...


@dataclass(frozen=True)
class Generation(Result):
    """One generation of a profile, as `generations` lists it."""

    number: int
    path: str
    name: str
    created: str
    current: bool
    engine: str | None
    version: str | None
    variant: str | None
    state: str = "hot"  # "hot": its store path is on disk; "cold": gone (rollback --to rebuilds it)
    record: bool = False  # a record is kept for it (so a cold generation can come back)
    linked: bool = True  # its generation link exists (deleted generations keep only their record)
    check: dict[str, Any] | None = None  # the check its activation ran, as recorded
    rolled_back_to: int | None = None  # --then-check failed: the generation the profile went back to
    comes_from: str | None = None  # a cold generation's way back (COMES_FROM); None while hot


@dataclass(frozen=True)
class GenerationList(Result):
    """A profile's generations, and where the index and the records differ from the links."""

    profile: str
    current: int
    generations: tuple[Generation, ...]
    index_differs: tuple[str, ...]  # where the index's record differs from the links
    records_refused: tuple[str, ...] = ()  # record files that failed their checks (never used)
    history: tuple[dict[str, Any], ...] = ()  # the profile's last events (activations, checks, rollbacks)
    held: dict[str, Any] | None = None  # the hold (roots/holds.py): name, key, path, since; None when not held


@dataclass(frozen=True)
class DeletedGenerations(Result):
    """What `generations --delete/--older-than/--keep/--forget` deleted (or would)."""

    profile: str
    deleted: tuple[int, ...]
    dry_run: bool
    current: int
    forgotten: tuple[int, ...] = ()  # generations whose records were removed too (no rollback to them)
    records_dropped: tuple[int, ...] = ()  # records of cold generations removed by the keep_records bound


@dataclass(frozen=True)
class ProfileSummary(Result):
    """One profile: its current generation, how many it has, and the store path."""

    profile: str
    current: int
    generations: int
    path: str


@dataclass(frozen=True)
class ProfileList(Result):
    """Every profile, as `list-profiles` shows them."""

    profiles: tuple[ProfileSummary, ...]

    def body(self) -> dict[str, Any]:
        return {"profiles": [p.body() for p in self.profiles]}


def profile_lock(store: Store, profile: str, timeout: float = locks.LOCK_TIMEOUT_S):
    """The profile's lock: held for every change to its links, so two changes serialise."""
    return locks.hold(store.layout.locks, profile_lock_name(profile), f"changing profile {profile}", timeout)


def _switch(store: Store, profile: str, number: int) -> None:
    symlink_atomically(generation_link(profile, number), store.layout.profiles / profile)
    debug.pause("AFTER_SWITCH")  # switched, index not yet told


def activate(
    profile: str,
    target: str | Path,
    *,
    root: str | Path | None = None,
    lock_timeout: float = locks.LOCK_TIMEOUT_S,
    check: list[str] | None = None,
    no_check: bool = False,
    check_timeout: float = health.DEFAULT_TIMEOUT_S,
    then_check: bool = False,
    keep_records: int = records.DEFAULT_KEEP_RECORDS,
    unless_held: bool = False,
) -> Switch:
    """Make `target` (a store path, its name or key, PROFILE or PROFILE@N) the profile's current
    generation. Activating what is already current makes no new generation (and runs no check).
    (`llmgw_store.api.activate` also takes a recipe: it builds first, then calls this.) Each lock
    is waited for at most `lock_timeout` s.

    `check` (an argv; default: the `health` command the target's recipe recorded, unless
    `no_check`) runs in the target before the switch, which happens only if it exits 0 within
    `check_timeout` s; else CommandError and the profile is untouched. With `then_check` the
    profile switches first and goes back by itself if the check fails. Both are recorded in the
    generation's record and the profile's history. At most `keep_records` records are kept.
    `unless_held` (a follow of a release): holds.Held, nothing switched, when the profile is held
    (roots/holds.py), checked under the profile's lock, which `hold` takes too."""
    check_profile(profile)
    if check is not None:
        check = health.checked_argv(check, "--check")
    if not (isinstance(check_timeout, (int, float)) and math.isfinite(check_timeout)
            and 0 < check_timeout <= health.MAX_TIMEOUT_S):
        raise UsageError(f"--check-timeout must be a number of seconds more than 0 and at most "
                         f"{health.MAX_TIMEOUT_S:g} (86400: a day)")
    if keep_records < 1:
        raise UsageError("--keep-records must be at least 1")
    with Store.open(root, lock_timeout) as store:
        layout = store.layout
        name = reference(store, str(target)).name
        TempRoots(layout).add(name, lock_timeout)
        # Checked again now that gc can no longer take it.
        row = registered(store, name)
        env_dir = layout.path_of(row.name)
        if not env_dir.is_dir():
            raise NotFoundError(f"{name} is registered but missing on disk; build it again")
        argv = check if check is not None else (None if no_check else health.recipe_health(row))
        if argv is not None and check is None:
            say(f"check: the health command of {name}'s recipe")
        if then_check and argv is None:
            raise UsageError("--then-check needs a check: --check 'CMD ...', or a recipe with a `health` command")
        described = records.describe(layout, row)
        before = None
        if argv is not None and not then_check and not _is_current(layout, profile, name):
            # The profile's lock is not held while the check runs: the check concerns the target,
            # and the profile is not touched unless it passes.
            result = health.run(argv, env_dir, check_timeout)
            before = result.record("before")
            if not result.passed:
                with profile_lock(store, profile, lock_timeout):
                    current = _current_or_none(layout, profile)
                    records.add_event(layout, profile, "check-failed", name=name, current=current, check=before)
                where = f"left at generation {current}" if current is not None else "not created"
                raise health.failure(result, f"profile {profile} {where}: nothing switched")
        with profile_lock(store, profile, lock_timeout):
            hold = holds.held(layout, profile) if unless_held else None
            if hold is not None:
                raise holds.Held(hold)
            _clear_temporaries(layout, profile)
            gens = disk_generations(layout, profile)
            _sync_index(store, profile, gens, write=True)
            current = _current_or_none(layout, profile)
            _settle_abandoned_check(layout, profile, current)
            if current is not None and gens.get(current) == name:
                return Switch(profile, current, current, str(env_dir), False)
            if then_check and current is None:
                raise UsageError(f"--then-check needs a generation to go back to, and profile {profile!r} has none: "
                                 "use --check (the check then runs before the first switch)")
            number = max([*gens, *records.numbers(layout, profile), store.index.max_generation(profile), 0]) + 1
            symlink_atomically(f"../store/{name}", gen_link(layout, profile, number))
            pending = None
            if then_check:
                assert argv is not None, "--then-check without a check was refused above"
                pending = {"argv": list(argv), "mode": "after", "result": "pending"}
            activation: dict[str, Any] = {"kind": "activate", "from": current, "check": before or pending}
            # The record is on disk before the profile points at the generation.
            rec = records.write(layout, records.make(profile, number, described, activation))
            debug.pause("BEFORE_SWITCH")  # the new generation exists, the profile not yet switched
            guard = Window()  # SIGTERM/SIGHUP during a --then-check: switched back (system/signals.py)
            if then_check:
                guard.hold()  # SIGTERM/SIGHUP from here on switch back (see _then_check)
            try:
                _switch(store, profile, number)
            except BaseException:
                guard.restore()
                raise
            store.index.record_generation(profile, number, name, _link_time(gen_link(layout, profile, number)))
            records.add_event(layout, profile, "activate", **{"from": current}, to=number, name=name,
                              check=activation["check"])
            records.prune(layout, profile, keep_records, disk_generations(layout, profile))
            say(f"profile {profile}: generation {number} -> {name}")
            if not then_check:
                return Switch(profile, number, current, str(env_dir), True, check=activation["check"])
            assert argv is not None and current is not None, "--then-check was refused above without a check, " \
                "or without a generation to go back to"
            try:
                return _then_check(store, profile, rec, current, argv, env_dir, check_timeout, guard)
            finally:
                guard.restore()


def _then_check(store: Store, profile: str, rec: records.Record, previous: int, argv: list[str], env_dir: Path,
                timeout: float, guard: Window) -> Switch:
    """With the profile's lock held and the profile at `rec.generation`: run the check; if it does not
    pass (or this process is interrupted: ^C, SIGTERM, SIGHUP), switch back to `previous` before the
    lock is let go."""
    layout, number = store.layout, rec.generation
    try:
        guard.arm()
        result = health.run(argv, env_dir, timeout)
    except BaseException:
        guard.block()
        _switch(store, profile, previous)
        records.write(layout, records.with_activation(rec, {**rec.activation, "rolled_back_to": previous,
                                                            "check": {**rec.activation["check"], "result": "interrupted"}}))
        records.add_event(layout, profile, "auto-rollback", **{"from": number}, to=previous, why="interrupted")
        raise
    done = result.record("after")
    if result.passed:
        records.write(layout, records.with_activation(rec, {**rec.activation, "check": done}))
        records.add_event(layout, profile, "check-passed", generation=number, check=done)
        return Switch(profile, number, previous, str(env_dir), True, check=done)
    _switch(store, profile, previous)
    records.write(layout, records.with_activation(rec, {**rec.activation, "check": done, "rolled_back_to": previous}))
    records.add_event(layout, profile, "auto-rollback", **{"from": number}, to=previous, check=done)
    say(f"profile {profile}: check failed, back to generation {previous}")
    raise health.failure(result, f"profile {profile} was switched to generation {number} and rolled back to "
                                 f"generation {previous}")


def _settle_abandoned_check(layout: Layout, profile: str, current: int | None) -> None:
    """Under the profile's lock: a `--then-check` runs its check holding this lock, so a record of
    the current generation whose check is still "pending" was left by an activation that was killed
    (SIGKILL, a power cut). The profile stays where it is (complete either way); the record and the
    history say the check never finished."""
    if current is None:
        return
    try:
        rec = records.load(layout, profile, current)
    except IntegrityError:
        return
    if rec is None:
        return
    check = rec.activation.get("check")
    if isinstance(check, dict) and check.get("result") == "pending":
        records.write(layout, records.with_activation(rec, {**rec.activation, "check": {**check, "result": "abandoned"}}))
        records.add_event(layout, profile, "check-abandoned", generation=current,
                          why="the activation running --then-check was killed; the profile stayed at this generation")
        say(f"profile {profile}: the check of generation {current} never finished (its activation was killed); "
            "the profile stayed there")


def _is_current(layout: Layout, profile: str, name: str) -> bool:
    current = _current_or_none(layout, profile)
    return current is not None and disk_generations(layout, profile).get(current) == name


def _current_or_none(layout: Layout, profile: str) -> int | None:
    try:
        return current_generation(layout, profile)
    except NotFoundError:
        return None


def cold_record(profile: str, number: int, *, root: str | Path | None = None,
                lock_timeout: float = locks.LOCK_TIMEOUT_S) -> records.Record | None:
    """Generation `number`'s record if the generation is cold (no link, or its store path is gone),
    checked; None if it is hot. NotFoundError when it is neither (no link and no record)."""
    check_profile(profile)
    check_generation(number)
    with Store.open(root, lock_timeout, readonly=True) as store:
        layout = store.layout
        current_generation(layout, profile)  # the profile exists
        gens = disk_generations(layout, profile)
        if number in gens and records.present(layout, gens[number]):
            return None
        rec = records.load(layout, profile, number)
        if rec is None:
            if number not in gens:
                generation_target(layout, profile, number)  # raises: no such generation
            raise NotFoundError(f"generation {number} of {profile!r} points at {gens[number]}, which is no longer in "
                                "the store, and it has no record to rebuild it from")
        return rec


def rollback(profile: str, *, to: int | None = None, root: str | Path | None = None,
             lock_timeout: float = locks.LOCK_TIMEOUT_S, record: records.Record | None = None) -> Switch:
    """Switch to generation `to`, or to the newest generation older than the current one. A cold
    generation `to` is switched to only when `record` is its record (unchanged since it was read)
    and its store path is back in the store with the recorded content hash:
    `llmgw_store.api.rollback` rebuilds or pulls it first."""
    check_profile(profile)
    if to is not None:
        check_generation(to)
    with Store.open(root, lock_timeout) as store:
        with profile_lock(store, profile, lock_timeout):
            layout = store.layout
            _clear_temporaries(layout, profile)
            current = current_generation(layout, profile)
            _settle_abandoned_check(layout, profile, current)
            gens = disk_generations(layout, profile)
            if to is None:
                older = [n for n in gens if n < current and records.present(layout, gens[n])]
                if not older:
                    raise NotFoundError(f"profile {profile!r} has no generation before {current} to roll back to")
                to = max(older)
            cold = to not in gens or not records.present(layout, gens[to])
            if cold:
                name = _relink_cold(store, profile, to, gens, record, lock_timeout)
            else:
                name = gens[to]
            if to != current:
                _switch(store, profile, to)
                records.add_event(layout, profile, "rollback", **{"from": current}, to=to, name=name, cold=cold)
                say(f"profile {profile}: generation {current} -> {to} ({name})")
            return Switch(profile, to, current, str(layout.path_of(name)), to != current)


def _relink_cold(store: Store, profile: str, number: int, gens: dict[int, str], record: records.Record | None,
                 lock_timeout: float) -> str:
    """Make cold generation `number` hot again (under the profile's lock): its link, back at the
    store path its record names, once that path is in the store with the recorded content hash."""
    layout = store.layout
    rec = records.load(layout, profile, number)
    if rec is None:
        if number not in gens:
            generation_target(layout, profile, number)  # raises: no such generation
        raise NotFoundError(f"generation {number} of {profile!r} points at {gens[number]}, which is no longer in "
                            "the store, and it has no record to rebuild it from")
    if record is None:
        raise NotFoundError(f"generation {number} of {profile!r} is cold ({rec.name} is not in the store): "
                            f"`llmgw-store rollback {profile} --to {number}` rebuilds it from its record")
    if record.digest != rec.digest:
        raise IntegrityError(f"the record of generation {number} of {profile!r} changed while its path was rebuilt; "
                             "nothing switched: run the rollback again")
    TempRoots(layout).add(rec.name, lock_timeout)
    row = store.index.path_by_name(rec.name)
    if row is None or not records.present(layout, rec.name):
        raise NotFoundError(f"{rec.name} is not in the store: rebuild it first (`llmgw-store rollback {profile} "
                            f"--to {number}`)")
    if row.content_hash != rec.content_hash or row.key != rec.key:
        raise IntegrityError(f"{rec.name} is in the store with content hash {row.content_hash}, not the "
                             f"{rec.content_hash} generation {number} recorded; nothing switched")
    symlink_atomically(f"../store/{rec.name}", gen_link(layout, profile, number))
    store.index.record_generation(profile, number, rec.name, _link_time(gen_link(layout, profile, number)))
    return rec.name


# Where `rollback --to N` would bring a cold generation back from, as api.rollback tries them.
COMES_FROM = {
    "caches": "the configured caches only",
    "caches, else record": "the configured caches, else rebuilt from its record",
    "record": "rebuilt from its record (no cache configured)",
    "nowhere": "none: no cache configured, and no rebuild (substitute-only, or no lock recorded)",
}


def comes_from(rec: records.Record | records.Shown | None, substituters: tuple[str, ...],
               substitute_only: bool) -> str:
    """One of COMES_FROM for a cold generation with record `rec`, given the caches configured."""
    if isinstance(rec, records.Shown):
        rebuildable = rec.rebuildable
    else:
        rebuildable = rec is not None and rec.lock is not None and isinstance(rec.inputs.get("build"), dict)
    if rec is None:
        return "nowhere"
    if substituters:
        return "caches" if substitute_only or not rebuildable else "caches, else record"
    return "record" if rebuildable and not substitute_only else "nowhere"


def generations(profile: str, *, root: str | Path | None = None, lock_timeout: float = locks.LOCK_TIMEOUT_S,
                substituters: tuple[str, ...] = (), substitute_only: bool = False) -> GenerationList:
    """The profile's generations from disk (the truth): its links (hot while their store path
    exists) and its records (a record without a link is a deleted, cold generation), and where the
    index differs from them (the next change of the profile, or `doctor --rebuild-index`, records
    it); for each cold one, where a rollback to it would bring it back from (`comes_from`, given the
    configured `substituters` and `substitute_only`). Read-only."""
    check_profile(profile)
    with Store.open(root, lock_timeout, readonly=True) as store:
        layout = store.layout
        current = current_generation(layout, profile)
        # One pass over profiles/, one read of the index's paths, the records key read once: what
        # a listing costs per generation is its record (roots/generations.scan_profile).
        links, numbers = scan_profile(layout, profile)
        gens = {n: name for n, (name, _) in links.items()}
        differs = _sync_index(store, profile, gens, write=False)
        recs, refused = records.summarised(layout, profile, numbers)  # one file, not one per record
        rows = {r.name: r for r in store.index.paths()}
        out = []
        seen: dict[str, tuple[str, bool]] = {}  # store path name -> (its path, hot): once per path
        for number in sorted(set(gens) | set(recs)):
            rec = recs.get(number)
            linked = number in gens
            if linked:
                name, created = gens[number], _time_of(links[number][1])
            else:
                assert rec is not None, "each number is a generation link's or a record's (the union above)"
                name, created = rec.name, rec.created
            row = rows.get(name)
            if name not in seen:
                seen[name] = (str(layout.path_of(name)), records.present(layout, name))
            path, hot = seen[name]
            out.append(Generation(
                number=number, path=path, name=name,
                created=created,
                current=number == current,
                engine=row.engine if row else (rec.engine if rec else None),
                version=row.version if row else (rec.version if rec else None),
                variant=row.variant if row else (rec.variant if rec else None),
                state="hot" if hot else "cold", record=rec is not None, linked=linked,
                check=rec.check if rec else None, rolled_back_to=rec.rolled_back_to if rec else None,
                comes_from=None if hot else comes_from(rec, substituters, substitute_only),
            ))
        hold = holds.held(layout, profile)
        return GenerationList(profile, current, tuple(out), tuple(differs), tuple(refused.values()),
                              tuple(records.history(layout, profile, last=50)),
                              None if hold is None else {k: v for k, v in hold.body().items() if k != "removed"})


def delete_generations(
    profile: str,
    *,
    numbers: list[int] | None = None,
    older_than: float | None = None,
    keep: int | None = None,
    dry_run: bool = False,
    forget: list[int] | None = None,
    keep_records: int | None = None,
    root: str | Path | None = None,
    lock_timeout: float = locks.LOCK_TIMEOUT_S,
) -> DeletedGenerations:
    """Delete generation links (never the current one): the generations become cold, their records
    stay and their store paths are freed by a later gc. `forget` removes generations' records too
    (and their links); `keep_records` drops the oldest records of cold generations beyond it."""
    check_profile(profile)
    for n in [*(numbers or []), *(forget or [])]:
        check_generation(n)
    if keep_records is not None and keep_records < 1:
        raise UsageError("--keep-records must be at least 1")
    with Store.open(root, lock_timeout) as store:
        with profile_lock(store, profile, lock_timeout):
            return delete_generations_locked(store, profile, numbers, older_than, keep, dry_run,
                                             forget=forget, keep_records=keep_records)


def delete_generations_locked(store: Store, profile: str, numbers, older_than, keep, dry_run, *,
                              forget: list[int] | None = None, keep_records: int | None = None) -> DeletedGenerations:
    """Called with the profile's lock held (also by gc --delete-older-than): the generations chosen
    (every refusal raised before anything changes), then their links removed and their records
    written or removed."""
    layout = store.layout
    current = current_generation(layout, profile)
    gens = disk_generations(layout, profile)
    have_records = set(records.numbers(layout, profile))
    doomed, forgotten = _chosen_for_deletion(layout, profile, gens, current, have_records, numbers, forget,
                                             older_than, keep)
    if not dry_run:
        records.remove_temporaries(layout, profile)
    for n in sorted(doomed):
        say(f"{'would remove' if dry_run else 'removing'} generation {n} of {profile} ({gens[n]})"
            + ("" if n in forgotten else "; its record stays (cold)"))
        if not dry_run:
            if n not in forgotten and n not in have_records:
                _record_existing(store, profile, n, gens[n])
            os.unlink(gen_link(layout, profile, n))
            store.index.mark_generation_deleted(profile, n)
    for n in sorted(forgotten):
        say(f"{'would forget' if dry_run else 'forgetting'} generation {n} of {profile}: its record goes too")
        if not dry_run:
            records.remove(layout, profile, n)
    dropped: list[int] = []
    if keep_records is not None and not dry_run:
        dropped = records.prune(layout, profile, keep_records, disk_generations(layout, profile))
    if not dry_run and (doomed or forgotten or dropped):
        records.add_event(layout, profile, "delete", deleted=sorted(doomed), forgotten=sorted(forgotten),
                          records_dropped=dropped)
    return DeletedGenerations(profile, tuple(sorted(doomed)), dry_run, current, tuple(sorted(forgotten)), tuple(dropped))


def _chosen_for_deletion(layout: Layout, profile: str, gens: dict[int, str], current: int, have_records: set[int],
                         numbers, forget, older_than, keep) -> tuple[set[int], set[int]]:
    """(generations whose links go, generations whose records go too). Never the current one: a
    number asked for that is current, or that the profile does not have, is refused here, before
    anything is changed."""
    doomed: set[int] = set()
    for n in numbers or []:
        if n not in gens:
            raise NotFoundError(f"profile {profile!r} has no generation {n} (it has: {', '.join(map(str, gens))})")
        if n == current:
            raise UsageError(f"refusing to delete generation {n} of {profile!r}: it is the current one (roll back first)")
        doomed.add(n)
    forgotten: set[int] = set()
    for n in forget or []:
        if n not in gens and n not in have_records:
            raise NotFoundError(f"profile {profile!r} has no generation {n} and no record of one")
        if n == current:
            raise UsageError(f"refusing to forget generation {n} of {profile!r}: it is the current one (roll back first)")
        forgotten.add(n)
        if n in gens:
            doomed.add(n)
    if older_than is not None:
        cutoff = time.time() - older_than
        doomed |= {n for n in gens if n != current and os.lstat(gen_link(layout, profile, n)).st_mtime < cutoff}
    if keep is not None:
        if keep < 1:
            raise UsageError("--keep must be at least 1")
        newest = sorted(gens, reverse=True)[:keep]
        doomed |= {n for n in gens if n not in newest and n != current}
    return doomed, forgotten


def _record_existing(store: Store, profile: str, number: int, name: str) -> None:
    """A record for a generation made before records were kept, from its store path while it is
    still there (it is about to lose its link)."""
    row = store.index.path_by_name(name)
    if row is None or not records.present(store.layout, name):
        say(f"generation {number} of {profile}: {name} is not in the store; no record can be made of it")
        return
    link = gen_link(store.layout, profile, number)
    records.write(store.layout, records.make(profile, number, records.describe(store.layout, row),
                                             {"kind": "recorded-on-delete"}, created=_link_time(link)))


def list_profiles(*, root: str | Path | None = None) -> ProfileList:
    with Store.open(root, readonly=True) as store:
        out = []
        for entry in sorted(os.scandir(store.layout.profiles), key=lambda e: e.name):
            if entry.name.startswith(".") or is_generation_link(entry.name) or not entry.is_symlink():
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
        if row is None or row.deleted or row.name != name:
            if write:
                store.index.record_generation(profile, n, name, _link_time(gen_link(store.layout, profile, n)))
            differs.append(f"generation {n} was on disk but not in the index")
    for n, row in rows.items():
        if n not in gens and not row.deleted:
            if write:
                store.index.mark_generation_deleted(profile, n)
            differs.append(f"generation {n} was in the index but not on disk")
    return differs


def _clear_temporaries(layout: Layout, profile: str) -> None:
    """Temporary links and records left by a change that was killed (we hold the profile's lock)."""
    pat = re.compile(rf"^\.{re.escape(profile)}(-\d+{LINK_SUFFIX})?\.tmp-\d+$")
    for entry in os.scandir(layout.profiles):
        if pat.match(entry.name):
            os.unlink(entry.path)
    records.remove_temporaries(layout, profile)


def _link_time(link: Path) -> str:
    return _time_of(os.lstat(link).st_mtime)


def _time_of(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
