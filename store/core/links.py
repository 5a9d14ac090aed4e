"""The one way the store points a symlink somewhere new: write a temporary link, rename it over.

rename(2) replaces a symlink atomically, so a reader resolving `link` sees the old target or the
new one, never neither (profiles, generations, pins all switch through here). The directory is
fsynced after the rename, so the switch survives a power cut once `symlink_atomically` returns.
"""

from __future__ import annotations

import os
from pathlib import Path


def symlink_atomically(target: str, link: Path) -> None:
    """Make `link` point at `target`, replacing what was there in one rename(2)."""
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    os.rename(tmp, link)
    dfd = os.open(link.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
