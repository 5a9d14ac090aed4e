"""The manifest inside each store path, its contents listing, and the content hash of a tree.

`ENV/.llmgw/manifest.json` says what the path is (engine, version, variant, the lock text, the key's
inputs) and carries the content hash of the rest of the tree; `ENV/.llmgw/contents` lists every
entry with its own hash, so `verify` can name the file that changed. The index is rebuilt from
manifests, so everything the index records about a path is in its manifest too.

The contents listing is canonical: one line per entry, sorted by path components, each
`kind <TAB> size <TAB> digest <TAB> path`, where kind is d (directory), f (file), x (file with the
exec bit), l (symlink; digest is its target) or o (anything else). Owners, times and permission
bits other than the exec bit are left out: they differ between machines and do not change what the
environment does. The content hash is blake3 of the listing, so it covers every byte of every file.
Files are hashed in a thread pool while the tree is walked (blake3 releases the GIL): small files
in batches of one read each, large ones through mmap with blake3's own threads. Every file is opened
with O_NOFOLLOW|O_NONBLOCK and checked to be a regular file by its descriptor: a link or a FIFO
swapped in for a file is never followed nor waited on.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from blake3 import blake3

from llmgw_store.app import debug
from llmgw_store.base.report import progress
from llmgw_store.system import files

if TYPE_CHECKING:
    from llmgw_store.core.pathinfo import StorePathInfo

MANIFEST_DIR = ".llmgw"
MANIFEST = f"{MANIFEST_DIR}/manifest.json"
CONTENTS = f"{MANIFEST_DIR}/contents"
_EXCLUDED = {MANIFEST, CONTENTS}
CHUNK = 1 << 20
# The one threshold of every blake3 the store computes over a file (manifest, wheel home, pull,
# push: `hasher`, `digest_fd`): from this size up a whole file is hashed through mmap, and any
# file's bytes with blake3's own threads; below it, in one read and one thread.
MMAP_MIN = 1 << 20
THREADS = min(2, os.cpu_count() or 1)  # large files hashed at once, each with blake3's own threads
# Every file hashed is opened so: never through a link, never waiting on a FIFO.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


class Entry(NamedTuple):
    """One line of the listing. A tuple: made by the ten thousand per verify, so it must be cheap."""

    path: str
    kind: str
    size: int
    digest: str

    def line(self) -> str:
        return f"{self.kind}\t{self.size}\t{_esc(self.digest)}\t{_esc(self.path)}"

    @classmethod
    def parse(cls, line: str) -> Entry:
        kind, size, digest, path = line.split("\t", 3)
        return cls(_unesc(path), kind, int(size), _unesc(digest))


def _esc(s: str) -> str:
    if "\\" not in s and "\t" not in s and "\n" not in s:
        return s
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


_UNESC = {"t": "\t", "n": "\n"}
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def _unesc(s: str) -> str:
    # Most names hold no backslash: returned as they are. Else one regex pass: a backslash and the
    # character after it become that character, t and n a tab and a newline (a lone trailing
    # backslash stays, as it always did).
    if "\\" not in s:
        return s
    return _ESCAPED.sub(lambda m: _UNESC.get(m.group(1), m.group(1)), s)


def _mappable(st: os.stat_result) -> bool:
    """Whether the file may be hashed through mmap: only one no other user can truncate meanwhile
    (a truncated mapping faults with SIGBUS, which would kill the process): owned by this user or
    root, with no group or other write bit. Anything else is read instead."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def hasher(size: int, threads: bool = True) -> blake3:
    """A blake3 for `size` bytes of a file (MMAP_MIN): with blake3's own threads from MMAP_MIN up,
    unless `threads` is False (a forked process, where blake3's thread pool must not be used)."""
    return blake3(max_threads=blake3.AUTO) if threads and size >= MMAP_MIN else blake3()


