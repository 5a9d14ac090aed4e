"""Space the store keeps for its own cleanup, as Nix's `gc-reserved-space`.

`ROOT/var/gc-reserve` is a file of RESERVE_BYTES allocated blocks (fallocate, else zeros: never
sparse). A build or pull (the commands that fill a disk) makes it when it is missing; `gc` deletes
it first thing, so that on a full disk it has room for the index's shared memory and journal, the
gc lock's note and its records; gc makes it again when it is done. A disk filled by something else
(an engine's logs) before the reserve existed still gets a gc that works: gc opens the index
without shared memory and deletes before it records (roots/gc.py).

Every operation here is best effort and never raises for a full or read-only disk: the reserve
must not be the reason a command fails.
"""

from __future__ import annotations

import errno
import os

from llmgw_store.core.dirs import open_var
from llmgw_store.core.layout import Layout

RESERVE_BYTES = 8 << 20  # Nix's default gc-reserved-space
_QUIET = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT)
_CHUNK = 1 << 20


def _open_var(layout: Layout) -> int | None:
    """var/, as layout.ensure leaves it, never through a link; None when absent or not so."""
    return open_var(str(layout.root))


def keep(layout: Layout, size: int = RESERVE_BYTES) -> bool:
    """Make the reserve if it is missing (or short); True when it is in place."""
    var = _open_var(layout)
    if var is None:
        return False
    name = layout.gc_reserve.name
    try:
        try:
            st = os.stat(name, dir_fd=var, follow_symlinks=False)
            if st.st_size >= size and st.st_blocks * 512 >= size:
                return True
        except FileNotFoundError:
            pass
        tmp = f".{name}.{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=var)
        except OSError as exc:
            if exc.errno in _QUIET or exc.errno == errno.EEXIST:
                return False
            raise
        try:
            _allocate(fd, size)
            os.close(fd)
            fd = -1
            # The reserve appears whole or not at all: a gc never mistakes a short one for space.
            os.rename(tmp, name, src_dir_fd=var, dst_dir_fd=var)
            return True
        except OSError as exc:
            if exc.errno not in _QUIET:
                raise
            return False
        finally:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp, dir_fd=var)
            except OSError:
                pass
    finally:
        os.close(var)


def _allocate(fd: int, size: int) -> None:
    """Real blocks for `size` bytes: fallocate where the filesystem has it, else written zeros."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    zeros = bytes(_CHUNK)
    left = size
    while left > 0:
        left -= os.write(fd, zeros[: min(left, _CHUNK)])
    os.fsync(fd)


def release(layout: Layout) -> int:
    """Delete the reserve; returns the bytes on disk it gave back (0 when there was none)."""
    var = _open_var(layout)
    if var is None:
        return 0
    name = layout.gc_reserve.name
    try:
        st = os.stat(name, dir_fd=var, follow_symlinks=False)
        os.unlink(name, dir_fd=var)
        return st.st_blocks * 512
    except OSError as exc:
        if exc.errno in _QUIET:
            return 0
        raise
    finally:
        os.close(var)
