"""The one way the store unpacks an archive: a tar stream, written with no-follow, openat-style calls.

Why no write ever follows a link. Every entry is created relative to a directory fd, never by a
path string the kernel would resolve through links: the destination is opened with O_NOFOLLOW,
each parent component is opened with O_DIRECTORY|O_NOFOLLOW relative to the fd of its own parent
(made with mkdirat first when the archive has not made it yet), files are created with
O_CREAT|O_EXCL|O_NOFOLLOW, symlinks with symlinkat, hard links with linkat without
AT_SYMLINK_FOLLOW. So a symlink in the way, made by the archive or planted by anyone, makes the
call fail instead of being followed; and since nothing is written through a link, a link's target
is only content. On top of that, members are refused lexically before any call: a member below a
symlink member or below a file member, and a member that would replace an earlier one.

tarfile's extraction filters are not used at all (in 3.11.7 the `data` filter trusts
os.path.realpath, which gives up past PATH_MAX: CVE-2025-4517).

Refused (IntegrityError naming the archive and the member; the first refused member stops the
extraction): an empty name, a NUL byte, an absolute name, a `..` component, a name over 4096 bytes
or a component over 255, more than `max_depth` components; anything but a regular file, directory,
symlink or hard link (devices, fifos ...); a setuid, setgid or sticky bit (refused, not stripped);
a hard link to anything but a regular file extracted earlier from this archive; a member that
would replace an earlier member or an entry already in `dest`; more than `max_members` members;
file bytes past `max_bytes` (checked against each member's declared size before it is written, and
while it is written). Under policy "inside" also a symlink whose target is absolute, or which,
resolved hop by hop against the symlinks of this archive (lexically, at most 40 hops, never on
disk), leaves its floor: `link_root` for a link under it (a source's `top`, which alone moves into
an environment: a link that left it would point at whatever lies beside it there, `bin/python` or
site-packages say), otherwise its own top-level directory (what moves when no `top` is named), or
`dest` for a link at the top level; this is checked when the link is made and again at the end against all
the archive's links, since a later link can change where an earlier one leads. Under policy "signed"
(cache objects, whose environments hold links like bin/python -> /usr/bin/python3.11) any link
target is kept as content; every other rule holds, and with `top` every member must be under it.

On a refusal `dest` is left as it is, partly written: the caller removes it. Nothing is ever
written outside `dest`.

Modes: files get `mode & 0o755` (never setuid, group and others never write); directories are
made 0o755 and a directory member's own `mode & 0o755` is applied at the end, deepest first, so a
read-only directory does not stop its own contents being written (as GNU tar's
--delay-directory-restore). Owners and mtimes are not restored: entries belong to whoever runs
the store and carry the time of extraction.

Work is bounded for a hostile archive too: a pax or GNU long-name/long-link header is refused on
its declared size (over MAX_EXTENDED_HEADER before one member) before tarfile reads it into
memory; under "inside" a link target is at most 4096 bytes, one resolution processes at most
MAX_RESOLVE_STEPS components and never goes deeper than `max_depth`, and an archive holds at most
MAX_SYMLINKS links; a name or target quoted in an error is cut to QUOTE_CHARS characters.

Memory and time are bounded for 10 GB, 100k-file objects: one pass over the stream ("r|*", so a
non-seekable or zstd-decompressing reader works), tarfile's list of seen headers emptied as it
goes, file data copied in 1 MiB chunks, directory fds kept in a small LRU keyed by relative path
(so a member next to the previous one costs no walk from the root, and the number of open fds
stays bounded whatever the tree's shape).
"""

from __future__ import annotations

import errno
import os
import resource
import tarfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, Self

from llmgw_store.base.errors import IntegrityError, StoreError

