"""Fetch a content-addressed (format 2) object into a tree: only the blobs this node lacks, as one streaming pipeline.

Order, for one checked object (cache/pull.py has checked its metadata: shape, signature, key):
1. the listing blob (`blobs/<content_hash>`), read at most to its signed compressed size and
   inflated at most to its signed size, must hash to the signed content hash; then every entry is
   checked (cache/objects.py: paths inside the tree, nothing below a link, totals as signed);
2. the plan and manifest blobs, each checked against its signed digest; the plan against the
   listing (every file held once, packs bounded);
3. the files this node already holds — any registered store path whose contents listing (read
   bounded, never through a link) has the digest — are hashed (or not read again, when their
   inode still has the stamp a pull recorded once it had hashed it: core/stamps.py), and
   hard-linked only under the
   store's one sharing rule (core/dedupe.py: the owner's plain file, exactly the canonical mode,
   no xattrs or capability, one of the store's own inodes, same filesystem; two immutable store
   paths then share the inode through the pool, as `optimise` makes them); else copied, hashed
   while copied, into a new inode with the canonical mode. A local file that does not hash to its
   digest is left alone and the blob fetched instead. Nothing is ever linked to a mutable cache;
4. the blobs still needed are fetched in a thread pool: each is streamed (capped at its signed
   compressed size), inflated by a zstd stream writer that hands out at most 1 MiB at a time
   (so a bomb stops at the signed size with bounded memory), and written into the `.partial`
   tree while blake3 hashes the same bytes; a file whose digest or size differs stops the pull
   before anything is renamed (the partial tree is removed), and a pack is checked member by
   member before any member is written;
5. links are made last (so no file is ever written below a link the object makes), modes set
   (files 0444 or 0555, directories 0555), and the finished tree is walked once without reading
   file bytes: its entries, kinds, sizes and link targets must be exactly the listing's. Each
   file's bytes were hashed as they were written, so the tree's content hash is the signed one.
   Once the pull has installed the tree, `stamp_tree` stamps its inodes for the next pull.

Memory: a pack (at most objects.PACK_MAX, in practice 4 MiB) per worker, and 1 MiB buffers.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blake3 import blake3

from llmgw_store.app import debug
from llmgw_store.app.units import human_size
from llmgw_store.base import report
from llmgw_store.base.errors import IntegrityError, StoreError
from llmgw_store.base.report import say
from llmgw_store.cache.objects import EMPTY, Blob, blob_name, digest_of, parse_listing, parse_plan, read_listing
from llmgw_store.core import dedupe, manifest
from llmgw_store.core.manifest import MANIFEST_DIR, Entry
from llmgw_store.core.pathinfo import OfPath, StorePathInfo
from llmgw_store.core.stamps import Stamps, record
from llmgw_store.system import files
from llmgw_store.system.trees import walk

_local = threading.local()
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
ONE_SHOT = 8 << 20  # blobs up to this size (and every pack) are inflated in one call, checked, then written
# The bytes all workers hold inflated whole at once (a larger blob takes all of it): the pull's
# memory, which otherwise grows with THREADS packs; downloads are not held by it.
INFLATED_AT_ONCE = 16 << 20
# Downloads in flight; decoding and writing run in the same workers (zstd and blake3 drop the GIL).
THREADS = int(os.environ.get("LLMGW_STORE_PULL_THREADS", "8"))
CHUNK = 1 << 20


@dataclass(frozen=True)
class BlobRef:
    digest: str
    size: int
    csize: int


@dataclass(frozen=True)
class MetaV2(OfPath):
    """A v2 object's metadata after every check of cache/pull.py: signed by `signer`, for the
    store path `info` (its name, key, content hash, sizes, references: OfPath reads them)."""

    info: StorePathInfo
    listing: BlobRef
    plan: BlobRef
    manifest: BlobRef
    signer: str


@dataclass
class Stats:
    bytes_fetched: int = 0  # compressed bytes downloaded
    bytes_reused: int = 0  # file bytes copied from store paths already here
    bytes_reused_stamped: int = 0  # of those, linked without reading them again (core/stamps.py)
    bytes_written: int = 0  # file bytes written from downloaded blobs
    bytes_resumed: int = 0  # file bytes a pull of the same key fetched and checked before it failed
    blobs_fetched: int = 0
    files: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    # For `stamp_tree`: the tree's entries, and the mtime each reused inode had when it was checked.
    entries: list[Entry] = field(default_factory=list, repr=False)
    checked: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)


class Progress:
    """A transfer's bytes and files done, from any thread, as one step of the process's reporter
    (base/report.py: its rate limit, its --progress mode, JSON included)."""

    def __init__(self, name: str, total_bytes: int, total_files: int, verb: str = "pulling"):
        self.step, self.total, self.total_files = f"{verb} {name}", total_bytes, total_files
        self.done = self.files = 0
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def add(self, nbytes: int, nfiles: int = 0) -> None:
        with self.lock:
            self.done += nbytes
            self.files += nfiles
            report.progress(self.step, self.done, self.total, "B", since=self.started,
                     detail=f"{self.files}/{self.total_files} files")


def _inflate(backend, ref: BlobRef, out: Callable[[bytes], object], label: str) -> int | None:
    """Stream blobs/<digest> through zstd into `out`, at most ref.csize bytes in and ref.size out;
    the number of compressed bytes read, None when the cache lacks it. IntegrityError when
    oversized or not zstd."""
    import zstandard

    produced = 0

    class _Sink:
        def write(self, data: bytes) -> int:
            nonlocal produced
            produced += len(data)
            if produced > ref.size:
                raise IntegrityError(f"{label}: blob {ref.digest[:16]}… inflates past its signed size "
                                     f"({ref.size} bytes); refusing it")
            out(data)
            return len(data)

    try:
        with _dctx().stream_writer(_Sink(), write_size=CHUNK, closefd=False) as w:
            n = backend.stream(blob_name(ref.digest), w.write, max_bytes=ref.csize)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… is not a zstd stream ({exc}); refusing it") from None
    if n is None:
        return None
    if produced != ref.size:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… holds {produced} bytes, not the {ref.size} signed; "
                             "refusing it")
    return n



def inflate(backend, ref: BlobRef, out: Callable[[bytes], object], label: str) -> int | None:
    """`_inflate` for other modules (push checks a blob of an unexpected size by inflating it)."""
    return _inflate(backend, ref, out, label)


def _dctx():
    import zstandard

    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        # One decoder per worker thread, reused for every blob it inflates: a new one per blob
        # would allocate (and fault in) its window buffers again each time.
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


class _Budget:
    """Bytes that threads take before allocating them and give back after (at most `total` out)."""

    def __init__(self, total: int):
        self.total = self.left = total
        self.cond = threading.Condition()

    def take(self, n: int) -> int:
        n = min(n, self.total)
        with self.cond:
            while self.left < n:
                self.cond.wait()
            self.left -= n
        return n

    def give(self, n: int) -> None:
        if n:
            with self.cond:
                self.left += n
                self.cond.notify_all()


def _one_malloc_arena() -> None:
    """Have glibc's malloc make no arena per worker thread: each worker frees a blob's buffers of
    several MiB, which with an arena per thread stayed in the freeing thread's arena, unused by the
    others, so a pull's peak RSS grew by what every arena kept (docs/design-notes.md, "One HTTP
    stack", has the figures; fixing the mmap threshold instead saved a little more memory for twice
    the page faults). Elsewhere, nothing."""
    global _one_arena
    if _one_arena:
        return
    _one_arena = True
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 1)  # M_ARENA_MAX: no new arena for the threads started after this
    except (OSError, AttributeError):  # not glibc
        pass


_one_arena = False


def inflate_whole(backend, ref: BlobRef, label: str, before: Callable[[], None] | None = None
                  ) -> tuple[bytes, int] | None:
    """(the inflated bytes, the compressed size) of a blob of at most ONE_SHOT or PACK_MAX bytes,
    in one call, or None when the cache lacks it: at most ref.csize bytes read, and a frame whose
    header declares another size than the signed one is refused before anything is inflated (zstd
    would allocate what it declares). `before` runs between the download and the inflation."""
    import zstandard

    data = bytearray()  # taken as it arrives, inflated from there: no copy of it is held
    if backend.stream(blob_name(ref.digest), data.extend, max_bytes=ref.csize) is None:
        return None
    if before is not None:
        before()
    try:
        declared = zstandard.frame_content_size(data)
        if declared not in (-1, ref.size):
            raise IntegrityError(f"{label}: blob {ref.digest[:16]}… inflates past its signed size ({ref.size} bytes) "
                                 f"(it declares {declared}); refusing it")
        raw = _dctx().decompress(data, max_output_size=max(ref.size, 1))
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… is not a zstd frame of its signed size ({ref.size} "
                             f"bytes) ({exc}); refusing it") from None
    if len(raw) != ref.size:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… holds {len(raw)} bytes, not the {ref.size} signed; "
                             "refusing it")
    return raw, len(data)


def fetch_small(backend, ref: BlobRef, label: str) -> bytes:
    """A small blob (listing, plan, manifest) in memory, checked against its signed digest."""
    data = _fetch_small(backend, ref, label)
    if data is None:
        raise _lacking(label, ref.digest)
    return data


def _fetch_small(backend, ref: BlobRef, label: str) -> bytes | None:
    buf = bytearray()
    if _inflate(backend, ref, buf.extend, label) is None:
        return None
    if digest_of(bytes(buf)) != ref.digest:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… does not hash to its signed digest; refusing it")
    return bytes(buf)


def _lacking(label: str, digest: str) -> IntegrityError:
    return IntegrityError(f"{label}: the cache lacks blob {digest}; refusing the object (push it again)")


class _Writer:
    """Creates the files of one digest in the partial tree (all its paths at once), hashing the
    bytes as they are written; `close` checks digest and size and sets the final mode."""

    def __init__(self, tree: str, targets: list[Entry], digest: str, size: int, label: str):
        self.digest, self.size, self.label = digest, size, label
        self.h = blake3()
        self.count = 0
        self.fds: list[tuple[int, Entry]] = []
        try:
            for e in targets:
                # Created with its final mode: the fd writes, nobody else can (the partial tree is
                # in the 0700 var/, and nothing of it is used before the checks end).
                self.fds.append((os.open(f"{tree}/{e.path}", _CREATE, 0o555 if e.kind == "x" else 0o444), e))
            self.made = [e for _, e in self.fds]
        except BaseException:
            self.close(check=False)
            raise

    def write(self, data: bytes | memoryview) -> None:
        self.count += len(data)
        if self.count > self.size:
            raise IntegrityError(f"{self.label}: a blob holds more bytes than its file's signed size; refusing it")
        self.h.update(data)
        for fd, _ in self.fds:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

    def close(self, check: bool = True) -> None:
        try:
            if check and (self.count != self.size or self.h.hexdigest() != self.digest):
                raise IntegrityError(f"{self.label}: a blob's bytes do not hash to the signed digest "
                                     f"{self.digest[:16]}…; refusing it")
        finally:
            for fd, _ in self.fds:
                os.close(fd)
            self.fds = []

    def discard(self, tree: str) -> None:
        """Close and remove the files made (after a refusal too: the next source starts clean)."""
        targets = [e for _, e in self.fds] or self.made
        self.close(check=False)
        for e in targets:
            try:
                os.unlink(f"{tree}/{e.path}")
            except FileNotFoundError:
                pass


def _put(tree: str, targets: list[Entry], data: memoryview) -> None:
    """Create the files `targets` of the partial tree, each holding `data` (already checked
    against their digest), with their final modes. A file partly written stays in the partial
    tree, which a failed pull removes whole."""
    for e in targets:
        fd = os.open(f"{tree}/{e.path}", _CREATE, 0o555 if e.kind == "x" else 0o444)
        try:
            view = data
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


@dataclass(frozen=True)
class LocalSource:
    """A file of a registered store path here that its listing says holds a wanted digest: the
    path's directory and the entry (its bytes and its inode are checked when used)."""

    env: Path
    entry: Entry
    pool: Path

    @property
    def path(self) -> Path:
        return self.env / self.entry.path


