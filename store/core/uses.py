"""When a store path was last used, recorded without writing the index on a cache hit.

    ROOT/var/used/<name>       an empty file whose mtime is the last hit on store path <name>

A cache hit (the fast path in cli/fast.py, or realise's hit) sets the stamp's mtime: one utime(2),
no SQLite transaction, no WAL checkpoint on close. `fold` moves the stamps into the index's
`paths.last_used` (the later of the two) and is called wherever the index is opened read-write
(Store.open), so gc, which reads last_used from the index, always opens an index that has seen every
use recorded before it opened.

Race-free without a lock: fold first renames a stamp to a name of its own, then reads its mtime and
deletes it. A hit that touched the stamp before the rename is carried by the renamed file; a hit
after it finds no stamp and creates a new one, which the next fold reads. var/used/ is 0700 in the
0700 var/; every open is relative to a directory descriptor and never follows a link; fold reads
at most MAX_STAMPS names and only well-formed store names.
"""

from __future__ import annotations

import os
import stat

from llmgw_store.core.dirs import is_store_name, open_var, private_dir
from llmgw_store.core.locations import USED, leaf

USED_DIR = leaf(USED)
FOLDING = ".fold-"
MAX_STAMPS = 100_000


def touch(var_fd: int, name: str) -> bool:
    """Record a use of store path `name` now. Best effort: False when it could not be recorded."""
    used_fd = private_dir(USED_DIR, var_fd, True)
    if used_fd is None:
        return False
    try:
        try:
            os.utime(name, dir_fd=used_fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            pass
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=used_fd)
        os.close(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(used_fd)


def touch_root(root: str, name: str) -> bool:
    var_fd = open_var(root)
    if var_fd is None:
        return False
    try:
        return touch(var_fd, name)
    finally:
        os.close(var_fd)


def collect(root: str) -> dict[str, float]:
    """Take every stamp under ROOT: {store path name: time of its last use}. The stamps are gone
    afterwards; the caller writes the times into the index (fold)."""
    var_fd = open_var(root)
    if var_fd is None:
        return {}
    try:
        used_fd = private_dir(USED_DIR, var_fd, False)
    finally:
        os.close(var_fd)
    if used_fd is None:
        return {}
    found: dict[str, float] = {}
    mine = f"{FOLDING}{os.getpid()}-"
    try:
        with os.scandir(used_fd) as it:
            names = []
            for i, entry in enumerate(it):
                if i >= MAX_STAMPS:
                    break
                names.append(entry.name)
        for name in names:
            if name.startswith(FOLDING):
                # Left by a fold that died between rename and delete: its use is taken too.
                taken, real = name, name[len(FOLDING):].partition("-")[2]
            elif is_store_name(name):
                taken, real = mine + name, name
                try:
                    os.rename(name, taken, src_dir_fd=used_fd, dst_dir_fd=used_fd)
                except OSError:
                    continue
            else:
                continue
            try:
                st = os.stat(taken, dir_fd=used_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and is_store_name(real):
                    found[real] = max(found.get(real, 0.0), st.st_mtime)
                os.unlink(taken, dir_fd=used_fd)
            except OSError:
                continue
    finally:
        os.close(used_fd)
    return found


def fold(root: str, index) -> int:
    """Write the stamps under ROOT into `index` (a read-write core.index.Index): each path's
    last_used becomes the later of the index's and the stamp's. Returns how many rows changed."""
    from llmgw_store.base.errors import StoreError

    found = collect(root)
    if not found:
        return 0
    try:
        return index.note_uses(found)
    except StoreError:
        # The index busy past its timeout: these uses are lost (a path may look older to gc than
        # it is), which is better than failing the command that opened the store.
        return 0
