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
from typing import Any, NamedTuple

from blake3 import blake3

from llmgw_store.core import debug
from llmgw_store.core.report import progress

MANIFEST_DIR = ".llmgw"
MANIFEST = f"{MANIFEST_DIR}/manifest.json"
CONTENTS = f"{MANIFEST_DIR}/contents"
_EXCLUDED = {MANIFEST, CONTENTS}
CHUNK = 1 << 20
MMAP_MIN = 1 << 20  # files from this size up are hashed through mmap with blake3's threads
THREADS = min(8, (os.cpu_count() or 1) * 2)
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
    def parse(cls, line: str) -> "Entry":
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


def _open_regular(path: str | Path) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file at `path`, opened without following a link and without
    blocking on a FIFO; OSError for anything else (what was listed as a file may have been swapped
    since)."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _mappable(st: os.stat_result) -> bool:
    """Whether the file may be hashed through mmap: only one no other user can truncate meanwhile
    (a truncated mapping faults with SIGBUS, which would kill the process): owned by this user or
    root, with no group or other write bit. Anything else is read instead."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def digest_fd(fd: int, st: os.stat_result) -> str:
    """blake3 of the open regular file `fd` (`st` its fstat): a small file in one read, a large one
    through mmap with blake3's own threads (no Python loop over chunks; the GIL is released while
    hashing, so the pool's other threads go on)."""
    size = st.st_size
    if size < MMAP_MIN:
        data = os.read(fd, size + 1)
        if len(data) == size:
            return blake3(data).hexdigest()
        h = blake3(data)  # a short read, or it grew since fstat: hash the rest too
    elif _mappable(st):
        h = blake3(max_threads=blake3.AUTO)
        try:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
            return h.hexdigest()
        except (OSError, ValueError):  # a filesystem without mmap: read it instead
            h = blake3(max_threads=blake3.AUTO)
            os.lseek(fd, 0, os.SEEK_SET)
    else:
        h = blake3(max_threads=blake3.AUTO)
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """blake3 of the regular file at `path`, never through a symlink (OSError for a link, a FIFO,
    a device: what was listed as a file may have been swapped since)."""
    fd, st = _open_regular(path)
    try:
        return digest_fd(fd, st)
    finally:
        os.close(fd)


def _digest_batch(paths: list[str]) -> list[str | OSError]:
    """Digests of a batch of files (one pool task for many small files: a task per file costs more
    than hashing it), each opened as `file_digest` opens it. An OSError is returned in its place,
    for the caller to raise in order. The small-file case is written out here: it is most files."""
    out: list[str | OSError] = []
    append = out.append
    for p in paths:
        try:
            fd = os.open(p, _OPEN_FLAGS)
        except OSError as exc:
            append(exc)
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                append(OSError(errno.EINVAL, "not a regular file", p))
                continue
            size = st.st_size
            if size < MMAP_MIN:
                data = os.read(fd, size + 1)
                if len(data) == size:
                    append(blake3(data).hexdigest())
                    continue
                os.lseek(fd, 0, os.SEEK_SET)
            append(digest_fd(fd, st))
        except OSError as exc:
            append(exc)
        finally:
            os.close(fd)
    return out


BATCH_FILES = 64  # small files per pool task
BATCH_BYTES = 4 << 20  # or fewer, once their sizes add up to this


class _Pool:
    """`THREADS` threads hashing batches of files while the walk goes on (a thread per core and
    more: open, read and hash all release the GIL). Lighter than concurrent.futures, which pulls in
    logging at import time: verify's start-up counts. Results are (entry indexes, digests) pairs,
    appended in any order; the first exception a worker meets is raised by `finish`."""

    def __init__(self) -> None:
        import threading
        from queue import SimpleQueue

        self.jobs: SimpleQueue = SimpleQueue()
        self.done: list[tuple[list[int], list[str | OSError]]] = []
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(THREADS)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        debug.pause("HASH_PAUSE")  # tests: the walk has listed files that are not hashed yet
        while (job := self.jobs.get()) is not None:
            idx, paths = job
            try:
                self.done.append((idx, _digest_batch(paths)))  # list.append is atomic
            except BaseException as exc:  # noqa: BLE001 - handed to the caller by finish()
                self.error = exc

    def submit(self, idx: list[int], paths: list[str]) -> None:
        self.jobs.put((idx, paths))

    def finish(self) -> list[tuple[list[int], list[str | OSError]]]:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()
        if self.error is not None:
            raise self.error
        return self.done


