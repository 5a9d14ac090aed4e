"""Reading a profile's generations from its links on disk (the truth; the index follows them).

    ROOT/profiles/<p>          -> <p>-<N>-link      the current generation
    ROOT/profiles/<p>-<N>-link -> ../store/<name>   generation N
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmgw_store.base.errors import NotFoundError, UsageError
from llmgw_store.core.layout import Layout
from llmgw_store.core.locations import generation_of


def gen_link(layout: Layout, profile: str, number: int) -> Path:
    return layout.generation_link(profile, number)


def scan_profile(layout: Layout, profile: str) -> tuple[dict[int, tuple[str, float]], list[int]]:
    """One pass over profiles/ for a listing of `profile`: (generation number -> (store path name,
    its link's mtime), the numbers that have a record file, ascending). The same names as
    disk_generations and records.numbers read, read once: a profile of 1,000 generations is 2,000
    entries, and every lookup per generation (a second scan, an lstat) is what makes a listing grow."""
    record = re.compile(rf"\.{re.escape(profile)}-(\d{{1,10}})\.record")
    links: dict[int, tuple[str, float]] = {}
    numbers = []
    for entry in os.scandir(layout.profiles) if layout.profiles.is_dir() else []:
        name = entry.name
        if name[0] == ".":
            m = record.fullmatch(name)
            if m and 1 <= int(m.group(1)) <= 10**9:
                numbers.append(int(m.group(1)))
        elif (number := generation_of(profile, name)) is not None and entry.is_symlink():
            try:
                target = os.readlink(entry.path)
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue  # deleted meanwhile
            links[number] = (target.rpartition("/")[2], mtime)
    return dict(sorted(links.items())), sorted(numbers)


def disk_generations(layout: Layout, profile: str) -> dict[int, str]:
    """number -> store path name, read from the generation links."""
    out = {}
    for entry in os.scandir(layout.profiles) if layout.profiles.is_dir() else []:
        number = generation_of(profile, entry.name)
        if number is not None and entry.is_symlink():
            out[number] = Path(os.readlink(entry.path)).name
    return dict(sorted(out.items()))


def current_generation(layout: Layout, profile: str) -> int:
    link = layout.profiles / profile
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        raise NotFoundError(f"no profile {profile!r} in {layout.profiles} (see `llmgw-store list-profiles`)") from None
    number = generation_of(profile, target)
    if number is None:
        raise UsageError(f"{link} points at {target!r}, which is not one of its generations")
    return number


def generation_target(layout: Layout, profile: str, number: int) -> str:
    gens = disk_generations(layout, profile)
    if number not in gens:
        if not (layout.profiles / profile).is_symlink():
            raise NotFoundError(f"no profile {profile!r} in {layout.profiles} (see `llmgw-store list-profiles`)")
        have = ", ".join(map(str, gens)) or "none"
        raise NotFoundError(f"profile {profile!r} has no generation {number} (it has: {have})")
    return gens[number]