def digest_fd(fd: int, st: os.stat_result, threads: bool = True) -> str:
    """blake3 of the open regular file `fd` (`st` its fstat): a small file in one read, a large one
    through mmap with blake3's own threads (no Python loop over chunks; the GIL is released while
    hashing, so the pool's other threads go on). `threads=False`: one thread (a forked process,
    where blake3's thread pool must not be used)."""
    size = st.st_size
    if size < MMAP_MIN:
        data = os.read(fd, size + 1)
        if len(data) == size:
            return blake3(data).hexdigest()
        h = blake3(data)  # a short read, or it grew since fstat: hash the rest too
    elif _mappable(st):
        h = hasher(size, threads)
        try:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
            return h.hexdigest()
        except (OSError, ValueError):  # a filesystem without mmap: read it instead
            h = hasher(size, threads)
            os.lseek(fd, 0, os.SEEK_SET)
    else:
        h = hasher(size, threads)
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """blake3 of the regular file at `path`, never through a symlink (OSError for a link, a FIFO,
    a device: what was listed as a file may have been swapped since)."""
    fd, st = files.open_regular(path)  # FileRefused is an OSError
    try:
        return digest_fd(fd, st)
    finally:
        os.close(fd)


class _BigFiles:
    """Hashes the large files of a scan in THREADS threads (mmap, blake3's own threads: the GIL is
    released for all of it) while the scanning thread goes on with the small ones. Small files are
    hashed in the scanning thread itself: their cost is the Python around a few system calls, which
    threads contending for the GIL only make slower (60,000 files: 1.2 s in one thread, 2.2-2.7 s
    in a pool of 2 to 4 on 2 cores). Lighter than concurrent.futures, which pulls in logging at
    import time: verify's start-up counts."""

    def __init__(self) -> None:
        import threading
        from queue import SimpleQueue

        self.jobs: SimpleQueue = SimpleQueue()
        self.digests: dict[int, str | OSError] = {}
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(THREADS)]
        for t in self.threads:
            t.start()

    def submit(self, i: int, fd: int, st: os.stat_result) -> None:
        """Hash `fd` (the pool closes it) for entry `i`."""
        self.jobs.put((i, fd, st))

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            i, fd, st = job
            try:
                self.digests[i] = digest_fd(fd, st)  # one dict item set: atomic
            except OSError as exc:
                self.digests[i] = exc
            finally:
                os.close(fd)

    def finish(self) -> dict[int, str | OSError]:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()
        return self.digests


class _Sinks:
    """What scan's optional out-lists ask of each entry (`writable`, `foreign`, `modes`; see scan),
    and whether the filesystem has extended attributes at all: one listxattr per entry until it
    says it has none (ENOTSUP), then none for the rest of the tree. `xattrs_ok` is a one-item list
    shared with _hash_files, which clears it the same way."""

    def __init__(self, writable: list[str] | None, foreign: list[dict[str, Any]] | None,
                 modes: list[tuple[str, int]] | None) -> None:
        self.writable, self.foreign, self.modes = writable, foreign, modes
        self.euid, self.xattrs_ok = os.geteuid(), [True]

    def xattrs_of(self, target: str | int) -> list[str]:
        if not self.xattrs_ok[0]:
            return []
        try:
            return os.listxattr(target, follow_symlinks=False) if isinstance(target, str) else os.listxattr(target)
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            self.xattrs_ok[0] = False
            return []

    def alien(self, rel: str, uid: int, names: list[str]) -> None:
        if self.foreign is not None and (uid != self.euid or names):
            self.foreign.append({"path": rel, "uid": uid, "xattrs": sorted(names)})

    def root(self, root: Path, st: os.stat_result) -> None:
        if self.writable is not None and st.st_mode & _WRITE:
            self.writable.append(".")
        if self.foreign is not None:
            self.alien(".", st.st_uid, self.xattrs_of(os.fspath(root)))
        if self.modes is not None and not st.st_mode & _WRITE and stat.S_IMODE(st.st_mode) != 0o555:
            self.modes.append((".", stat.S_IMODE(st.st_mode)))

    def listed(self, rel: str, path: str, st: os.stat_result) -> None:
        """An entry the walk stat-ed (anything its directory entry did not say is a regular file)."""
        mode = st.st_mode
        if self.writable is not None and mode & _WRITE and not stat.S_ISLNK(mode):
            self.writable.append(rel)
        if self.foreign is not None:
            self.alien(rel, st.st_uid, self.xattrs_of(path))
        if self.modes is not None and not mode & _WRITE and (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) \
                and stat.S_IMODE(mode) != (0o555 if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0o444):
            self.modes.append((rel, stat.S_IMODE(mode)))

    def hashed(self, rel: str, kind: str, writable: bool, uid: int, names: list[str], mode: int) -> None:
        """A file, as _hash_files saw it by its descriptor."""
        if self.writable is not None and writable:
            self.writable.append(rel)
        self.alien(rel, uid, names)
        if self.modes is not None and not writable and mode != (0o555 if kind == "x" else 0o444):
            self.modes.append((rel, mode))