MAX_NAME_BYTES = 4096
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 128
MAX_HOPS = 40  # the kernel's own limit on links followed in one lookup
# Work bounds for a hostile archive (10 KB of gzip can hold hundreds of 4 KB link targets, each
# naming the next): components one link's resolution may process, symlinks one archive may hold
# under policy "inside" (each is resolved twice), and the size of a pax or GNU long-name/long-link
# header, which tarfile would otherwise read whole into memory before any other check.
MAX_RESOLVE_STEPS = 1024
MAX_SYMLINKS = 10_000
MAX_EXTENDED_HEADER = 1 << 20
QUOTE_CHARS = 200  # a name or target quoted in an error; past this it is cut
CHUNK = 1 << 20
FD_CACHE = 256  # at most; a quarter of the soft fd limit when that is lower

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SPECIAL_BITS = 0o7000

Policy = Literal["inside", "signed"]


@dataclass
class ExtractStats:
    """What one extraction made; `bytes` is the file contents written (hard links not counted)."""

    members: int = 0
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    bytes: int = 0


class _Refused(Exception):
    """One member is refused; extract_tar turns it into an IntegrityError naming archive and member."""


def _quote(text: str) -> str:
    """`text` as repr for an error, cut to QUOTE_CHARS: a name can be a megabyte long."""
    return repr(text) if len(text) <= QUOTE_CHARS else repr(text[:QUOTE_CHARS]) + f"... ({len(text)} characters)"