def scan(root: Path, writable: list[str] | None = None, *, memo: dict | None = None,
         foreign: list[dict[str, Any]] | None = None) -> list[Entry]:
    """Every entry under `root` (manifest and listing excluded), in canonical order, files hashed.
    A depth-first walk over sorted names yields the component-wise sorted order directly. With
    `writable`, the paths of entries that have a write bit are appended to it (root itself as ".").
    Files are hashed in a pool while the walk goes on: small ones in batches, large ones one per
    task with blake3's threads. Raises OSError if a file the walk saw as regular cannot be opened
    as one when it is hashed (swapped for a link or a FIFO meanwhile: never followed).
    `memo` (one dict for the paths of one verify run) maps the identity of an inode with several
    links (device, inode, size, mtime, ctime) to its digest: a file shared between store paths is
    hashed once per run.
    With `foreign`, each entry (root as ".", the manifest and listing included) not owned by the
    euid that runs the store, or carrying any extended attribute, is appended to it as
    {"path", "uid", "xattrs"}: a build makes neither, so either is a change made after it (a
    chown, a hardlink to an outside file, setcap). One listxattr per entry, skipped for the rest of
    the tree once the filesystem says it has none (ENOTSUP)."""
    entries: list[Any] = []
    batch_idx: list[int] = []
    batch_paths: list[str] = []
    batch_bytes = 0
    pending: list[tuple[int, tuple]] = []  # shared inodes hashed in this scan, for the memo
    check_w = writable is not None
    step, hashed = f"hashing {root.name}", [0]
    root_st = os.lstat(root)
    if check_w and root_st.st_mode & _WRITE:
        writable.append(".")
    euid, xattrs_ok = os.geteuid(), [True]

    def alien(path: str, rel: str, uid: int) -> None:
        names: list[str] = []
        if xattrs_ok[0]:
            try:
                names = os.listxattr(path, follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                xattrs_ok[0] = False
        if uid != euid or names:
            foreign.append({"path": rel, "uid": uid, "xattrs": sorted(names)})

    if foreign is not None:
        alien(os.fspath(root), ".", root_st.st_uid)
    S_ISREG, S_ISDIR, S_ISLNK, S_IXUSR = stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK, stat.S_IXUSR
    pool = _Pool()

    def flush() -> None:
        nonlocal batch_idx, batch_paths, batch_bytes
        if batch_paths:
            pool.submit(batch_idx, batch_paths)
            batch_idx, batch_paths, batch_bytes = [], [], 0

    def walk(dir_path: str, prefix: str) -> None:
        nonlocal batch_bytes
        with os.scandir(dir_path) as it:
            children = sorted(it, key=lambda e: e.name)
        for e in children:
            rel = prefix + e.name
            st = e.stat(follow_symlinks=False)
            mode = st.st_mode
            if check_w and mode & _WRITE and not S_ISLNK(mode):
                writable.append(rel)
            if foreign is not None:
                alien(e.path, rel, st.st_uid)
            if rel in _EXCLUDED:
                continue
            if S_ISREG(mode):
                size = st.st_size
                hashed[0] += size
                if len(entries) % 64 == 0 or size >= MMAP_MIN:
                    progress(step, hashed[0], None, "B")
                kind = "x" if mode & S_IXUSR else "f"
                if memo is not None and st.st_nlink > 1:
                    ident = (st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
                    known = memo.get(ident)
                    if known is not None:
                        entries.append(Entry(rel, kind, size, known))
                        continue
                    pending.append((len(entries), ident))
                if size >= MMAP_MIN:
                    pool.submit([len(entries)], [e.path])
                else:
                    batch_idx.append(len(entries))
                    batch_paths.append(e.path)
                    batch_bytes += size
                    if len(batch_paths) >= BATCH_FILES or batch_bytes >= BATCH_BYTES:
                        flush()
                entries.append((rel, kind, size))
            elif S_ISDIR(mode):
                entries.append(Entry(rel, "d", 0, ""))
                walk(e.path, rel + "/")
            elif S_ISLNK(mode):
                entries.append(Entry(rel, "l", 0, os.readlink(e.path)))
            else:
                entries.append(Entry(rel, "o", 0, ""))

    try:
        walk(os.fspath(root), "")
        flush()
        debug.pause("HASH_WALKED")  # tests: every entry listed and queued; hashing held by HASH_PAUSE
    finally:
        done = pool.finish()
    for idx, digests in done:
        for i, d in zip(idx, digests):
            if isinstance(d, OSError):
                raise d
            rel, kind, size = entries[i]
            entries[i] = Entry(rel, kind, size, d)
    if memo is not None:
        for i, ident in pending:
            memo[ident] = entries[i].digest
    progress(step, hashed[0], hashed[0], "B")
    return entries


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


def write(env: Path, manifest: dict[str, Any]) -> None:
    (env / MANIFEST_DIR).mkdir(exist_ok=True)
    (env / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.chmod(env / MANIFEST, META_MODE)


def read(env: Path) -> dict[str, Any]:
    """The manifest of `env`, read without following a link at any step (ValueError otherwise)."""
    return json.loads(_read_meta_file(env, "manifest.json", MANIFEST_MAX))


def references_of(tree: Path, store_dir: Path) -> list[str]:
    """Store paths an environment needs, recorded once at registration (as Nix records references):
    the interpreter its pyvenv.cfg names as `home`, when that lies in the store."""
    store = os.path.realpath(store_dir)
    refs = set()
    try:
        text = (tree / "pyvenv.cfg").read_text()
    except OSError:
        return []
    for line in text.splitlines()[:200]:
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = os.path.realpath(value.strip())
            if home.startswith(store + os.sep):
                refs.add(home[len(store) + 1:].split(os.sep)[0])
    return sorted(refs)


MANIFEST_MAX = 16 << 20  # a manifest holds one lock file and the key's inputs
CONTENTS_MAX = 512 << 20  # one line per entry: millions of files before this is reached
REQUIRED = ("name", "key", "engine", "version", "variant", "content_hash", "size", "files", "build_seconds", "installed")


def _read_meta_file(env: Path, name: str, limit: int) -> bytes:
    """`ENV/.llmgw/<name>` of a directory not yet trusted, without following a link at any step (a
    planted link could make this read a device, a FIFO or another user's file), at most `limit`
    bytes. Raises ValueError."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(env, flags | os.O_DIRECTORY))
        fds.append(os.open(MANIFEST_DIR, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(name, flags | os.O_NONBLOCK, dir_fd=fds[-1]))
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{MANIFEST_DIR}/{name} is not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{MANIFEST_DIR}/{name} is larger than {limit} bytes")
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fds[-1], min(CHUNK, left))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise ValueError(f"{MANIFEST_DIR}/{name} is larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"cannot read {MANIFEST_DIR}/{name}: {exc.strerror}") from exc
    finally:
        for fd in reversed(fds):
            os.close(fd)


def check_complete(env: Path, name: str, *, rehash: bool) -> dict[str, Any]:
    """The manifest of `env`, once `env` is shown to be the complete store path `name`: a real
    directory whose manifest names `name` and its key and has every field the index records, whose
    contents listing hashes to the manifest's content hash and, with `rehash`, whose tree is what
    the listing says, byte for byte. Only a finished build writes that listing and that hash, so a
    directory that passes is complete whether or not the index knows it. Raises ValueError saying
    what is wrong."""
    from llmgw_store.core.keys import key_of_name

    doc_bytes = _read_meta_file(env, "manifest.json", MANIFEST_MAX)
    raw = _read_meta_file(env, "contents", CONTENTS_MAX)
    try:
        doc = json.loads(doc_bytes)
        entries = _parse_listing(raw.decode("utf-8", "surrogateescape"))
    except ValueError as exc:  # JSON, UTF-8 and listing lines alike
        raise ValueError(f"its manifest or contents listing is malformed ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("name") != name or doc.get("key") != key_of_name(name):
        raise ValueError("its manifest names another store path")
    missing = [f for f in REQUIRED if f not in doc]
    if missing:
        raise ValueError(f"its manifest lacks {', '.join(missing)}")
    if content_hash(entries) != doc["content_hash"]:
        raise ValueError("its contents listing does not hash to the manifest's content hash")
    if rehash:
        try:
            differs = compare(entries, scan(env))
        except OSError as exc:
            raise ValueError(f"its tree cannot be read: {exc}") from exc
        for kind, paths in differs.items():
            if paths:
                raise ValueError(f"its tree differs from its listing ({kind}: {paths[0]})")
    return doc


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