def _walk(dir_path: str, prefix: str, entries: list[Any], regular: list[tuple[int, str]], sinks: _Sinks) -> None:
    """Append the entries under `dir_path` to `entries` in canonical order (a depth-first walk over
    sorted names); a regular file's slot holds its path, and (its index, its path) goes to
    `regular`, until it is hashed. A file's kind is taken from its directory entry: no stat for it;
    nothing is followed (a link is listed by its target, read with readlink)."""
    with os.scandir(dir_path) as it:
        children = sorted(it, key=lambda e: e.name)
    for e in children:
        rel = prefix + e.name
        if e.is_file(follow_symlinks=False) and rel not in _EXCLUDED:
            regular.append((len(entries), e.path))
            entries.append(rel)  # filled in once the file is hashed
            continue
        st = e.stat(follow_symlinks=False)
        sinks.listed(rel, e.path, st)
        if rel in _EXCLUDED:
            continue
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            entries.append(Entry(rel, "d", 0, ""))
            _walk(e.path, rel + "/", entries, regular, sinks)
        elif stat.S_ISLNK(mode):
            entries.append(Entry(rel, "l", 0, os.readlink(e.path)))
        elif stat.S_ISREG(mode):  # a regular file its directory entry did not say was one
            regular.append((len(entries), e.path))
            entries.append(rel)
        else:
            entries.append(Entry(rel, "o", 0, ""))


def _hash_regular(regular: list[tuple[int, str]], memo: dict | None, want_xattrs: list[bool] | None,
                  big: _BigFiles, step: str) -> tuple[list[tuple], dict[int, str | OSError]]:
    """_hash_files' rows for every file of `regular`, and the digests `big` computed (it is
    finished here). A large tree's files are shared with one forked helper (every other file): the
    Python around each small file is most of their cost, and one process holds one core (threads
    would contend for the GIL). The helper hashes its large files itself, in one thread; when it
    fails, its share is hashed here."""
    child = _fork_helper(regular[1::2], memo, want_xattrs) if len(regular) >= FORK_MIN_FILES and CORES > 1 else None
    mine = regular[0::2] if child is not None else regular
    try:
        results = _hash_files(mine, memo, want_xattrs, big, step)
    finally:
        digests = big.finish()
        theirs = _helper_results(child) if child is not None else []
    if theirs is None:  # the helper failed: its share is hashed here
        again = _BigFiles()
        try:
            theirs = _hash_files(regular[1::2], memo, want_xattrs, again, step)
        finally:
            digests.update(again.finish())
    return results + theirs, digests


