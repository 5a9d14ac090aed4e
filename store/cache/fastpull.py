"""Pull of a content-addressed (v2) object: only the blobs this node lacks, as one streaming pipeline.

Order, for one checked object (cache/pull.py has checked its metadata: shape, signature, key):
1. the listing blob (`blobs/<content_hash>`), read at most to its signed compressed size and
   inflated at most to its signed size, must hash to the signed content hash; then every entry is
   checked (cache/objects.py: paths inside the tree, nothing below a link, totals as signed);
2. the plan and manifest blobs, each checked against its signed digest; the plan against the
   listing (every file held once, packs bounded);
3. the files this node already holds — any registered store path whose contents listing has the
   digest — are hashed, and hard-linked when the file is read-only, of the same kind and on the
   same filesystem (two immutable store paths then share the inode, as `optimise` makes them);
   else copied, hashed while copied. A local file that does not hash to its digest is left alone
   and the blob fetched instead. Nothing is ever linked to a mutable cache;
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

from llmgw_store.cache.objects import EMPTY, Blob, blob_name, digest_of, parse_listing, parse_plan, read_listing
from llmgw_store.core import manifest
from llmgw_store.core.errors import IntegrityError
from llmgw_store.core.manifest import MANIFEST_DIR, Entry
from llmgw_store.core.report import say
from llmgw_store.core.units import human_size

_local = threading.local()
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
ONE_SHOT = 8 << 20  # blobs up to this size (and every pack) are inflated in one call, checked, then written
THREADS = int(os.environ.get("LLMGW_STORE_PULL_THREADS", "8"))  # downloads in flight; decoding and writing run in the same workers (zstd and blake3 drop the GIL)
CHUNK = 1 << 20
PROGRESS_EVERY = 1.0


@dataclass(frozen=True)
class BlobRef:
    digest: str
    size: int
    csize: int


@dataclass(frozen=True)
class MetaV2:
    """A v2 object's metadata after every check of cache/pull.py: signed by `signer`, for `key`."""

    key: str
    name: str
    content_hash: str
    size: int
    files: int
    references: tuple[str, ...]
    listing: BlobRef
    plan: BlobRef
    manifest: BlobRef
    signer: str


@dataclass
class Stats:
    bytes_fetched: int = 0  # compressed bytes downloaded
    bytes_reused: int = 0  # file bytes copied from store paths already here
    bytes_written: int = 0  # file bytes written from downloaded blobs
    blobs_fetched: int = 0
    files: int = 0
    phases: dict[str, float] = field(default_factory=dict)


class Progress:
    """At most one line a second: bytes and files done, rate, ETA."""

    def __init__(self, name: str, total_bytes: int, total_files: int, verb: str = "pulling"):
        self.name, self.total, self.total_files, self.verb = name, total_bytes, total_files, verb
        self.done = self.files = 0
        self.started = self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, nbytes: int, nfiles: int = 0) -> None:
        with self.lock:
            self.done += nbytes
            self.files += nfiles
            now = time.monotonic()
            if now - self.last < PROGRESS_EVERY:
                return
            self.last = now
            rate = self.done / max(now - self.started, 1e-6)
            eta = (self.total - self.done) / rate if rate > 0 else 0
            say(f"{self.verb} {self.name}: {human_size(self.done)}/{human_size(self.total)}, {self.files}/{self.total_files} "
                f"files, {human_size(rate)}/s, ETA {eta:.0f}s")


def _inflate(backend, ref: BlobRef, out: Callable[[bytes], None], label: str) -> int:
    """Stream blobs/<digest> through zstd into `out`, at most ref.csize bytes in and ref.size out;
    the number of compressed bytes read. IntegrityError when absent, oversized or not zstd."""
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
        raise IntegrityError(f"{label}: the cache lacks blob {ref.digest}; refusing the object (push it again)")
    if produced != ref.size:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… holds {produced} bytes, not the {ref.size} signed; "
                             "refusing it")
    return n


def _dctx():
    import zstandard

    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        # One decoder per worker thread, reused for every blob it inflates: a new one per blob
        # would allocate (and fault in) its window buffers again each time.
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def inflate_whole(backend, ref: BlobRef, label: str) -> tuple[bytes, int]:
    """(the inflated bytes, the compressed size) of a blob of at most ONE_SHOT or PACK_MAX bytes,
    in one call: at most ref.csize bytes read, and a frame whose header declares another size than
    the signed one is refused before anything is inflated (zstd would allocate what it declares)."""
    import zstandard

    data = backend.get(blob_name(ref.digest), max_bytes=ref.csize)
    if data is None:
        raise IntegrityError(f"{label}: the cache lacks blob {ref.digest}; refusing the object (push it again)")
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
    buf = bytearray()
    _inflate(backend, ref, buf.extend, label)
    if digest_of(bytes(buf)) != ref.digest:
        raise IntegrityError(f"{label}: blob {ref.digest[:16]}… does not hash to its signed digest; refusing it")
    return bytes(buf)


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
        targets = [e for _, e in self.fds]
        self.close(check=False)
        for e in targets:
            os.unlink(f"{tree}/{e.path}")


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