def local_sources(store, wanted: set[str]) -> dict[str, LocalSource]:
    """digest -> a file of a registered store path here with that digest (by its contents listing,
    read as every store path's metadata is: bounded, never through a link — a signed object's
    `.llmgw/contents` could be a link to /dev/zero; the bytes are checked when used)."""
    found: dict[str, LocalSource] = {}
    pool = store.layout.links_pool
    for row in store.index.paths():
        if len(found) == len(wanted):
            break
        env = store.layout.path_of(row.name)
        try:
            entries = read_listing(manifest.read_contents_bytes(env))
        except (OSError, ValueError):
            continue
        for e in entries:
            if e.kind in "fx" and e.digest in wanted and e.digest not in found:
                found[e.digest] = LocalSource(env, e, pool)
    if found:
        try:
            store.layout.ensure_pool()  # a reused inode enters it (see _link_local); checked like every store dir
        except (OSError, StoreError) as exc:
            say(f"files reused from store paths here are copied, not linked (optimise's pool: {exc})")
    return found


class _LocalDirs:
    """The directories of local store paths that reused files lie in, each opened once per pull
    the way `_open_local` opens them (one component at a time, never through a link) and kept open
    for the files after it (at most MAX_OPEN: opening ten components per file cost more than
    hashing them, issue 31); with /proc/self/fd opened once. `close` when the files are done."""

    MAX_OPEN = 256

    def __init__(self) -> None:
        self.fds: dict[tuple[Path, str], int] = {}
        self.lock = threading.Lock()
        self.proc_fd = dedupe.open_proc_fd()

    def open(self, src: LocalSource) -> tuple[int, os.stat_result] | None:
        head, _, name = src.entry.path.rpartition("/")
        with self.lock:
            dfd = self.fds.get((src.env, head))
        if dfd is None:
            try:
                env = files.open_dir(src.env)
            except OSError:
                return None
            try:
                dfd = files.open_dir(head, dir_fd=env) if head else os.dup(env)
            except OSError:
                return None
            finally:
                os.close(env)
            with self.lock:
                if (src.env, head) not in self.fds and len(self.fds) < self.MAX_OPEN:
                    self.fds[(src.env, head)] = dfd
                    dfd_owned = False
                else:
                    dfd_owned = True
        else:
            dfd_owned = False
        try:
            return files.open_regular(name, dir_fd=dfd)
        except OSError:
            return None
        finally:
            if dfd_owned:
                os.close(dfd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        if self.proc_fd is not None:
            os.close(self.proc_fd)
            self.proc_fd = None


def _open_local(src: LocalSource, dirs: _LocalDirs | None = None) -> tuple[int, os.stat_result] | None:
    """The source file, opened below its store path one component at a time without following a
    link (a directory of the path swapped for a link cannot lead out of the store); None if it is
    not a regular file there. `dirs`: its directory as opened so for an earlier file."""
    if dirs is not None:
        return dirs.open(src)
    try:
        dfd = files.open_dir(src.env)
    except OSError:
        return None
    try:
        return files.open_regular(src.entry.path, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)


def _link_local(src: LocalSource, tree: str, targets: list[Entry], digest: str, size: int,
                stamps: Stamps | None = None, dirs: _LocalDirs | None = None) -> tuple[os.stat_result, bool] | None:
    """Hard-link the paths `targets` of the partial tree to the inode of `src`, a file of another
    registered (immutable) store path, only under the store's one sharing rule (core/dedupe.py):
    a plain file of the store's owner with exactly the canonical mode of the targets' kind and no
    extended attribute (no file capability), one of the store's own inodes (no other link, or the
    pool's entry for its digest), on the same filesystem, whose bytes — read from the descriptor
    that is then linked — are `digest`'s, or which `stamps` says were hashed to `digest` and have
    not changed since (core/stamps.py: same size, mtime and ctime; not read again). Anything else is
    copied instead (None, nothing made): a link would hand another user, a mode such as 0400 or a
    capability to the pulled path. Once linked: the inode's fstat when checked, and whether its
    stamp spared reading it."""
    opened = _open_local(src, dirs)
    if opened is None:
        return None
    fd, st = opened
    made: list[str] = []
    proc_fd = None
    own_proc_fd = dirs is None
    try:
        kind = targets[0].kind
        if (st.st_size != size or any(e.kind != kind for e in targets) or st.st_dev != os.stat(tree).st_dev
                or dedupe.shareable(fd, st, kind) is not None or not dedupe.store_inode(src.pool, st, src.entry)):
            return None
        stamped = stamps is not None and stamps.verified(st, digest)
        if not stamped and manifest.digest_fd(fd, st) != digest:  # the store's one file hash
            return None
        proc_fd = dedupe.open_proc_fd() if dirs is None else dirs.proc_fd
        if st.st_nlink == 1:
            # Shared from now on: it enters the pool first, so it stays one of the store's own
            # inodes by `store_inode`'s test (EEXIST: the pool holds another copy; still fine).
            try:
                dedupe.link_checked(fd, st, os.fspath(src.path), os.fspath(src.pool / dedupe.pool_name(src.entry)),
                                    proc_fd)
            except OSError:
                pass  # no pool, or it holds another copy: linked anyway, this once (later pulls copy it)
        for e in targets:
            dest = f"{tree}/{e.path}"
            dedupe.link_checked(fd, st, os.fspath(src.path), dest, proc_fd)  # the inode just checked
            made.append(dest)
        return st, stamped
    except OSError:
        for dest in made:
            os.unlink(dest)
        return None
    finally:
        os.close(fd)
        if proc_fd is not None and own_proc_fd:
            os.close(proc_fd)


def _copy_local(src: LocalSource, w: _Writer, dirs: _LocalDirs | None = None) -> bool:
    """Copy `src` into the writer (a new inode with the canonical mode); False (nothing kept) when
    it is not a regular file or its bytes are not the digest's."""
    opened = _open_local(src, dirs)
    if opened is None:
        return False
    fd, _ = opened
    try:
        while chunk := os.read(fd, CHUNK):
            if w.count + len(chunk) > w.size:
                return False
            w.write(chunk)
        return w.count == w.size and w.h.hexdigest() == w.digest
    finally:
        os.close(fd)


def _structure(tree: str) -> list[tuple[str, str, int, str]]:
    """(path, kind, size, link target) of every entry below `tree`, .llmgw's files left out, sorted.
    Never follows a link (a link is an entry, not a directory to enter: system/trees.walk)."""
    out: list[tuple[str, str, int, str]] = []
    for rel, st in walk(tree, sort=False, strict=True):
        if not rel:
            continue
        if stat.S_ISLNK(st.st_mode):
            out.append((rel, "l", 0, os.readlink(os.path.join(tree, rel))))
        elif stat.S_ISDIR(st.st_mode):
            out.append((rel, "d", 0, ""))
        elif rel not in (manifest.MANIFEST, manifest.CONTENTS):
            kind = ("x" if st.st_mode & stat.S_IXUSR else "f") if stat.S_ISREG(st.st_mode) else "o"
            out.append((rel, kind, st.st_size if kind != "o" else 0, ""))
    out.sort()
    return out


def _take_resumed(src: str, tree: str, targets: list[Entry], digest: str, size: int) -> bool:
    """Move `src`, a file a failed pull of this key wrote (and checked) into its own partial tree,
    to the paths `targets` of this one, once its bytes are shown to be `digest`'s again: the first
    path takes it by rename, the others as hard links (one immutable inode in one store path).
    Only a regular file of the store's owner, of the size, with no write, setuid, setgid or sticky
    bit, executable exactly when the targets are; False (nothing made) otherwise, and the blob is
    fetched."""
    kinds = {e.kind for e in targets}
    if len(kinds) != 1:
        return False
    executable = kinds == {"x"}
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    made: list[str] = []
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_mode & 0o7222 or bool(st.st_mode & stat.S_IXUSR) != executable
                or st.st_size != size or st.st_uid != os.geteuid()):
            return False
        if manifest.digest_fd(fd, st) != digest:  # the store's one file hash
            return False
        first = f"{tree}/{targets[0].path}"
        os.rename(src, first)
        made.append(first)
        for e in targets[1:]:
            os.link(first, f"{tree}/{e.path}", follow_symlinks=False)
            made.append(f"{tree}/{e.path}")
        got = os.lstat(first)
        if (got.st_ino, got.st_dev) != (st.st_ino, st.st_dev):  # swapped since it was hashed
            raise OSError("changed")
        return True
    except OSError:
        for dest in made:
            os.unlink(dest)
        return False
    finally:
        os.close(fd)


