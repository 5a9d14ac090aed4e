"""Inode stamps: the store inodes whose bytes were hashed to their digest, and not changed since.

A stamp (the index's `inode_stamps`: device, inode number, digest, size, mtime, ctime) is recorded
right after the bytes of the inode were hashed: by a pull, for every file of the tree it installs
(cache/tree_fetch.py: written from a checked blob, copied, resumed, or reused as checked). A later
delta pull links a local file without reading it again only when the inode it opened
(O_NOFOLLOW, below its store path) still has the stamp's digest, size, mtime and ctime — besides
`dedupe.shareable` and `dedupe.store_inode`, checked as for every reuse. Any write to the inode
moves its mtime and ctime; a chmod, a chown, an xattr, a link or an unlink moves its ctime; and no
process can set ctime (utime sets it to now). So a file tampered in place after it was stamped —
even with its mode, size and mtime put back — no longer matches, and is hashed (and, not hashing
right, fetched instead). An inode number reused by a new file has a new ctime. What this cannot
see: a change with the clock set back to the very nanosecond (root), or one between the hash and
the stamp (the store's owner racing its own pull): either can rewrite the store and its index anyway.

Stamps are a cache: an index that cannot be read or written costs a hash, never a refusal, and a
stamp of an inode that is gone never matches again (its ctime cannot come back).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from llmgw_store.base.errors import StoreError

MAX_ROWS = 4_000_000  # a few dozen vLLM-sized paths; past it the table starts again (index.record_inode_stamps)


def _row(st: os.stat_result, digest: str) -> tuple[int, int, str, int, int, int]:
    return st.st_dev, st.st_ino, digest, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Stamps:
    """The stamps of the files of `digests`, read from the index once (in the thread that owns it);
    `verified` is then a set lookup, from any thread."""

    def __init__(self, index, digests: Iterable[str]):
        try:
            self.known = index.inode_stamps(sorted(set(digests)))
        except StoreError:
            self.known = set()

    def verified(self, st: os.stat_result, digest: str) -> bool:
        """Whether the inode of `st` (an fstat of the open file) was hashed to `digest` and has not
        changed since: same size, mtime and ctime as when it was stamped."""
        return _row(st, digest) in self.known


def record(index, items: Iterable[tuple[os.stat_result, str]]) -> None:
    """Stamp each inode: `st` taken after its bytes were hashed to `digest`."""
    rows = [_row(st, digest) for st, digest in items]
    if not rows:
        return
    try:
        index.record_inode_stamps(rows, MAX_ROWS)
    except StoreError:
        pass  # a cache: the next pull hashes these files