def local_sources(store, wanted: set[str]) -> dict[str, Path]:
    """digest -> a file of a registered store path here with that digest (by its contents listing;
    the bytes are checked when copied)."""
    found: dict[str, Path] = {}
    for row in store.index.paths():
        if len(found) == len(wanted):
            break
        env = store.layout.path_of(row.name)
        try:
            entries = read_listing((env / manifest.CONTENTS).read_bytes())
        except (OSError, ValueError):
            continue
        for e in entries:
            if e.kind in "fx" and e.digest in wanted and e.digest not in found:
                found[e.digest] = env / e.path
    return found


def _link_local(src: Path, tree: str, targets: list[Entry], digest: str, size: int) -> bool:
    """Hard-link the paths `targets` of the partial tree to `src`, a file of another registered
    (immutable) store path, once its bytes are shown to be `digest`'s: both names are then store
    paths, which nothing writes (a mutable cache is never linked). Only when `src` is a read-only
    regular file of the targets' kind on the same filesystem; False (nothing made) otherwise."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    made: list[str] = []
    try:
        st = os.fstat(fd)
        kind = "x" if st.st_mode & stat.S_IXUSR else "f"
        if (not stat.S_ISREG(st.st_mode) or st.st_mode & 0o7222 or st.st_size != size
                or any(e.kind != kind for e in targets)):
            return False
        h = blake3(max_threads=blake3.AUTO) if size >= 8 << 20 else blake3()
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
        if h.hexdigest() != digest:
            return False
        for e in targets:
            dest = f"{tree}/{e.path}"
            os.link(src, dest, follow_symlinks=False)
            made.append(dest)
            got = os.lstat(dest)
            if (got.st_ino, got.st_dev) != (st.st_ino, st.st_dev):  # swapped since it was hashed
                raise OSError("changed")
        return True
    except OSError:
        for dest in made:
            os.unlink(dest)
        return False
    finally:
        os.close(fd)


def _copy_local(src: Path, w: _Writer) -> bool:
    """Copy `src` into the writer; False (nothing kept) when it is not a regular file or its bytes
    are not the digest's."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        while chunk := os.read(fd, CHUNK):
            if w.count + len(chunk) > w.size:
                return False
            w.write(chunk)
        return w.count == w.size and w.h.hexdigest() == w.digest
    finally:
        os.close(fd)


def _structure(tree: str) -> list[tuple[str, str, int, str]]:
    """(path, kind, size, link target) of every entry below `tree`, .llmgw's files left out, sorted.
    Never follows a link (a link is an entry, not a directory to enter)."""
    out: list[tuple[str, str, int, str]] = []
    todo = [("", tree)]
    while todo:
        prefix, path = todo.pop()
        with os.scandir(path) as it:
            for d in it:
                rel = prefix + d.name
                if d.is_symlink():
                    out.append((rel, "l", 0, os.readlink(d.path)))
                elif d.is_dir(follow_symlinks=False):
                    out.append((rel, "d", 0, ""))
                    todo.append((rel + "/", d.path))
                elif rel not in (manifest.MANIFEST, manifest.CONTENTS):
                    st = d.stat(follow_symlinks=False)
                    kind = ("x" if st.st_mode & stat.S_IXUSR else "f") if stat.S_ISREG(st.st_mode) else "o"
                    out.append((rel, kind, st.st_size if kind != "o" else 0, ""))
    out.sort()
    return out