def _resumed_sources(resumed: Path | None, targets: dict[str, list[Entry]]) -> dict[str, str]:
    """digest -> a file of `resumed` (a failed pull's tree of the same object) at one of the
    digest's paths."""
    if resumed is None or not os.path.isdir(resumed):
        return {}
    root = os.fspath(resumed)
    found = {}
    for digest, es in targets.items():
        for e in es:
            if os.path.lexists(f"{root}/{e.path}"):
                found[digest] = f"{root}/{e.path}"
                break
    return found


def _fetch_metadata(caches, meta: MetaV2, label: str, stats: Stats) -> tuple[bytes, list[Entry], list[Blob], bytes]:
    """Steps 1-2: the listing (hashing to the signed content hash), its entries, the plan's blobs and
    the manifest's bytes, each fetched from the first cache of `caches` that serves it checked."""
    t0 = time.monotonic()

    def small(ref: BlobRef) -> bytes:
        data = caches.first(lambda backend: _fetch_small(backend, ref, label))
        if data is None:
            raise _lacking(label, ref.digest)
        return data

    # The three are fetched at once (each checked against its signed digest); the plan and the
    # manifest are used only after the listing is checked.
    with ThreadPoolExecutor(3) as pool:
        listing_f, plan_f, manifest_f = (pool.submit(small, ref) for ref in (meta.listing, meta.plan, meta.manifest))
        listing = listing_f.result()
        if listing and digest_of(listing) != meta.content_hash:
            raise IntegrityError(f"{label}: its listing does not hash to the signed content hash; refusing it")
        entries = parse_listing(listing, meta.size, meta.files, label)
        blobs = parse_plan(plan_f.result(), entries, label)
        manifest_bytes = manifest_f.result()
    stats.bytes_fetched += meta.listing.csize + meta.plan.csize + meta.manifest.csize
    stats.phases["metadata"] = time.monotonic() - t0
    return listing, entries, blobs, manifest_bytes


