"""One file or one link at a time, never through a link: the one bounded reader, the one atomic
write inside the root, the one way to write a file outside it, the one private secret file, and the
one atomic switch of a symlink. (Whole trees are system/trees.py's; the ownership check of a store
directory is core/dirs.py's.)

    read_bounded(path, limit, ...)   a regular file's bytes, never through a link, never a FIFO,
                                     a device or a directory, at most `limit` bytes; optionally
                                     only a file of a given owner, without given mode bits, with
                                     one link
    write_atomic(path, data, ...)    inside the root: a new file on a random name beside `path`,
                                     O_CREAT|O_EXCL|O_NOFOLLOW, its mode set, fsync, rename(2) over
                                     `path` (or link(2) for `exclusive`), fsync of the directory
    write_outside(path, data, ...)   a file the store writes outside its root (a Prometheus
                                     textfile, key files, systemd units): write_atomic into the
                                     target directory opened without following a link, once that
                                     directory is shown to be no other user's (`check_target_dir`);
                                     a link among the directories above it is followed only in a
                                     trusted directory (`resolve_trusted`, `untrusted`: the rule
                                     the config file's path is held to as well)
    private_secret(path, nbytes)     N random bytes made once (0600, exclusive, whole or absent)
                                     and read back only from the owner's private regular file with
                                     one link
    symlink_atomically(target, link) point `link` somewhere new: a temporary link renamed over it
                                     (rename(2) replaces a symlink atomically: a reader sees the old
                                     target or the new one, never neither; profiles, generations and
                                     pins switch through here), the directory fsynced after

Invariants:
- Nothing here follows a link it did not make. A relative `path` with a `dir_fd` is resolved one
  component at a time with O_NOFOLLOW (every directory of it, and the file); without `dir_fd`
  only the last component is (the caller vouches for the directories above, as for ROOT's
  parents). Opening for reading uses O_NONBLOCK, so a FIFO planted in place of a file is never
  waited on; fstat on the descriptor, not lstat on the name, decides what the file is.
- A write never opens an existing file: the bytes go to a fresh inode (O_EXCL on a name nobody
  can predict: pid and 64 random bits), which rename(2) puts in place in one step. rename replaces
  a link at the final name as a link (never writing through it); with `exclusive` link(2) fails on
  any existing name instead. A reader sees the old file or the new one, whole.
- Every refusal is FileRefused (an OSError and a ValueError naming the path and why) for callers
  to turn into their own error; writing outside the root refuses with UnsafePathError (exit 2) before writing.

The temporary names are `.<name>.tmp-<pid>-<16 hex>`: a writer killed between create and rename
leaves one behind, for whoever sweeps the directory. Only os, errno, stat and base/errors are
imported: the fast path reads and writes its private files through this module.
"""

from __future__ import annotations

import errno
import os
import stat

from llmgw_store.base.errors import UnsafePathError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the fast path loads this module)
if TYPE_CHECKING:
    from pathlib import Path

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