def scan(root: Path, writable: list[str] | None = None, *, memo: dict | None = None,
         foreign: list[dict[str, Any]] | None = None, modes: list[tuple[str, int]] | None = None) -> list[Entry]:
    """Every entry under `root` (manifest and listing excluded), in canonical order, files hashed.
    A depth-first walk over sorted names yields the component-wise sorted order directly; it takes
    each entry's kind from its directory entry (d_type: no stat for a file). Then every file is
    opened O_NOFOLLOW|O_NONBLOCK, checked to be a regular file by its descriptor and fstat-ed (its
    exec and write bits, owner and size come from there), read and hashed: a small one in one read
    here, a large one through mmap in a thread of _BigFiles. Raises OSError if a file the walk saw
    as regular cannot be opened as one when it is hashed (swapped for a link or a FIFO meanwhile:
    never followed, never waited on). With `writable`, the paths of entries that have a write bit
    are appended to it (root itself as ".").
    `memo` (one dict for the paths of one verify run) maps the identity of an inode with several
    links (device, inode, size, mtime, ctime) to its digest: a file shared between store paths is
    hashed once per run.
    With `foreign`, each entry (root as ".", the manifest and listing included) not owned by the
    euid that runs the store, or carrying any extended attribute, is appended to it as
    {"path", "uid", "xattrs"}: a build makes neither, so either is a change made after it (a
    chown, a hardlink to an outside file, setcap). One listxattr per entry (a file's by its
    descriptor), skipped for the rest of the tree once the filesystem says it has none (ENOTSUP).
    With `modes`, each file or directory (root as ".") with no write bit whose mode is not the
    frozen canonical one (files 0444, or 0555 with the owner's exec bit; directories 0555) is
    appended to it as (path, mode): a build leaves none (build/canonical.py), and a file of mode
    0400 breaks the environment for the service users who run it while its bytes are right."""
    entries: list[Any] = []
    regular: list[tuple[int, str]] = []  # (index in entries, path) of every regular file
    sinks = _Sinks(writable, foreign, modes)
    sinks.root(root, os.lstat(root))
    big = _BigFiles()
    try:
        _walk(os.fspath(root), "", entries, regular, sinks)
    except BaseException:
        big.finish()
        raise
    debug.pause("HASH_WALKED")  # tests: every entry listed, none hashed (then HASH_PAUSE)
    debug.pause("HASH_PAUSE")
    step = f"hashing {root.name}"
    rows, digests = _hash_regular(regular, memo, sinks.xattrs_ok if foreign is not None else None, big, step)
    errors = [r for r in rows if r[0] == "err"]
    if errors:
        _, _, no, why, path = min(errors, key=lambda r: r[1])
        raise OSError(no, why, path)
    pending: list[tuple[int, tuple]] = []  # inodes with other links hashed here, for the memo
    hashed = 0
    for _, i, kind, size, digest, w, uid, names, ident, mode in sorted(rows, key=lambda r: r[1]):
        rel = entries[i]
        if digest is None:  # a large file, hashed by _BigFiles
            digest = digests[i]
            if isinstance(digest, OSError):
                raise digest
        entries[i] = Entry(rel, kind, size, digest)
        hashed += size
        sinks.hashed(rel, kind, w, uid, names, mode)
        if ident is not None:
            pending.append((i, ident))
    if memo is not None:
        for i, ident in pending:
            memo.setdefault(ident, entries[i].digest)
    progress(step, hashed, hashed, "B")
    return entries