class _Fill:
    """The files of one tree being filled: the paths of each digest (`targets`), its size, and which
    digests the tree has already (`have`). The workers of every phase share it; `lock` guards `have`
    and `stats`."""

    def __init__(self, tree_s: str, entries: list[Entry], label: str, stats: Stats, progress: Progress) -> None:
        self.tree_s, self.label, self.stats, self.progress = tree_s, label, stats, progress
        self.budget = _Budget(INFLATED_AT_ONCE)
        self.targets: dict[str, list[Entry]] = {}
        for e in entries:
            if e.kind == "d":
                os.mkdir(f"{tree_s}/{e.path}", 0o755)
            elif e.kind in "fx":
                self.targets.setdefault(e.digest, []).append(e)
        for e in self.targets.pop(EMPTY, []):  # an empty file needs no blob
            _Writer(tree_s, [e], EMPTY, 0, label).close()
        self.sizes = {d: es[0].size for d, es in self.targets.items()}
        self.have: set[str] = set()
        self.lock = threading.Lock()

    def resume(self, resumed: Path | None, name: str) -> None:
        """Step 3a: what a failed pull of this key fetched and checked already (in `resumed`)."""
        t0 = time.monotonic()
        stats = self.stats
        kept = _resumed_sources(resumed, self.targets)
        if not kept:
            return

        def resume(digest: str) -> None:
            if _take_resumed(kept[digest], self.tree_s, self.targets[digest], digest, self.sizes[digest]):
                with self.lock:
                    self.have.add(digest)
                    stats.bytes_resumed += self.sizes[digest] * len(self.targets[digest])
                self.progress.add(self.sizes[digest], len(self.targets[digest]))

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(resume, kept))
        say(f"resuming {name}: {len(self.have)} file(s), {human_size(stats.bytes_resumed)} fetched and checked by "
            "a pull that did not finish")
        stats.phases["resume"] = time.monotonic() - t0

    def reuse(self, store) -> None:
        """Step 3b: what this node holds already, linked under the sharing rule or copied."""
        t0 = time.monotonic()
        have, stats = self.have, self.stats
        sources = {d: p for d, p in local_sources(store, set(self.targets) - have).items() if d not in have}
        stats.phases["local-scan"] = time.monotonic() - t0
        t0 = time.monotonic()
        known = Stamps(store.index, sources) if sources else None
        dirs = _LocalDirs()
        try:
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(lambda digest: self._reuse_one(sources[digest], digest, known, dirs), sources))
        finally:
            dirs.close()
        stats.phases["local-copy"] = time.monotonic() - t0

    def _reuse_one(self, source: LocalSource, digest: str, known: Stamps | None, dirs: _LocalDirs) -> None:
        targets, size, stats = self.targets[digest], self.sizes[digest], self.stats
        linked = _link_local(source, self.tree_s, targets, digest, size, known, dirs)
        if linked is not None:
            st, stamped = linked
            with self.lock:
                self.have.add(digest)
                stats.bytes_reused += size * len(targets)
                stats.bytes_reused_stamped += size * len(targets) if stamped else 0
                stats.checked[(st.st_dev, st.st_ino)] = st.st_mtime_ns
            self.progress.add(size, len(targets))
            return
        w = _Writer(self.tree_s, targets, digest, size, self.label)
        if _copy_local(source, w, dirs):
            w.close()
            with self.lock:
                self.have.add(digest)
                stats.bytes_reused += w.size * len(targets)
            self.progress.add(w.size, len(targets))
        else:
            w.discard(self.tree_s)

    def fetch(self, caches, blobs: list[Blob]) -> None:
        """Step 4: the blobs still needed, each from the first cache that serves it checked."""
        t0 = time.monotonic()
        needed = [b for b in blobs if not all(m in self.have for m in b.members)]
        with ThreadPoolExecutor(THREADS) as pool:
            # Largest first: a big file's stream starts at once and the small ones fill the other workers.
            futures = [pool.submit(self._fetch_one, caches, b) for b in sorted(needed, key=lambda b: -b.size)]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:  # the first refusal ends the pull: nothing more is fetched
                    f.cancel()
                raise
        self.stats.phases["fetch+inflate+write"] = time.monotonic() - t0

    def _fetch_one(self, caches, blob: Blob) -> None:
        got = caches.first(lambda backend: self._fetch_from(backend, blob))
        if got is None:
            raise _lacking(self.label, blob.digest)
        n, written, nfiles = got
        self.progress.add(0, nfiles)
        with self.lock:
            self.stats.bytes_fetched += n
            self.stats.bytes_written += written
            self.stats.blobs_fetched += 1
        debug.pause("PULL_BLOB_WRITTEN")  # tests: a pull killed while its partial tree fills

    def _fetch_from(self, backend, blob: Blob) -> tuple[int, int, int] | None:
        """(compressed bytes read, file bytes written, files made) of `blob` from one cache; None
        when it lacks the blob. Whatever a refused attempt wrote is removed first, so the next
        cache starts clean."""
        ref = BlobRef(blob.digest, blob.size, blob.csize)
        if not blob.is_pack and blob.size > ONE_SHOT:
            return self._stream(backend, blob, ref)
        # Checked before written: each file's bytes hash to its digest, then go to its paths.
        held = 0

        def hold() -> None:
            nonlocal held
            held = self.budget.take(blob.size)

        try:
            return self._write_whole(backend, blob, ref, hold)
        finally:
            self.budget.give(held)

    def _write_whole(self, backend, blob: Blob, ref: BlobRef, hold: Callable[[], None]) -> tuple[int, int, int] | None:
        got = inflate_whole(backend, ref, self.label, hold)
        if got is None:
            return None
        raw, n = got
        view, at, parts = memoryview(raw), 0, []
        for m in blob.members:
            part = view[at:at + self.sizes[m]]
            at += self.sizes[m]
            if m in self.have:
                continue
            if blake3(part).hexdigest() != m:
                raise IntegrityError(f"{self.label}: blob {blob.digest[:16]}… holds bytes that do not hash to "
                                     f"their signed digest {m[:16]}…; refusing it")
            parts.append((m, part))
        written = nfiles = 0
        for m, part in parts:
            _put(self.tree_s, self.targets[m], part)  # hashed just above: not again
            written += self.sizes[m] * len(self.targets[m])
            nfiles += len(self.targets[m])
        self.progress.add(written)
        return n, written, nfiles

    def _stream(self, backend, blob: Blob, ref: BlobRef) -> tuple[int, int, int] | None:
        """A large single file, written while it is inflated and hashed (_Writer checks it on close)."""
        targets = self.targets[blob.digest]
        w = _Writer(self.tree_s, targets, blob.digest, blob.size, self.label)
        written = 0

        def out(data: bytes) -> None:
            nonlocal written
            w.write(data)
            written += len(data)
            self.progress.add(len(data))

        try:
            n = _inflate(backend, ref, out, self.label)
            if n is not None:
                w.close()
        except BaseException:
            w.discard(self.tree_s)
            self.progress.add(-written)
            raise
        if n is None:
            w.discard(self.tree_s)
            return None
        return n, blob.size * len(targets), len(targets)