_PAX = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_EXTENDED = (*_PAX, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


def _bounded_tarinfo() -> type[_BoundedTarInfo]:
    """A TarInfo class of its own for one extraction (its `extended` total is that stream's)."""

    class Bounded(_BoundedTarInfo):
        extended = 0

    return Bounded


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses a pax (x/g) or GNU long-name/long-link (L/K) header whose declared size is over
    MAX_EXTENDED_HEADER before tarfile reads its data: tarfile reads such a header whole into memory
    (204 KB of gzip declared 625 MB). Through tarfile's public hooks only: `tarinfo=` (the class
    TarFile makes each header with) and the classmethod `frombuf`, which parses each 512-byte header
    before anything reads the data it declares (TarInfo.fromtarfile); an extended header's data is
    read, then the header after it through `frombuf` again, so a chain of extended headers before
    one member is bounded as a whole. `extended` is that total, per extraction (_bounded_tarinfo),
    reset by extract_tar before each member."""

    extended: int

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        info = super().frombuf(buf, encoding, errors)
        if info.type in _EXTENDED:
            cls.extended += info.size
            if cls.extended > MAX_EXTENDED_HEADER:
                raise _Refused(f"{'pax' if info.type in _PAX else 'GNU long-name/long-link'} header(s) of "
                               f"{cls.extended} bytes before one member (at most {MAX_EXTENDED_HEADER})")
        return info


class _Reader(tarfile.TarFile):
    """tarfile's stream reader, as it is; typed with the list of the headers it has read
    (`members`, which typeshed leaves out), which extract_tar empties after each member."""

    members: list[tarfile.TarInfo]


def extract_tar(fileobj: BinaryIO, dest: Path, *, policy: Policy, max_bytes: int | None, max_members: int,
                top: str | None = None, link_root: str | None = None, label: str = "archive",
                max_depth: int = MAX_DEPTH) -> ExtractStats:
    """Unpack the tar stream `fileobj` (plain, gz, bz2 or xz; or an already decompressed stream)
    into `dest`, an existing empty directory the caller made. See the module docstring for what is
    refused. `link_root` (policy "inside"): the directory that will be moved out on its own (a
    source's `top`); a link under it must resolve inside it. On IntegrityError (or any error) the
    caller removes `dest`."""
    if policy not in ("inside", "signed"):
        raise ValueError(f"unknown symlink policy {policy!r}")
    x = _Extractor(Path(dest), policy, max_bytes, max_members, max_depth)
    try:
        x.top = x.root_parts("top", top)
        x.link_root = x.root_parts("link_root", link_root)
        bounded = _bounded_tarinfo()
        with _Reader.open(fileobj=fileobj, mode="r|*", tarinfo=bounded) as tf:
            while True:
                x.name = None  # a refused extended header belongs to no member yet
                bounded.extended = 0
                if (m := tf.next()) is None:
                    break
                del tf.members[:]  # tarfile keeps every header it read; only the current one is needed
                x.name = m.name
                x.member(tf, m)
            x.name = None
            x.finish()
    except _Refused as exc:
        what = f"member {_quote(x.name)} " if x.name is not None else ""
        raise IntegrityError(f"{label}: refusing to unpack: {what}{exc}") from None
    except (tarfile.TarError, EOFError) as exc:
        raise IntegrityError(f"{label}: not a readable tar archive: {exc}") from None
    finally:
        x.close()
    return x.stats


class _Extractor:
    def __init__(self, dest: Path, policy: Policy, max_bytes: int | None, max_members: int, max_depth: int):
        self.policy, self.max_bytes, self.max_members, self.max_depth = policy, max_bytes, max_members, max_depth
        self.top: tuple[str, ...] | None = None
        self.link_root: tuple[str, ...] | None = None
        self.name: str | None = None
        self.stats = ExtractStats()
        # What this extraction made, by relative path: "d" directory, "f" regular file (or a hard
        # link to one), "l" symlink. Once a path is "d" it stays "d" (a non-directory member at it
        # is a replacement, refused), and its parents are "d" too.
        self.kinds: dict[str, str] = {}
        self.links: dict[str, str] = {}  # symlink path -> target, for the "inside" resolution
        self.dir_modes: dict[tuple[str, ...], int] = {}
        self.fds: OrderedDict[str, int] = OrderedDict()  # LRU of open directory fds; the root is apart
        self.fd_cache = max(8, min(FD_CACHE, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4))
        try:
            self.root = os.open(dest, _DIR)  # dest itself must not be a link either
        except OSError as exc:
            raise StoreError(f"cannot open the directory to unpack into: {exc}") from None

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        if self.root >= 0:
            os.close(self.root)
            self.root = -1

    # --- names ---------------------------------------------------------------------------------

    def root_parts(self, what: str, value: str | None) -> tuple[str, ...] | None:
        """The components of the caller's `top` or `link_root`; ValueError (a caller's bug) if bad."""
        if value is None:
            return None
        try:
            parts = self.parts(value)
        except _Refused as exc:
            raise ValueError(f"{what} {value!r} {exc}") from None
        if not parts:
            raise ValueError(f"{what} {value!r} names no directory")
        return parts

    def parts(self, name: str, what: str = "name") -> tuple[str, ...]:
        """The components of a member name or hard-link target, or _Refused."""
        if "\x00" in name:
            raise _Refused(f"has a NUL byte in its {what}")
        try:
            size = len(os.fsencode(name))
        except UnicodeError:
            raise _Refused(f"has a {what} that cannot be encoded") from None
        if not name:
            raise _Refused(f"has an empty {what}")
        if size > MAX_NAME_BYTES:
            raise _Refused(f"has a {what} of {size} bytes (at most {MAX_NAME_BYTES})")
        if name.startswith("/"):
            raise _Refused(f"has an absolute {what}")
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        if ".." in parts:
            raise _Refused(f"has a .. component in its {what}")
        if len(parts) > self.max_depth:
            raise _Refused(f"is {len(parts)} components deep (at most {self.max_depth})")
        for p in parts:
            if len(os.fsencode(p)) > MAX_COMPONENT_BYTES:
                raise _Refused(f"has a component over {MAX_COMPONENT_BYTES} bytes in its {what}")
        return parts

    def check_parents(self, parts: tuple[str, ...]) -> None:
        """No parent of a member is a symlink or a file this archive made (lexically; the fd walk
        refuses anything else in the way)."""
        if len(parts) < 2 or self.kinds.get("/".join(parts[:-1])) == "d":
            return  # a known directory's parents are all directories (see `kinds`)
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            kind = self.kinds.get(prefix)
            if kind == "l":
                raise _Refused(f"is below the symlink member {_quote(prefix)} (a write through a link)")
            if kind == "f":
                raise _Refused(f"is below the file member {_quote(prefix)}")

    # --- members -------------------------------------------------------------------------------

    def member(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.stats.members += 1
        if self.stats.members > self.max_members:
            raise _Refused(f"is past the limit of {self.max_members} members")
        parts = self.parts(m.name)
        if self.top is not None and parts[: len(self.top)] != self.top:
            raise _Refused(f"is outside {'/'.join(self.top)}/")
        if m.mode & _SPECIAL_BITS:
            raise _Refused(f"has a setuid, setgid or sticky bit (mode {m.mode:o})")
        if not parts:  # "." or "./": the destination itself, which the caller owns
            if not m.isdir():
                raise _Refused("has an empty name")
            return
        if self.top is not None and parts == self.top and not m.isdir():
            raise _Refused(f"is {'/'.join(self.top)} itself and not a directory")
        self.check_parents(parts)
        path = "/".join(parts)
        earlier = self.kinds.get(path)
        if m.isdir():
            if earlier not in (None, "d"):
                raise _Refused("would replace an earlier member")
            self.dir(parts)
            self.dir_modes[parts] = m.mode & 0o755
            self.stats.dirs += earlier is None
            return
        if earlier is not None:
            raise _Refused("would replace an earlier member")
        if m.isreg():
            self.file(tf, m, parts)
        elif m.issym():
            self.symlink(m, parts)
        elif m.islnk():
            self.hardlink(m, parts)
        else:
            raise _Refused("is a device, fifo or other special file")
        self.kinds[path] = "l" if m.issym() else "f"

    def file(self, tf: tarfile.TarFile, m: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        limit = self.max_bytes
        if limit is not None and self.stats.bytes + m.size > limit:
            raise _Refused(f"would take the archive past {limit} bytes ({m.size} bytes declared)")
        parent = self.dir(parts[:-1])
        fd = self.syscall(os.open, parts[-1], _NEW_FILE, 0o600, dir_fd=parent)
        try:
            src = tf.extractfile(m)
            assert src is not None, "a regular file's member (member() checked) has its data"
            while chunk := src.read(CHUNK):
                self.stats.bytes += len(chunk)
                if limit is not None and self.stats.bytes > limit:
                    raise _Refused(f"takes the archive past {limit} bytes")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fchmod(fd, m.mode & 0o755)
        finally:
            os.close(fd)
        self.stats.files += 1

    def symlink(self, m: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        target = m.linkname
        if not target or "\x00" in target or len(os.fsencode(target)) > MAX_NAME_BYTES:
            raise _Refused("has an empty, NUL-holding or over-long link target")
        if self.policy == "inside":
            if len(self.links) >= MAX_SYMLINKS:
                raise _Refused(f"is past the limit of {MAX_SYMLINKS} symlinks (each is resolved to check it)")
            self.links["/".join(parts)] = target
            problem = self.escapes(parts, target)
            if problem:
                raise _Refused(problem)
        parent = self.dir(parts[:-1])
        self.syscall(os.symlink, target, parts[-1], dir_fd=parent)
        self.stats.symlinks += 1

    def hardlink(self, m: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        source = self.parts(m.linkname, "hard link target")
        if not source or self.kinds.get("/".join(source)) != "f":
            raise _Refused(f"hard links to {_quote(m.linkname)}, not a regular file extracted earlier from this archive")
        # A copy, so the walk to the other parent cannot close it by evicting it from the LRU.
        src_dir = os.dup(self.dir(source[:-1]))
        try:
            dst_dir = self.dir(parts[:-1])
            self.syscall(os.link, source[-1], parts[-1], src_dir_fd=src_dir, dst_dir_fd=dst_dir,
                         follow_symlinks=False)
        finally:
            os.close(src_dir)
        self.stats.hardlinks += 1

    # --- symlink targets (policy "inside") -----------------------------------------------------

    def floor(self, parts: tuple[str, ...]) -> tuple[int, str]:
        """How many leading components of `parts` a link there may never climb above, and their name.
        Under `link_root` that is link_root: it alone moves into the environment, so a link that
        left it would point at whatever lies beside it there (bin/python, site-packages). Elsewhere
        the link's own top-level directory (what moves when no `top` is named), or dest itself for
        a link at the top level."""
        root = self.link_root
        if root is not None and len(parts) > len(root) and parts[: len(root)] == root:
            return len(root), f"{'/'.join(root)}/"
        return (1, "its top directory") if len(parts) > 1 else (0, "the tree")

    def escapes(self, parts: tuple[str, ...], target: str) -> str | None:
        """Why the link at `parts` leads out of its floor (see `floor`), or None. Every component
        is resolved as the kernel would (a link is expanded before a `..` after it), against this
        archive's links. Bounded: at most MAX_RESOLVE_STEPS components, MAX_HOPS links, and a
        path no deeper than max_depth (no member lies deeper, so no link there could be met)."""
        shown = _quote(target)
        if target.startswith("/"):
            return f"is a symlink to an absolute path ({shown})"
        where = list(parts[:-1])
        floor, above = self.floor(parts)
        todo = target.split("/")
        todo.reverse()  # a stack: the next component is last
        hops = 1  # the link itself, as the kernel counts it: a lookup follows at most 40
        steps = 0
        while todo:
            steps += 1
            if steps > MAX_RESOLVE_STEPS:
                return f"is a symlink whose resolution takes more than {MAX_RESOLVE_STEPS} steps ({shown})"
            c = todo.pop()
            if c in ("", "."):
                continue
            if c == "..":
                if len(where) <= floor:
                    return f"is a symlink that leads out of {above} ({shown})"
                where.pop()
                continue
            where.append(c)
            if len(where) > self.max_depth:
                return f"is a symlink that leads more than {self.max_depth} components deep ({shown})"
            link = self.links.get("/".join(where))
            if link is None:
                continue
            hops += 1
            if hops > MAX_HOPS:
                return f"is a symlink through more than {MAX_HOPS} links ({shown})"
            if link.startswith("/"):
                return f"is a symlink through a link to an absolute path ({shown})"
            where.pop()
            todo.extend(reversed(link.split("/")))
        return None

    # --- the fd walk ---------------------------------------------------------------------------

    def dir(self, parts: tuple[str, ...]) -> int:
        """An fd of directory `parts` (made as needed), reached from the nearest cached ancestor
        without following any link. The fd stays owned by the cache: use it before the next walk."""
        fd, i = self.root, len(parts)
        while i > 0:
            cached = self.fds.get(key := "/".join(parts[:i]))
            if cached is not None:
                self.fds.move_to_end(key)
                fd = cached
                break
            i -= 1
        for j in range(i, len(parts)):
            key, name = "/".join(parts[: j + 1]), parts[j]
            if self.kinds.get(key) != "d":
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # something already there: the no-follow open below takes only a directory
                except OSError as exc:
                    raise StoreError(f"cannot make directory {key}: {exc}") from None
            fd = self.syscall(os.open, name, _DIR, dir_fd=fd, what=key)
            self.fds[key] = fd
            if len(self.fds) > self.fd_cache:
                os.close(self.fds.popitem(last=False)[1])
            self.kinds[key] = "d"
        return fd

    def syscall(self, fn, *args, what: str | None = None, **kwargs):
        """fn(*args); an entry in the way (a link not followed, an earlier entry) refuses the
        member, any other failure (a full disk) is a plain StoreError."""
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            # EEXIST: O_EXCL, symlinkat and linkat never replace; ENOTDIR or ELOOP: O_NOFOLLOW met a
            # symlink (or a file) where a directory was to be opened.
            if exc.errno in (errno.EEXIST, errno.ENOTDIR, errno.ELOOP, errno.EISDIR):
                at = f" at {what}" if what else ""
                raise _Refused(f"meets an entry already in the way{at} ({exc.strerror}), "
                               "which is not followed") from None
            raise StoreError(f"cannot write {_quote(self.name or '')}: {exc}") from None

    def finish(self) -> None:
        if self.policy == "inside":  # a later link may have changed where an earlier one leads
            for path, target in self.links.items():
                problem = self.escapes(tuple(path.split("/")), target)
                if problem:
                    self.name = path
                    raise _Refused(problem + ", once the archive's later links are made")
        for parts in sorted(self.dir_modes, key=len, reverse=True):  # deepest first
            os.fchmod(self.dir(parts), self.dir_modes[parts])