FORK_MIN_FILES = 4096  # below this a helper process costs more than it saves
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _hash_files(files: list[tuple[int, str]], memo: dict | None, xattrs: list[bool] | None,
                big: _BigFiles | None, step: str | None) -> list[tuple]:
    """("ok", index, kind, size, digest, writable, uid, xattr names, memo identity or None, mode) of each
    file, or ("err", index, errno, strerror, path): each opened O_NOFOLLOW|O_NONBLOCK, checked to be
    a regular file by its descriptor and fstat-ed; a small one read and hashed here, a large one
    handed to `big` (digest None: _BigFiles has it), or hashed here in one thread when `big` is None
    (the forked helper, where blake3's thread pool must not run). `memo` gives the digest of an
    inode with other links hashed before in this run. Plain tuples: the helper sends them through
    marshal."""
    out: list[tuple] = []
    append = out.append
    hashed = 0
    for n, (i, path) in enumerate(files):
        if step is not None and n % 64 == 0:
            progress(step, hashed, None, "B")
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            append(("err", i, exc.errno, exc.strerror, path))
            continue
        handed = False
        try:
            st = os.fstat(fd)
            mode = st.st_mode
            if not stat.S_ISREG(mode):
                append(("err", i, errno.EINVAL, "not a regular file", path))
                continue
            names: list[str] = []
            if xattrs is not None and xattrs[0]:
                try:
                    names = os.listxattr(fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                        raise
                    xattrs[0] = False
            size = st.st_size
            hashed += size
            ident = digest = None
            if memo is not None and st.st_nlink > 1:
                ident = (st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
                digest = memo.get(ident)
            if digest is not None:
                pass
            elif size < MMAP_MIN and len(data := os.read(fd, size + 1)) == size:
                digest = blake3(data).hexdigest()
            elif big is not None:
                os.lseek(fd, 0, os.SEEK_SET)
                big.submit(i, fd, st)
                handed = True
            else:
                os.lseek(fd, 0, os.SEEK_SET)
                digest = digest_fd(fd, st, threads=False)
            append(("ok", i, "x" if mode & stat.S_IXUSR else "f", size, digest, bool(mode & _WRITE), st.st_uid,
                    names, ident, stat.S_IMODE(mode)))
        except OSError as exc:
            append(("err", i, exc.errno, exc.strerror, path))
        finally:
            if not handed:
                os.close(fd)
    return out


def _fork_helper(files: list[tuple[int, str]], memo: dict | None, xattrs: list[bool] | None) -> tuple[int, int] | None:
    """(pid, read end of its pipe) of a forked process hashing `files` (_hash_files, one thread),
    which writes its results, marshalled, to the pipe and exits; None when fork fails (the caller
    hashes them itself). The helper reads only what the walk listed and writes only the pipe; it
    stops if its parent dies (it checks every 64 files; the parent also kills it on any exit path)."""
    import marshal

    try:
        r, w = os.pipe()
    except OSError:
        return None
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the helper: nothing here may raise past os._exit
        code = 1
        try:
            os.close(r)
            results = []
            for n in range(0, len(files), 64):
                debug.pause("SCAN_HELPER")  # tests: a slow helper, to see it stop when its parent dies
                if os.getppid() != parent:
                    break
                results += _hash_files(files[n:n + 64], memo, xattrs, None, None)
            else:
                data = memoryview(marshal.dumps(results))
                while data:
                    data = data[os.write(w, data):]
                code = 0
        except BaseException:  # the parent sees the exit code and hashes the share itself
            pass
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _helper_results(child: tuple[int, int]) -> list[tuple] | None:
    """The helper's results, or None if it failed (it is killed and reaped in any case)."""
    import marshal
    import signal

    pid, r = child
    chunks = []
    try:
        while chunk := os.read(r, 1 << 20):
            chunks.append(chunk)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)  # done already, unless this parent is unwinding
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        out = marshal.loads(b"".join(chunks))
    except (ValueError, EOFError, TypeError):
        return None
    return out if isinstance(out, list) else None


def listing(entries: list[Entry]) -> bytes:
    # surrogateescape: a name that is not UTF-8 (os.scandir gives it as lone surrogates) is listed
    # as its own bytes, and parses back to the same str; UTF-8 names are unchanged by it.
    return "".join(e.line() + "\n" for e in entries).encode("utf-8", "surrogateescape")


def shown_path(name: str) -> str:
    """A file name as valid UTF-8 for a report (JSON has no lone surrogates): bytes that are not
    UTF-8 become backslash escapes (b'\\xff' -> '\\xff')."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def content_hash(entries: list[Entry]) -> str:
    return blake3(listing(entries)).hexdigest()


def tree_hash(root: Path) -> tuple[str, int, int]:
    """(content hash, bytes of regular files, number of entries) of the tree."""
    entries = scan(root)
    return content_hash(entries), sum(e.size for e in entries if e.kind in "fx"), len(entries)


# The metadata files' mode is set, not left to the builder's umask (077 would make them 0600, frozen
# 0400, and two builds of one key would differ): 0644, frozen to 0444 as every other file.
META_MODE = 0o644


def write_contents(env: Path, entries: list[Entry]) -> None:
    (env / CONTENTS).write_bytes(listing(entries))
    os.chmod(env / CONTENTS, META_MODE)  # a file this build just wrote in its .partial


def read_contents(env: Path) -> list[Entry]:
    """The listing of `env`, read without following a link at any step (ValueError otherwise)."""
    return parse_contents(read_contents_bytes(env))


def read_contents_bytes(env: Path) -> bytes:
    """`.llmgw/contents` as it is on disk: no link followed, no FIFO waited on, bounded."""
    return _read_meta_file(env, "contents", CONTENTS_MAX)


def parse_contents(raw: bytes) -> list[Entry]:
    # bytes, decoded here: read_text() would translate "\r" and "\r\n" (universal newlines)
    return _parse_listing(raw.decode("utf-8", "surrogateescape"))


def _parse_listing(text: str) -> list[Entry]:
    # Lines end in "\n" only: the format escapes "\n", "\t" and "\\" in names, but a name may hold
    # any other character str.splitlines() would also break on ("\r", "\x0b", "\x85", U+2028...).
    # One loop, no call per line but where a backslash says a field is escaped.
    out = []
    for ln in text.split("\n"):
        if ln:
            kind, size, digest, path = ln.split("\t", 3)
            if "\\" in ln:
                path, digest = _unesc(path), _unesc(digest)
            out.append(Entry(path, kind, int(size), digest))
    return out


def compare(recorded: list[Entry], actual: list[Entry]) -> dict[str, list[str]]:
    """What differs between a recorded listing and the tree now, by path."""
    if recorded == actual:  # the common case, compared in C
        return {"modified": [], "missing": [], "extra": []}
    want = {e.path: e for e in recorded}
    have = {e.path: e for e in actual}
    return {
        "modified": sorted(p for p in want.keys() & have.keys() if want[p] != have[p]),
        "missing": sorted(want.keys() - have.keys()),
        "extra": sorted(have.keys() - want.keys()),
    }


def write(env: Path, info: StorePathInfo) -> None:
    """`env`'s manifest: what is known of the store path (info.to_manifest), sorted, read-only."""
    (env / MANIFEST_DIR).mkdir(exist_ok=True)
    (env / MANIFEST).write_text(json.dumps(info.to_manifest(), indent=2, sort_keys=True) + "\n")
    os.chmod(env / MANIFEST, META_MODE)


def read(env: Path) -> dict[str, Any]:
    """The manifest of `env`, read without following a link at any step (ValueError otherwise)."""
    return json.loads(read_manifest_bytes(env))


def read_manifest_bytes(env: Path) -> bytes:
    """`.llmgw/manifest.json` as it is on disk: no link followed, no FIFO waited on, bounded."""
    return _read_meta_file(env, "manifest.json", MANIFEST_MAX)


def read_meta_file(env: Path, name: str, limit: int | None = None) -> bytes:
    """Another file of `.llmgw/` (a lock file), read as the manifest is (at most MANIFEST_MAX bytes)."""
    return _read_meta_file(env, name, MANIFEST_MAX if limit is None else limit)


PYVENV_CFG = "pyvenv.cfg"
PYVENV_MAX = 64 << 10  # a few lines (home, version, prompt); a larger one is not read


def read_pyvenv_cfg(tree: Path) -> str | None:
    """The text of `tree`'s pyvenv.cfg, None when it has none. Read as every metadata file of a
    store path is (system/files.read_bounded): never through a link (a signed object's pyvenv.cfg may
    be a link to /dev/zero), at most PYVENV_MAX bytes; ValueError (FileRefused) otherwise."""
    fd = files.open_dir(tree)
    try:
        return files.read_bounded(PYVENV_CFG, PYVENV_MAX, dir_fd=fd).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def references_of(tree: Path, store_dir: Path) -> list[str]:
    """Store paths an environment needs, recorded once at registration (as Nix records references):
    the interpreter its pyvenv.cfg names as `home`, when that lies in the store."""
    store = os.path.realpath(store_dir)
    refs = set()
    try:
        text = read_pyvenv_cfg(tree)
    except (OSError, ValueError):
        return []
    for line in (text or "").splitlines()[:200]:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = os.path.realpath(value.strip())
            if home.startswith(store + os.sep):
                refs.add(home[len(store) + 1:].split(os.sep)[0])
    return sorted(refs)


MANIFEST_MAX = 16 << 20  # a manifest holds one lock file and the key's inputs
CONTENTS_MAX = 512 << 20  # one line per entry: millions of files before this is reached


def _read_meta_file(env: Path, name: str, limit: int) -> bytes:
    """`ENV/.llmgw/<name>` of a directory not yet trusted, without following a link at any step (a
    planted link could make this read a device, a FIFO or another user's file), at most `limit`
    bytes (system/files.read_bounded). Raises ValueError."""
    try:
        fd = files.open_dir(env)
        try:
            return files.read_bounded(f"{MANIFEST_DIR}/{name}", limit, dir_fd=fd)
        finally:
            os.close(fd)
    except files.FileRefused as exc:
        raise ValueError(f"{MANIFEST_DIR}/{name} {exc.reason}") from exc
    except OSError as exc:
        raise ValueError(f"cannot read {MANIFEST_DIR}/{name}: {exc.strerror}") from exc


def refused_entry(e: Entry) -> str | None:
    """Why a listed entry may not be in a store path the store takes in (a pull), or None: where
    the store writes or reads a file — anything in `.llmgw/`, and `pyvenv.cfg` — only a regular
    file may be (a link there could make a later read follow it to /dev/zero or a file of root's),
    and `.llmgw` itself is a directory."""
    if e.path == MANIFEST_DIR:
        return None if e.kind == "d" else f"{MANIFEST_DIR} is not a directory"
    if (e.path.startswith(MANIFEST_DIR + "/") or e.path == PYVENV_CFG) and e.kind not in ("f", "x"):
        return f"{e.path} is not a regular file"
    return None


def check_complete(env: Path, name: str, *, rehash: bool) -> StorePathInfo:
    """What the manifest of `env` says, once `env` is shown to be the complete store path `name`: a
    real directory whose manifest names `name` and its key and has every field the index records
    (core/pathinfo.StorePathInfo.from_manifest), whose contents listing hashes to the manifest's
    content hash and, with `rehash`, whose tree is what the listing says, byte for byte. Only a
    finished build writes that listing and that hash, so a directory that passes is complete
    whether or not the index knows it. Raises ValueError saying what is wrong."""
    from llmgw_store.core.pathinfo import StorePathInfo

    doc_bytes = _read_meta_file(env, "manifest.json", MANIFEST_MAX)
    raw = _read_meta_file(env, "contents", CONTENTS_MAX)
    try:
        doc = json.loads(doc_bytes)
        entries = _parse_listing(raw.decode("utf-8", "surrogateescape"))
    except ValueError as exc:  # JSON, UTF-8 and listing lines alike
        raise ValueError(f"its manifest or contents listing is malformed ({exc})") from exc
    info = StorePathInfo.from_manifest(doc, name)
    if content_hash(entries) != info.content_hash:
        raise ValueError("its contents listing does not hash to the manifest's content hash")
    if rehash:
        try:
            differs = compare(entries, scan(env))
        except OSError as exc:
            raise ValueError(f"its tree cannot be read: {exc}") from exc
        for kind, paths in differs.items():
            if paths:
                raise ValueError(f"its tree differs from its listing ({kind}: {paths[0]})")
    return info


def problems_of(doc: Any, name: str) -> list[str]:
    """What the manifest says that the name of its path contradicts: its recorded inputs
    must hash to the key of the path's name (every key is store_key of its inputs), so a rewritten
    input (a build's health command, its requirements) is seen even when the listing is intact."""
    from llmgw_store.core.keys import key_of_name, store_key

    if not isinstance(doc, dict):
        return ["the manifest is not a JSON object"]
    out = []
    inputs = doc.get("inputs")
    if not isinstance(inputs, dict):
        out.append("the manifest records no inputs")
    elif store_key(inputs) != key_of_name(name):
        out.append("the manifest's recorded inputs do not hash to the path's key (they were changed)")
    if doc.get("name") != name:
        out.append("the manifest names another store path")
    return out


def metadata_problems(env: Path, foreign: list[dict[str, Any]]) -> list[str]:
    """`.llmgw/manifest.json` and `.llmgw/contents` must be regular files no one can write (the
    listing leaves them out, so its hash cannot speak for their modes), owned by the store's euid
    and without xattrs (`foreign`, as scan found them)."""
    out = []
    for rel in (MANIFEST, CONTENTS):
        try:
            st = os.lstat(env / rel)
        except FileNotFoundError:
            continue  # read() and read_contents() say so
        if not stat.S_ISREG(st.st_mode):
            out.append(f"{rel} is not a regular file")
        elif st.st_mode & _WRITE:
            out.append(f"{rel} is writable (mode {stat.S_IMODE(st.st_mode):04o})")
    for f in foreign:
        if f["path"] in _EXCLUDED:
            out.append(f"{f['path']} is owned by uid {f['uid']}" + (f" and has xattrs {', '.join(f['xattrs'])}"
                                                                      if f["xattrs"] else ""))
    return out