def _finish_tree(tree: Path, meta: MetaV2, entries: list[Entry], listing: bytes, manifest_bytes: bytes) -> None:
    """Step 5: links (last: no file is ever written below a link the object makes), the manifest
    and listing, the structural check against the signed listing, then the frozen modes."""
    tree_s = os.fspath(tree)
    for e in entries:
        if e.kind == "l":
            os.symlink(e.digest, f"{tree_s}/{e.path}")
    meta_dir = tree / MANIFEST_DIR
    meta_dir.mkdir(mode=0o755, exist_ok=True)
    for name, data in ((manifest.MANIFEST, manifest_bytes), (manifest.CONTENTS, listing)):
        fd = os.open(tree / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    want = sorted((e.path, e.kind, e.size, e.digest if e.kind == "l" else "") for e in entries)
    if not any(e.path == MANIFEST_DIR for e in entries):
        want = sorted(want + [(MANIFEST_DIR, "d", 0, "")])
    if _structure(tree_s) != want:
        raise IntegrityError(f"{meta.name}: the pulled tree differs from its signed listing; refusing it")
    for e in reversed(entries):
        if e.kind == "d":
            os.chmod(f"{tree_s}/{e.path}", 0o555)
    os.chmod(meta_dir, 0o555)
    os.chmod(tree, 0o555)


def _checked_manifest(manifest_bytes: bytes, meta: MetaV2) -> dict[str, Any]:
    """The manifest, which must name the signed key, name and content hash."""
    import json

    try:
        doc = json.loads(manifest_bytes)
    except ValueError:
        raise IntegrityError(f"{meta.name}: its manifest is not JSON; refusing it") from None
    if not isinstance(doc, dict) or doc.get("content_hash") != meta.content_hash or doc.get("key") != meta.key \
            or doc.get("name") != meta.name:
        raise IntegrityError(f"{meta.name}: its manifest does not match the signed metadata; refusing it")
    return doc


def build_tree(caches, meta: MetaV2, store, tree: Path, resumed: Path | None = None) -> tuple[dict[str, Any], Stats]:
    """Fill the new directory `tree` with the object's files (steps 1-5 above); its manifest.
    Each blob is asked of every cache of `caches` (cache/caches.py) in order until one serves it
    whole and checked. `resumed`: the tree a pull of the same key left when it failed on the
    network; the files in it that still hash right are taken instead of fetched."""
    label = f"{meta.key}.json"
    stats = Stats()
    _one_malloc_arena()
    listing, entries, blobs, manifest_bytes = _fetch_metadata(caches, meta, label, stats)

    t0 = time.monotonic()
    fill = _Fill(os.fspath(tree), entries, label, stats, Progress(meta.name, meta.size, len(entries)))
    stats.phases["mkdir"] = time.monotonic() - t0
    fill.resume(resumed, meta.name)
    fill.reuse(store)
    fill.fetch(caches, blobs)

    t0 = time.monotonic()
    _finish_tree(tree, meta, entries, listing, manifest_bytes)
    stats.phases["links+check"] = time.monotonic() - t0
    stats.files = len(entries)
    stats.entries = entries
    return _checked_manifest(manifest_bytes, meta), stats


def stamp_tree(store, path: Path, stats: Stats) -> None:
    """Stamp (core/stamps.py) the files of `path`, the store path `build_tree` just filled and the
    pull installed: each was hashed to its digest by this pull (written from a checked blob, copied,
    resumed) or reused as checked — whose inode is stamped only if its mtime is still the one it had
    when checked. Never through a link; a file not as listed is not stamped."""
    t0 = time.monotonic()
    root = os.fspath(path)
    items = []
    for e in stats.entries:
        if e.kind not in "fx" or not e.size:
            continue
        try:
            st = os.lstat(f"{root}/{e.path}")
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
            continue
        was = stats.checked.get((st.st_dev, st.st_ino))
        if was is not None and was != st.st_mtime_ns:
            continue
        items.append((st, e.digest))
    record(store.index, items)
    stats.phases["stamp"] = time.monotonic() - t0
