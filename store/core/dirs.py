"""The one check of a store directory before anything is read from it or written into it: a real
directory (never a link), owned by the running user or root, writable by no one else.

`Layout` (core/layout.py) walks every directory of a store through `own_dir`; the build memo
(build/memo.py), which the fast path reads before the library loads, opens ROOT and ROOT/var
through the same function: a --root that is a link, or a root another user planted, is refused by
both alike (the fast path then leaves the command to the full one, which says why). Only os, stat
and base/errors are imported: this module is on the hot path.
"""

from __future__ import annotations

import os
import stat

from llmgw_store.base.errors import AccessDeniedError, UsageError
from llmgw_store.core.locations import VAR

PUBLIC_DIR = 0o755
PRIVATE_DIR = 0o700
NIX_BASE32 = frozenset("0123456789abcdfghijklmnpqrsvwxyz")
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+!-")


def is_store_name(name: str) -> bool:
    """keys.is_store_name without `re`: `<32 base-32 characters>-<name characters>`, at most 200.
    Here, on every fast path, so that a switch or a read need not load build/memo for it."""
    return (34 <= len(name) <= 200 and name[32] == "-" and all(c in NIX_BASE32 for c in name[:32])
            and all(c in NAME_CHARS for c in name[33:]))


def refuse(path: object, why: str) -> UsageError:
    return UsageError(f"refusing to use the store directory {path}: {why}; "
                      "another user may have planted it — check it, then remove it or fix its owner and mode")


def own_dir(path: str | os.PathLike, mode: int, parent_fd: int | None, create: bool, fix: bool = True,
            owner: int | None = None) -> int | None:
    """A descriptor on the directory `path` (made with `mode` if missing and `create`, relative to
    `parent_fd`, an already checked directory); None when it is missing and not to be made. The
    descriptor, not the name, is checked, so a link swapped in between the check and a chmod cannot
    redirect it. Lax modes of the owner's own directory (a store made by an older llmgw-store) are
    tightened, never loosened (and only with `fix`); someone else's directory, or one others may
    write in, is refused. `owner`: the uid trusted besides root (default: the running user; a reader
    that is not the store's owner passes the owner's)."""
    full = os.fspath(path)
    name = os.path.basename(full) if parent_fd is not None else full
    created = False
    if create:
        try:
            os.mkdir(name, mode, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except PermissionError as exc:
        raise AccessDeniedError(f"cannot open the store directory {full}: permission denied; "
                         "run llmgw-store as the user that owns the store") from exc
    except OSError as exc:
        kind = "a symlink" if os.path.islink(full) else "not a directory"
        raise refuse(full, f"it is {kind} (pass the real directory as --root)" if parent_fd is None
                     else f"it is {kind}") from exc
    try:
        st = os.fstat(fd)
        trusted = os.geteuid() if owner is None else owner  # a reader trusts the store's owner
        if st.st_uid not in (trusted, 0):
            who = "this user" if owner is None else "the store's owner"
            raise refuse(full, f"it is owned by uid {st.st_uid}, not by {who} ({trusted}) or root")
        if stat.S_IMODE(st.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            raise refuse(full, f"other users may write in it (mode {stat.S_IMODE(st.st_mode):o})")
        have = stat.S_IMODE(st.st_mode)
        if fix and st.st_uid == os.geteuid() and (created or have & ~mode):
            os.fchmod(fd, mode if created else have & mode)  # created: the umask may have taken bits
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_dir(name: str, parent_fd: int | None, create: bool) -> int | None:
    """A directory of the running user's that no other user may write, opened without following a
    link (made 0700 with `create`), relative to `parent_fd` (None: `name` is a path); None when it
    is missing or not such a directory. For the store's private corners that a miss may skip (the
    build memo, use stamps, the config cache), where `own_dir` would refuse the whole command."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        return None
    return fd

def open_var(root: str, create: bool = False) -> int | None:
    """ROOT/var as a descriptor, if ROOT and var pass the store's directory check (`own_dir`, as the
    full command's); else None."""
    try:
        root_fd = own_dir(root, PUBLIC_DIR, None, create=False, fix=False)
    except UsageError:
        return None  # a link, another user's: the full command refuses it, and says why
    if root_fd is None:
        return None
    try:
        if create:
            return private_dir(VAR, root_fd, False)
        return own_dir(os.path.join(root, VAR), PRIVATE_DIR, root_fd, create=False, fix=False)
    except UsageError:
        return None
    finally:
        os.close(root_fd)


def replace_private(dir_fd: int, name: str, data: bytes) -> bool:
    """`data` as the file `name` of the private directory `dir_fd`: a new 0600 file (created
    exclusively, never through a link) renamed over it, so a reader sees the old file or the new
    one, never a part (system/files.write_atomic). False when it could not be written; nothing is
    left behind then."""
    from llmgw_store.system.files import write_atomic

    try:
        write_atomic(name, data, dir_fd=dir_fd, mode=0o600, fsync=False)
        return True
    except OSError:
        return False


def read_private(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The bytes of `name` in the private directory `dir_fd`, if it is a regular file of the running
    user's that no one else may read or write, of at most `limit` bytes, reached without a link
    (system/files.read_bounded); None for anything else (a miss, never an error: what
    `replace_private` wrote is read back)."""
    from llmgw_store.system.files import read_bounded

    try:
        return read_bounded(name, limit, dir_fd=dir_fd, owner=os.geteuid(), deny_mode=0o077)
    except OSError:  # absent, or refused (FileRefused is an OSError)
        return None