def build_tree(backend, meta: MetaV2, store, tree: Path) -> tuple[dict[str, Any], Stats]:
    """Fill the new directory `tree` with the object's files (steps 1-5 above); its manifest."""
    label = f"{meta.key}.json"
    stats = Stats()
    t0 = time.monotonic()
    # The three are fetched at once (each checked against its signed digest); the plan and the
    # manifest are used only after the listing is checked.
    with ThreadPoolExecutor(3) as pool:
        listing_f, plan_f, manifest_f = (pool.submit(fetch_small, backend, ref, label)
                                         for ref in (meta.listing, meta.plan, meta.manifest))
        listing = listing_f.result()
        if listing and digest_of(listing) != meta.content_hash:
            raise IntegrityError(f"{label}: its listing does not hash to the signed content hash; refusing it")
        entries = parse_listing(listing, meta.size, meta.files, label)
        blobs = parse_plan(plan_f.result(), entries, label)
        manifest_bytes = manifest_f.result()
    stats.bytes_fetched += meta.listing.csize + meta.plan.csize + meta.manifest.csize
    stats.phases["metadata"] = time.monotonic() - t0

    t0 = time.monotonic()
    tree_s = os.fspath(tree)
    targets: dict[str, list[Entry]] = {}
    for e in entries:
        if e.kind == "d":
            os.mkdir(f"{tree_s}/{e.path}", 0o755)
        elif e.kind in "fx":
            targets.setdefault(e.digest, []).append(e)
    for e in targets.pop(EMPTY, []):  # an empty file needs no blob
        _Writer(tree_s, [e], EMPTY, 0, label).close()
    sizes = {d: es[0].size for d, es in targets.items()}
    progress = Progress(meta.name, meta.size, len(entries))
    stats.phases["mkdir"] = time.monotonic() - t0

    # 3. what this node holds already
    t0 = time.monotonic()
    sources = local_sources(store, set(targets))
    stats.phases["local-scan"] = time.monotonic() - t0
    t0 = time.monotonic()
    have: set[str] = set()
    lock = threading.Lock()

    def copy(digest: str) -> None:
        if _link_local(sources[digest], tree_s, targets[digest], digest, sizes[digest]):
            with lock:
                have.add(digest)
                stats.bytes_reused += sizes[digest] * len(targets[digest])
            progress.add(sizes[digest], len(targets[digest]))
            return
        w = _Writer(tree_s, targets[digest], digest, sizes[digest], label)
        if _copy_local(sources[digest], w):
            w.close()
            with lock:
                have.add(digest)
                stats.bytes_reused += w.size * len(targets[digest])
            progress.add(w.size, len(targets[digest]))
        else:
            w.discard(tree_s)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(copy, sources))
    stats.phases["local-copy"] = time.monotonic() - t0

    # 4. the blobs still needed
    t0 = time.monotonic()
    needed = [b for b in blobs if not all(m in have for m in b.members)]

    def fetch(blob: Blob) -> None:
        ref = BlobRef(blob.digest, blob.size, blob.csize)
        if not blob.is_pack and blob.size > ONE_SHOT:
            w = _Writer(tree_s, targets[blob.digest], blob.digest, blob.size, label)
            try:
                n = _inflate(backend, ref, lambda data: (w.write(data), progress.add(len(data))), label)
                w.close()
            except BaseException:
                w.close(check=False)
                raise
            written = blob.size * len(targets[blob.digest])
            nfiles = len(targets[blob.digest])
        else:
            # Checked before written: each file's bytes hash to its digest, then go to its paths.
            raw, n = inflate_whole(backend, ref, label)
            view, at, written, nfiles = memoryview(raw), 0, 0, 0
            for m in blob.members:
                part = view[at:at + sizes[m]]
                at += sizes[m]
                if m in have:
                    continue
                if blake3(part).hexdigest() != m:
                    raise IntegrityError(f"{label}: blob {blob.digest[:16]}… holds bytes that do not hash to "
                                         f"their signed digest {m[:16]}…; refusing it")
                _put(tree_s, targets[m], part)  # hashed just above: not again
                written += sizes[m] * len(targets[m])
                nfiles += len(targets[m])
            progress.add(written)
        progress.add(0, nfiles)
        with lock:
            stats.bytes_fetched += n
            stats.bytes_written += written
            stats.blobs_fetched += 1

    with ThreadPoolExecutor(THREADS) as pool:
        # Largest first: a big file's stream starts at once and the small ones fill the other workers.
        futures = [pool.submit(fetch, b) for b in sorted(needed, key=lambda b: -b.size)]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:  # the first refusal ends the pull: nothing more is fetched
                f.cancel()
            raise
    stats.phases["fetch+inflate+write"] = time.monotonic() - t0

    # 5. links, modes, the structural check
    t0 = time.monotonic()
    for e in entries:
        if e.kind == "l":
            os.symlink(e.digest, f"{tree_s}/{e.path}")
    meta_dir = tree / MANIFEST_DIR
    meta_dir.mkdir(mode=0o755, exist_ok=True)
    for name, data in ((manifest.MANIFEST, manifest_bytes), (manifest.CONTENTS, listing)):
        fd = os.open(tree / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
    stats.phases["links+check"] = time.monotonic() - t0
    stats.files = len(entries)

    import json

    try:
        doc = json.loads(manifest_bytes)
    except ValueError:
        raise IntegrityError(f"{meta.name}: its manifest is not JSON; refusing it") from None
    if not isinstance(doc, dict) or doc.get("content_hash") != meta.content_hash or doc.get("key") != meta.key \
            or doc.get("name") != meta.name:
        raise IntegrityError(f"{meta.name}: its manifest does not match the signed metadata; refusing it")
    return doc, stats
