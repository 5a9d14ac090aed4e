"""What a store path costs on disk, recorded once when it is registered, so that gc can predict
what deleting it frees without walking it (roots/accounting.py's Tally).

A store path never changes after registration; what can change is who else links its files. So the
record (the index's `footprint` memo of the path's name) keeps:

- `own`: the blocks of its directories and of every inode all of whose links were inside the tree
  when it was measured (freed with the tree);
- `shared`: [inode, blocks, links inside the tree] of every other inode (a file linked from the
  wheel home, optimise's pool, another store path): gc takes its link count as it is now from its
  walk of the pool and the wheel home, and walks the tree after all when one is in neither;
- `apparent`: the bytes of its regular files; `dev`, `ino`: the tree's directory (a tree replaced
  since, by `verify --repair`, has another inode, and its record is not used).

What this cannot see without a look: a link made later, from another store path, to an inode that
was the tree's own (optimise sharing a newer path's copy with it, a delta pull linking from it).
Until the record is made again, a prediction then counts that inode as freed; gc's deletion itself
counts what it frees (remove_tree), and a byte budget is measured again after each round.

The walk (system/trees.walk) opens directories O_NOFOLLOW and never follows a link; it is bounded
by the tree.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from llmgw_store.system import trees

KIND = "footprint"  # the index's tools-table kind of the records; the ident is the path's name
SHARED_MAX = 1 << 18  # inodes a record lists at most (a few MB in the index): a larger tree is walked


def measure(tree: str | os.PathLike) -> dict[str, Any] | None:
    """The record of `tree` (see above); None when it is not a directory, or shares more than
    SHARED_MAX inodes."""
    top: os.stat_result | None = None
    own = apparent = 0
    inside: dict[int, list[int]] = {}  # inode -> [st_nlink, blocks, links met]
    try:
        for rel, st in trees.walk(tree, sort=False):
            if not rel:
                if not stat.S_ISDIR(st.st_mode):
                    return None
                top = st
                own += st.st_blocks * 512
            elif stat.S_ISDIR(st.st_mode):
                own += st.st_blocks * 512
            else:
                if stat.S_ISREG(st.st_mode):
                    apparent += st.st_size
                if st.st_nlink <= 1:
                    own += st.st_blocks * 512
                    continue
                seen = inside.setdefault(st.st_ino, [st.st_nlink, st.st_blocks * 512, 0])
                seen[2] += 1
    except trees.Replaced:
        return None  # the tree was swapped between its lstat and its opening
    if top is None:
        return None
    shared = []
    for ino, (nlink, blocks, met) in inside.items():
        if met >= nlink:
            own += blocks  # every link is in the tree (a hard link the build made inside it)
        else:
            shared.append([ino, blocks, met])
    if len(shared) > SHARED_MAX:
        return None
    return {"dev": top.st_dev, "ino": top.st_ino, "own": own, "apparent": apparent, "shared": shared}


def valid(record: Any, tree_st: os.stat_result) -> bool:
    """`record` is a well-formed footprint of the directory `tree_st` describes."""
    if not isinstance(record, dict) or not stat.S_ISDIR(tree_st.st_mode):
        return False
    if record.get("dev") != tree_st.st_dev or record.get("ino") != tree_st.st_ino:
        return False
    if not all(isinstance(record.get(k), int) and record[k] >= 0 for k in ("own", "apparent")):
        return False
    shared = record.get("shared")
    return isinstance(shared, list) and all(
        isinstance(s, list) and len(s) == 3 and all(isinstance(x, int) and x >= 0 for x in s) for s in shared)


def remember(index, name: str, tree: str | os.PathLike) -> None:
    """Measure `tree` (store/<name>, just registered) and record it; a record that cannot be made
    (a full disk, an unreadable tree) is left out: gc walks the tree instead."""
    from llmgw_store.base.errors import StoreError

    try:
        record = measure(tree)
        if record is not None:
            index.remember_tool(KIND, name, record)
    except (OSError, StoreError):
        pass