class FileRefused(OSError, ValueError):
    """A file the store was to read is not one it may read (a link, not a regular file, another
    user's, too open, too large); `path` and `reason` say which and why. Both an OSError (what
    was a file may have been swapped for something else: callers walking a tree catch that) and a
    ValueError (callers parsing what they read catch that)."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(errno.EINVAL, reason, os.fspath(path))
        self.path, self.reason = os.fspath(path), reason

    def __str__(self) -> str:
        return f"{self.path} {self.reason}"


# --- opening without following links ---------------------------------------------------------

def open_dir(path: str | os.PathLike, *, dir_fd: int | None = None) -> int:
    """A descriptor of the directory `path`: relative to `dir_fd`, every component opened with
    O_NOFOLLOW; else only the last one (a link there is refused). FileRefused for a link or a
    non-directory; FileNotFoundError when absent."""
    parent, name = _parent(path, dir_fd)
    try:
        return _open(name, _DIR, parent, path, "is not a directory (a link, or a file)")
    finally:
        if parent is not None and parent != dir_fd:
            os.close(parent)


def _parent(path: str | os.PathLike, dir_fd: int | None) -> tuple[int | None, str]:
    """(a descriptor of the directory holding `path`'s last component, or `dir_fd`/None for the
    caller's own; that component). With `dir_fd`, the directories of a relative path are walked
    one by one with O_NOFOLLOW."""
    p = os.fspath(path)
    head, _, name = p.rstrip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise FileRefused(p, "is not a file name")
    if dir_fd is None:
        if not head and not p.startswith("/"):
            return None, name
        fd = _open(head or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, None, head or "/", "is not a directory")
        return fd, name
    if p.startswith("/"):
        raise FileRefused(p, "must be relative to its directory")
    fd = dir_fd
    try:
        for part in head.split("/") if head else ():
            if part in ("", "."):
                continue
            if part == "..":
                raise FileRefused(p, "climbs out of its directory")
            nxt = _open(part, _DIR, fd, p, "lies below something that is not a directory (a link?)")
            if fd != dir_fd:
                os.close(fd)
            fd = nxt
    except BaseException:
        if fd != dir_fd:
            os.close(fd)
        raise
    return fd, name


def _open(name: str, flags: int, dir_fd: int | None, shown: str | os.PathLike, not_dir: str, mode: int = 0o777) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FileRefused(shown, "is a symbolic link" if exc.errno == errno.ELOOP and not flags & os.O_DIRECTORY
                              else not_dir) from None
        if exc.errno in (errno.ENXIO, errno.EWOULDBLOCK, errno.EISDIR):
            raise FileRefused(shown, "is not a regular file") from None
        raise FileRefused(shown, f"cannot be opened ({exc.strerror})") from None


def open_regular(path: str | os.PathLike, *, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file `path` (see `open_dir` for how links are refused). The caller
    closes the fd. FileRefused for anything but a regular file; FileNotFoundError when absent."""
    parent, name = _parent(path, dir_fd)
    try:
        fd = _open(name, _READ, parent, path, "lies below something that is not a directory (a link?)")
    finally:
        if parent is not None and parent != dir_fd:
            os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(path, "is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_fd(fd: int, limit: int, shown: str | os.PathLike, size: int | None = None) -> bytes:
    """At most `limit` bytes of the open file `fd` from its offset; FileRefused if it holds more
    (`size`, its fstat size, refuses a file too large before a byte is read)."""
    if size is not None and size > limit:
        raise FileRefused(shown, f"is larger than {limit} bytes")
    chunks, left = [], limit + 1
    while left > 0 and (chunk := os.read(fd, min(CHUNK, left))):
        chunks.append(chunk)
        left -= len(chunk)
    if left <= 0:
        raise FileRefused(shown, f"is larger than {limit} bytes")
    return b"".join(chunks)


def read_bounded(path: str | os.PathLike, limit: int, *, dir_fd: int | None = None, owner: int | None = None,
                 deny_mode: int = 0, one_link: bool = False, tighten: int = 0) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them: never through a link (see
    `open_dir`), never a FIFO, device, socket or directory. With `owner`, only a file of that uid;
    `deny_mode`, only one without those mode bits; `one_link`, only one with no other hard link.
    `tighten`: mode bits taken off a file of ours that passed those checks (closing up what an older
    version made readable, say). FileRefused otherwise; FileNotFoundError when absent."""
    fd, st = open_regular(path, dir_fd=dir_fd)
    try:
        if owner is not None and st.st_uid != owner:
            raise FileRefused(path, f"is owned by uid {st.st_uid}, not {owner}")
        if st.st_mode & deny_mode:
            if not deny_mode & ~_GROUP_OTHER_WRITE:
                raise FileRefused(path, f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
            raise FileRefused(path, f"has mode {stat.S_IMODE(st.st_mode):04o} (it must not have {deny_mode:04o})")
        if one_link and st.st_nlink != 1:
            raise FileRefused(path, f"has {st.st_nlink} hard links")
        if tighten and st.st_mode & tighten and st.st_uid == os.geteuid():
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~tighten)
        return read_fd(fd, limit, path, st.st_size)
    finally:
        os.close(fd)


# --- writing -----------------------------------------------------------------------------------

def _temp_name(name: str) -> str:
    return f".{name}.tmp-{os.getpid()}-{os.urandom(8).hex()}"


def write_atomic(path: str | os.PathLike, data: bytes, *, dir_fd: int | None = None, mode: int = 0o644,
                 exclusive: bool = False, fsync: bool = True) -> None:
    """Put `data` at `path` in one step (see the module docstring): readers see the old file or the
    new one, whole; with `fsync`, also after a power cut once this returns. `mode` is set exactly
    (no umask). `exclusive`: FileExistsError if `path` exists (a link or anything else) — nothing
    is replaced. A failure leaves no temporary file."""
    parent, name = _parent(path, dir_fd)
    try:
        _write_in(parent, name, data, mode, exclusive, fsync)
    finally:
        if parent is not None and parent != dir_fd:
            os.close(parent)


def _write_in(dfd: int | None, name: str, data: bytes, mode: int, exclusive: bool, fsync: bool) -> None:
    tmp = _temp_name(name)
    fd = os.open(tmp, _CREATE, 0o600, dir_fd=dfd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            # link(2) never replaces: the name is taken whole, or EEXIST and nothing changed.
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dfd)
        else:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    if fsync:
        _fsync_dir(dfd)


def _fsync_dir(dfd: int | None) -> None:
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if dfd is None else dfd
    try:
        os.fsync(fd)
    finally:
        if dfd is None:
            os.close(fd)


MAX_LINKS = 40  # links followed while resolving one path (the kernel's MAXSYMLINKS)


def untrusted(st: os.stat_result) -> str | None:
    """Why a directory (or file) with this stat is one another user could change, or None when only
    root or this user can: owned by another uid, or writable by group or others (a directory with
    the sticky bit excepted, as /tmp: no one else can rename or remove what is in it)."""
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid}, not by root or this user ({os.geteuid()})"
    if st.st_mode & _GROUP_OTHER_WRITE and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def resolve_trusted(path: str | os.PathLike, *, every: bool = False, follow_last: bool = True) -> tuple[int, str]:
    """(a descriptor of the directory holding `path`'s last component, that component), resolved
    from / one component at a time with O_NOFOLLOW. A symbolic link on the way is followed only when
    the directory holding it is trusted (`untrusted` finds nothing: root's links in root's
    directories, as /var/run -> /run, are followed; a link in another user's directory never is),
    at most MAX_LINKS of them; with `every`, each directory walked through must be trusted too.
    `follow_last`: whether a link as the last component is followed (else it is the answer). The
    last component is "." for "/". FileRefused names the link or directory and why;
    FileNotFoundError when a directory on the way is absent. The caller closes the descriptor."""
    shown = os.fspath(path)
    parts = os.path.abspath(shown).split("/")[::-1]  # a stack: the next component last
    here = "/"
    fd = os.open("/", _DIR)
    links = 0
    try:
        if every and (why := untrusted(os.fstat(fd))):
            raise FileRefused(shown, f"lies below / which is {why}")
        while parts:
            part = parts.pop()
            if part in ("", "."):
                continue
            last = not any(p not in ("", ".") for p in parts)
            if part != "..":
                try:
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return fd, part
                    raise
                if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
                    if why := untrusted(os.fstat(fd)):
                        raise FileRefused(shown, f"goes through the symbolic link {os.path.join(here, part)} in a "
                                                 f"directory {why}, who could point it anywhere")
                    links += 1
                    if links > MAX_LINKS:
                        raise FileRefused(shown, f"goes through more than {MAX_LINKS} symbolic links")
                    target = os.readlink(part, dir_fd=fd)
                    if target.startswith("/"):
                        os.close(fd)
                        fd, here = -1, "/"
                        fd = os.open("/", _DIR)  # (-1 meanwhile: nothing to close if this fails)
                    parts.extend(target.split("/")[::-1])
                    continue
                if last:
                    return fd, part
            nxt = _open(part, _DIR, fd, shown, "lies below something that is not a directory (a link?)")
            os.close(fd)
            fd = nxt
            here = os.path.dirname(here) if part == ".." else os.path.join(here, part)
            if every and (why := untrusted(os.fstat(fd))):
                raise FileRefused(shown, f"lies below {here} which is {why}")
        return fd, "."
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def open_trusted(path: str | os.PathLike, *, open_it: bool = True) -> tuple[int, os.stat_result]:
    """(fd, fstat) of `path` opened for reading, if it and every directory walked through on the way
    are root's or this user's and writable by no one else, and every link on the way lies in such a
    directory (`resolve_trusted` with `every`): the rule for a file the store takes as its user's
    own word (the config file, the `uv` and key files it names, a key file named anywhere). Without
    `open_it` (a program: it may be execute-only), (-1, its lstat). FileRefused says why not;
    FileNotFoundError (and other OSErrors) when it cannot be reached. The caller closes the fd."""
    dfd, name = resolve_trusted(path, every=True)
    try:
        if open_it:
            try:
                fd = os.open(name, _READ, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # the name became a link after it was resolved
                    raise FileRefused(path, "is a symbolic link that changed while it was read") from None
                raise
            st = os.fstat(fd)
        else:
            fd, st = -1, os.stat(name, dir_fd=dfd, follow_symlinks=False)
    finally:
        os.close(dfd)
    why = "a symbolic link that changed while it was read" if stat.S_ISLNK(st.st_mode) else untrusted(st)
    if why is not None:
        if fd >= 0:
            os.close(fd)
        raise FileRefused(path, f"is {why}")
    return fd, st


def check_target_dir(dfd: int, shown: str | os.PathLike) -> None:
    """The rule for a directory outside the root the store writes into (its descriptor, opened
    without following a link): `untrusted` finds nothing — owned by root or by the user the store
    runs as, and writable by no one else unless it has the sticky bit (as /tmp), where no one else
    can rename or remove what the store put there. A directory of another user is refused even when
    only its owner may write it: that user could swap the file the store wrote (a secret key for
    one of theirs) the moment after. UnsafePathError (exit 2) says what to do."""
    st = os.fstat(dfd)
    why = untrusted(st)
    if why is None:
        return
    where = os.fspath(shown)
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafePathError(f"refusing to write into {where}: it is {why}, who could swap what the store writes "
                              "there; use a directory of root's (readers such as node_exporter only need to read it)")
    raise UnsafePathError(f"refusing to write into {where}: it is writable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}) without the sticky bit; another user could swap what the "
                          "store writes there — chmod go-w it, or use another directory")


def write_outside(path: str | os.PathLike, data: bytes, *, mode: int = 0o644, exclusive: bool = False) -> os.PathLike:
    """Write a file outside the store's root (see the module docstring): the directory is opened
    without following its last component and checked (`check_target_dir`) before anything is
    created in it. UnsafePathError (exit 2) for a linked, foreign or open directory or a link at a
    name `exclusive` may not replace; FileExistsError with `exclusive` when the name is taken."""
    from pathlib import Path  # not at import: the fast path reads its private files through here

    p = Path(os.path.abspath(path))
    try:
        # The directories above: links followed only where trusted; the directory itself: never.
        gfd, name = resolve_trusted(p.parent, follow_last=False)
        try:
            dfd = os.open(name, _DIR, dir_fd=gfd)
        finally:
            os.close(gfd)
    except FileNotFoundError:
        raise UnsafePathError(f"cannot write {p}: its directory {p.parent} does not exist") from None
    except FileRefused as exc:
        raise UnsafePathError(f"refusing to write into {p.parent}: it {exc.reason}; pass the real directory") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"refusing to write into {p.parent}: it is a symbolic link or not a directory; "
                                  "pass the real directory") from None
        raise UnsafePathError(f"cannot write into {p.parent}: {exc.strerror}") from None
    try:
        check_target_dir(dfd, p.parent)
        _write_in(dfd, p.name, data, mode, exclusive, True)
    finally:
        os.close(dfd)
    return p


# --- the private secret file -------------------------------------------------------------------

def _read_secret(path: str | os.PathLike, nbytes: int, dir_fd: int | None) -> bytes:
    """read_bounded of a private secret. A maker links its whole file into place and then unlinks
    its temporary name: for that instant the secret has two links, so a second link is waited out,
    a bounded number of times (a link that stays, a copy shared elsewhere, is still refused)."""
    import time

    for attempt in range(200):
        try:
            return read_bounded(path, nbytes, dir_fd=dir_fd, owner=os.geteuid(), deny_mode=0o077, one_link=True)
        except FileRefused as exc:
            # Refused for its second link, the maker's temporary name (gone again by now, or soon).
            if exc.reason != "has 2 hard links" or attempt == 199:
                raise
            time.sleep(0.001)
    raise AssertionError("unreachable")


def private_secret(path: str | os.PathLike, nbytes: int, *, dir_fd: int | None = None) -> bytes:
    """`nbytes` random bytes kept in `path`, made on first use: written 0600 under a temporary name
    and linked into place (so the file is whole or absent, even to a reader racing its maker), and
    read back only if it is a regular file of this user, with no group or other bits, one link and
    exactly `nbytes` bytes. FileRefused otherwise (another user's file, a link, a copy shared by a
    hard link elsewhere): the caller decides whether that stops it."""
    try:  # made before, the common case: read, without writing (and fsync-ing) a file to learn it
        data = _read_secret(path, nbytes, dir_fd)
    except FileNotFoundError:
        try:
            write_atomic(path, os.urandom(nbytes), dir_fd=dir_fd, mode=0o600, exclusive=True)
        except FileExistsError:
            pass  # made just now by another process: read it
        data = _read_secret(path, nbytes, dir_fd)
    if len(data) != nbytes:
        raise FileRefused(path, f"holds {len(data)} bytes, not {nbytes}")
    return data


# --- the atomic switch of a symlink ------------------------------------------------------------

def symlink_atomically(target: str, link: Path) -> None:
    """Make `link` point at `target`, replacing what was there in one rename(2); the directory is
    fsynced after, so the switch survives a power cut once this returns."""
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
