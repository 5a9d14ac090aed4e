"""Emptying ROOT/var/trash, with no lock held: what each tree really frees, the pool entries its
listing names, and the trees the kernel refuses to delete, left there and named.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

from llmgw_store.base.report import say
from llmgw_store.core.layout import Layout
from llmgw_store.roots.accounting import listed_files, remove_tree


def has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as it:
            return any(True for _ in it)
    except OSError:
        return False


def empty_trash(layout: Layout, dead: list[dict[str, Any]], report: dict[str, Any],
                pool_used: bool = True) -> set[str] | None:
    """Delete the trees renamed into the trash, counting what each really frees. Returns the names
    of the pool entries their listings name (None: something in the trash had no readable listing,
    so only a walk of the whole pool finds what it shared; an empty set when the pool is empty)."""
    pooled: set[str] | None = set()
    for item in dead:
        if "trash" in item:
            names = _pool_names(item["trash"]) if pool_used else set()
            pooled = None if names is None or pooled is None else pooled | names
            item["freed"] = _remove_or_leave(item.pop("trash"), report)
            report["freed"]["store_paths"] += item["freed"]
        else:
            item["freed"] = 0
    for entry in os.scandir(layout.trash):
        if entry.path in report["undeleted"]:
            continue  # said already
        pooled = None if pool_used else pooled
        report["freed"]["store_paths"] += _remove_or_leave(entry.path, report)
    return pooled


# What the kernel refuses even root (EPERM: an immutable or append-only attribute; EBUSY: a mount
# point inside the tree). Such a tree stays in the trash, where nothing uses it, and every other
# one is still deleted; gc then exits 1 (cli/commands/gc.py), every time until someone clears it.
LEAVE = (errno.EPERM, errno.EACCES, errno.EBUSY)


def _remove_or_leave(tree: str | os.PathLike, report: dict[str, Any]) -> int:
    """remove_tree(tree), or, when the kernel refuses a deletion in it, one line naming it and the
    likely cause, the tree left in the trash and named in report["undeleted"] (0 bytes counted)."""
    try:
        return remove_tree(tree)
    except OSError as exc:
        if exc.errno not in LEAVE:
            raise
        left(os.fspath(tree), exc, "left in the trash", report)
        return 0


def left(shown: str, exc: OSError, where: str, report: dict[str, Any]) -> None:
    report["undeleted"].append(shown)
    say(f"cannot delete {shown} ({os.fsdecode(exc.filename or '')}: {exc.strerror}): {where}; most likely an "
        "immutable or append-only attribute (`lsattr -R` it; `chattr -R -i -a` clears it) or a mount inside it; "
        "the next gc deletes it once that is gone")


_POOL_NAME = re.compile(r"[0-9a-f]{64}-[fx]")


def _pool_names(tree: Path) -> set[str] | None:
    """The names optimise's pool gives the files of `tree`'s listing (`<blake3>-<f|x>`), checked;
    None when the listing cannot be read (a leftover that never had one)."""
    listed = listed_files(tree)
    if listed is None:
        return None
    return {n for kind, digest in listed if _POOL_NAME.fullmatch(n := f"{digest}-{kind}")}
