"""Push: store paths (and what they reference) into a binary cache, signed.

Format 2 (the default; cache/objects.py): `<key>.json` signed metadata and `blobs/<digest>`, one
zstd frame per large file or per pack of a package's small files, shared with every other object
holding the same bytes: a blob the cache has already is not uploaded again. Format 1 (`format=1`):

    <key>.json       metadata: name, key inputs, content hash, sizes, compression, references,
                     the archive's sha256, and ed25519 signatures over all of that
    <key>.tar.zst    the store path as a tar stream, zstd-compressed

The metadata is written last: an object without it does not exist for pullers.

Racing a cache gc (cache/cache_gc.py) loses nothing. Push (1) writes `pending/<key>-<nonce>.json`
naming every blob it will reference, (2) waits while any unexpired `gc/<nonce>.json` marker
exists, (3) uploads the blobs the cache lacks or holds at another size, (4) writes the metadata,
(5) removes its marker. A push of an object the cache holds runs the same steps (`_push_v2`). A
gc writes its marker before it reads anything and removes it after its last delete. So either
push's step 2 ran before the gc's marker existed — then its pending marker existed before the gc
read the pending markers, and the gc keeps its blobs — or it waits until that gc has deleted all it
will, and then sees what is really there. Small blobs it writes again unconditionally (their new
mtime is inside any grace period), and once the metadata is written the object is younger than
the grace, which gc keeps with its blobs.
"""

from __future__ import annotations

import json
import os
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.results import Result
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import IntegrityError, LockTimeout, NetworkError, NotFoundError, UsageError
from llmgw_store.base.report import say
from llmgw_store.cache import signing
from llmgw_store.cache.backends import RetryPolicy, backend_for
from llmgw_store.cache.signing import METADATA_MAX_BYTES, load_secret, sign
from llmgw_store.core import locks
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.keys import canonical_json
from llmgw_store.core.local_store import Store
from llmgw_store.core.names import check_signing_key_name
from llmgw_store.core.pathinfo import StorePathInfo
from llmgw_store.core.temproots import TempRoots
from llmgw_store.system.trees import sha256_of

ZSTD_LEVEL = 3
THREADS = 8
BIG_IN_MEMORY = 16 << 20  # files up to this size are compressed in memory, larger ones into a temp file
GC_WAIT_POLL = 0.5


def _archive(tree: Path, name: str, out: Path) -> None:
    import zstandard

    with open(out, "wb") as raw:
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
        with cctx.stream_writer(raw) as zw, tarfile.open(fileobj=zw, mode="w|", format=tarfile.GNU_FORMAT) as tf:
            tf.add(tree, arcname=name)


@dataclass(frozen=True)
class PushResult(Result):
    pushed: tuple[str, ...]
    already_there: tuple[str, ...]
    to: str
    bytes_uploaded: int = 0  # compressed bytes written to the cache
    bytes_shared: int = 0  # compressed bytes of blobs the cache had already
    blobs_uploaded: int = 0
    seconds: float = 0.0
    repaired: tuple[str, ...] = ()  # held by the cache, but not as this push writes it: mended (docs/fleet.md)


def _read_verified(path: Path, digest: str, size: int) -> bytes:
    """The bytes of a store file (never through a link), checked against its listing's digest."""
    from llmgw_store.core.manifest import hasher

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        data = f.read(size + 1)
    h = hasher(size)  # the store's one threshold (core/manifest.py)
    h.update(data)
    if len(data) != size or h.hexdigest() != digest:
        raise IntegrityError(f"{path}: differs from its store path's contents listing; run `llmgw-store verify "
                             "--repair` before pushing it")
    return data


def _compress_file(path: Path, digest: str, size: int, tmp: Path) -> Path | bytes:
    """A large file as a zstd frame: in memory up to BIG_IN_MEMORY, else streamed into `tmp`
    (multithreaded zstd), hashed on the way and checked against its digest."""
    import zstandard

    from llmgw_store.core.manifest import hasher

    if size <= BIG_IN_MEMORY:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(_read_verified(path, digest, size))
    h, count = hasher(size), 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
    with os.fdopen(fd, "rb") as f, open(tmp, "wb") as raw, cctx.stream_writer(raw, size=size, closefd=False) as zw:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            count += len(chunk)
            zw.write(chunk)
    if count != size or h.hexdigest() != digest:
        raise IntegrityError(f"{path}: differs from its store path's contents listing; run `llmgw-store verify "
                             "--repair` before pushing it")
    return tmp


def _wait_for_gc(backend, lock_timeout: float) -> None:
    """Step 2 of the protocol above: until no unexpired gc marker is in the cache."""
    deadline = time.monotonic() + lock_timeout
    while True:
        running = []
        for item in (i for i in backend.list("gc") if i.regular):
            data = backend.get(item.name, max_bytes=4096)
            try:
                expires = float(json.loads(data)["expires"]) if data else 0.0
            except (ValueError, KeyError, TypeError):
                expires = item.mtime + 3600
            # A gc renews its marker (rewrites it) at least every few minutes: a marker unwritten
            # for an hour is a dead or planted one, whatever expiry it claims.
            expires = min(expires, item.mtime + 3600 + 60)
            if expires > time.time():
                running.append(item.name)
        if not running:
            return
        if time.monotonic() > deadline:
            raise LockTimeout(f"a cache gc is running (its marker {backend.where(running[0])}); waited "
                              f"{lock_timeout:g}s (--lock-timeout): push again once it is done")
        say(f"waiting for the cache gc ({running[0]}) to finish")
        debug.pause("PUSH_WAITS_FOR_GC")  # tests: the push has seen the gc's marker and waits
        time.sleep(GC_WAIT_POLL)


def _own_plan(backend, current: bytes | None, blobs, entries, document, label: str, key_name: str) -> dict[str, int]:
    """The compressed size of each blob as this store's own earlier push recorded it: the plan of
    the cache's metadata `current`, trusted only when `current` signs byte for byte what this push
    would sign with that plan's sizes, with this key's very signature among its signatures
    (ed25519 signatures are deterministic, so only a push with this key, of this path, wrote it).
    Empty when it is not (absent, garbage, another key's alone, another plan): the caller then
    learns each present blob's size by compressing it."""
    from llmgw_store.cache.objects import Blob, parse_plan, plan_bytes
    from llmgw_store.cache.tree_fetch import BlobRef, fetch_small

    if not current:
        return {}
    bound = len(plan_bytes([Blob(b.digest, b.members, b.size, 1 << 42) for b in blobs]))
    try:
        ref = json.loads(current)["plan"]
        size, csize = ref["size"], ref["csize"]
        if not (isinstance(size, int) and isinstance(csize, int) and 0 < size <= bound and 0 < csize <= bound + 4096):
            return {}
        theirs = parse_plan(fetch_small(backend, BlobRef(ref["digest"], size, csize), label), entries, label)
    except (IntegrityError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    if {(b.digest, b.members) for b in theirs} != {(b.digest, b.members) for b in blobs}:
        return {}
    if not signing.signs_same(document(sorted(theirs, key=lambda b: b.digest))[0], current, key_name):
        return {}
    return {b.digest: b.csize for b in theirs}


def _push_v2(store: Store, backend, row: RegisteredPath, secret_key, lock_timeout: float, current: bytes | None,
             rewrite_blobs: bool = False, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """Upload one registered store path as a format-2 object, or repair or renew the one the cache
    holds (`current`: its metadata as read, b"" when unreadable); what it cost and found.

    Every blob is looked at after the gc wait: one missing is uploaded; one present whose size is
    not the size this push uploads (its own earlier plan's, else learnt by compressing it) is
    replaced unless it inflates to exactly its bytes; with `rewrite_blobs` every blob is uploaded.
    The small blobs and the metadata are always written (again): that renews the object."""
    import secrets
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    from llmgw_store.cache.objects import FORMAT, Blob, blob_name, digest_of, make_plan, plan_bytes
    from llmgw_store.cache.tree_fetch import Progress
    from llmgw_store.core import manifest

    name, key = row.name, row.key
    tree = store.layout.path_of(name)
    try:  # bounded, never through a link
        listing = manifest.read_contents_bytes(tree)
        manifest_bytes = manifest.read_manifest_bytes(tree)
    except ValueError as exc:
        raise IntegrityError(f"{name}: {exc}; run `llmgw-store verify --repair` before pushing it") from None
    if digest_of(listing) != row.content_hash:
        raise IntegrityError(f"{name}: its contents listing does not hash to its content hash; run "
                             "`llmgw-store verify --repair` before pushing it")
    entries = manifest.parse_contents(listing)  # the very bytes just hashed
    blobs = make_plan(entries)
    by_digest: dict[str, manifest.Entry] = {}
    for e in entries:
        if e.kind in "fx":
            by_digest.setdefault(e.digest, e)
    info = StorePathInfo.from_row(row, store.index.references(name))
    zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)

    def document(done: list[Blob]) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The metadata this push writes for blobs of these sizes, and its small blobs (deterministic)."""
        smalls: list[tuple[str, bytes]] = []
        refs: list[dict[str, Any]] = []  # the metadata's {digest, size, csize} of each small blob
        for data in (listing, plan_bytes(done), manifest_bytes):
            packed = zc.compress(data)
            smalls.append((digest_of(data), packed))
            refs.append({"digest": digest_of(data), "size": len(data), "csize": len(packed)})
        listing_ref, plan_ref, manifest_ref = refs
        meta = {
            "format": FORMAT, **info.cache_fields(),
            "listing": {"size": listing_ref["size"], "csize": listing_ref["csize"]},
            "plan": plan_ref, "manifest": manifest_ref,
            "blobs_csize": sum(b.csize for b in done) + sum(r["csize"] for r in refs),
        }
        sign(meta, secret_key)
        signing.carry_signatures(meta, current, f"{key}.json", drop)  # a rotation: the other keys' signatures stay
        return canonical_json(meta), smalls

    own = {} if rewrite_blobs else _own_plan(backend, current, blobs, entries, document, f"{key}.json",
                                             secret_key.name)
    marker = f"pending/{key}-{os.getpid()}-{secrets.token_hex(4)}.json"
    backend.put(marker, canonical_json({"key": key, "name": name, "time": time.time(),
                                        "blobs": [b.digest for b in blobs]}))
    cost: dict[str, Any] = {"uploaded": 0, "shared": 0, "blobs": 0, "missing": 0, "wrong_size": 0}
    lock = threading.Lock()
    progress = Progress(name, sum(b.size for b in blobs), len(entries), verb="pushing")
    try:
        _wait_for_gc(backend, lock_timeout)
        debug.pause("PUSH_BLOBS_PAUSE")

        def upload(blob: Blob) -> Blob:
            there = None if rewrite_blobs else backend.size(blob_name(blob.digest))
            if there is not None and own.get(blob.digest) == there:  # as this key's last push left it
                with lock:
                    cost["shared"] += there
                progress.add(blob.size, len(blob.members))
                return Blob(blob.digest, blob.members, blob.size, there)
            tmp = store.layout.tmp / f"push-{os.getpid()}-{threading.get_ident()}-{blob.digest[:16]}.zst"
            data: bytes | Path
            try:
                if blob.is_pack:
                    parts = [_read_verified(tree / by_digest[m].path, m, by_digest[m].size) for m in blob.members]
                    data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(b"".join(parts))
                else:
                    e = by_digest[blob.digest]
                    data = _compress_file(tree / e.path, e.digest, e.size, tmp)
                csize = len(data) if isinstance(data, bytes) else data.stat().st_size
                if there is not None and (there == csize or (blob.digest not in own and _sound_blob(
                        backend, blob, there, by_digest, f"{key}.json"))):
                    with lock:
                        cost["shared"] += there
                    progress.add(blob.size, len(blob.members))
                    return Blob(blob.digest, blob.members, blob.size, there)
                backend.put(blob_name(blob.digest), data)
            finally:
                tmp.unlink(missing_ok=True)
            with lock:
                cost["uploaded"] += csize
                cost["blobs"] += 1
                if not rewrite_blobs:
                    cost["missing" if there is None else "wrong_size"] += 1
            progress.add(blob.size, len(blob.members))
            return Blob(blob.digest, blob.members, blob.size, csize)

        with ThreadPoolExecutor(THREADS) as pool:
            done = list(pool.map(upload, sorted(blobs, key=lambda b: -b.size)))
        done.sort(key=lambda b: b.digest)
        meta_bytes, smalls = document(done)
        for d, packed in smalls:
            backend.put(blob_name(d), packed)  # always written again: see the module docstring
            cost["uploaded"] += len(packed)
        backend.put(f"{key}.json", meta_bytes)  # last: the object now exists (renewed, if it did)
        cost["metadata_rewritten"] = current is not None and meta_bytes != current
        cost["signatures"] = signing.signature_change(current, meta_bytes)
    finally:
        backend.delete(marker)
    return cost


def _sound_blob(backend, blob, there: int, by_digest, label: str) -> bool:
    """Whether the cache's blob of another size than this push's (`there`) holds exactly the
    bytes it is named for, inflated and hashed: a frame another zstd version wrote, which objects
    signed with its size need kept as it is. Only such a blob is kept; anything else is replaced."""
    from blake3 import blake3

    from llmgw_store.cache.tree_fetch import BlobRef, inflate

    if there > blob.size + (blob.size >> 7) + (1 << 17):  # past zstd's compress bound: no frame of it
        return False
    h, buf = blake3(max_threads=blake3.AUTO), bytearray()  # a pack (at most PACK_MAX) in memory, a file streamed
    try:
        if inflate(backend, BlobRef(blob.digest, blob.size, there), buf.extend if blob.is_pack else h.update,
                    label) is None:
            return False
    except (IntegrityError, NetworkError):
        return False
    if not blob.is_pack:
        return h.hexdigest() == blob.digest
    offset = 0
    for m in blob.members:
        size = by_digest[m].size
        if blake3(bytes(buf[offset:offset + size])).hexdigest() != m:
            return False
        offset += size
    return offset == len(buf)


def _repairs(cost: dict[str, Any]) -> str:
    """What a push of an object the cache held mended, in words ("" when nothing)."""
    words = []
    if cost.get("signatures"):
        words.append(cost["signatures"])  # the same signed bytes: only the signatures changed
    elif cost.get("metadata_rewritten"):
        words.append("metadata rewritten (it was not what this push signs)")
    for k, what in (("missing", "missing"), ("wrong_size", "of the wrong size")):
        if cost.get(k):
            words.append(f"{cost[k]} blob{'s' if cost[k] != 1 else ''} {what} uploaded again")
    return ", ".join(words)


def _read_current(backend, key: str) -> bytes | None:
    """The cache's metadata for `key` (bounded), b"" when it holds something unreadable there
    (oversized, not a regular file): either way not what a push writes, so rewritten."""
    try:
        return backend.get(f"{key}.json", max_bytes=METADATA_MAX_BYTES)
    except IntegrityError:
        return b""


def _push_v1(store: Store, backend, row: RegisteredPath, secret_key, lock_timeout: float, current: bytes | None,
             rewrite_blobs: bool = False, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """Format 1: the archive and its metadata, under the same pending/gc protocol as format 2. An
    object the cache holds is renewed when its metadata is what this push signs and its archive has
    the signed size; else both are written again."""
    import secrets

    name, key = row.name, row.key
    tmp = store.layout.tmp / f"push-{os.getpid()}-{key}.tar.zst"
    marker = f"pending/{key}-{os.getpid()}-{secrets.token_hex(4)}.json"
    cost: dict[str, Any] = {"uploaded": 0, "shared": 0, "blobs": 0, "missing": 0, "wrong_size": 0}
    try:
        _archive(store.layout.path_of(name), name, tmp)
        meta = {
            **StorePathInfo.from_row(row, store.index.references(name)).cache_fields(),
            "compression": "zstd", "archive": f"{key}.tar.zst", "archive_sha256": sha256_of(tmp),
            "archive_size": tmp.stat().st_size,
        }
        sign(meta, secret_key)
        signing.carry_signatures(meta, current, f"{key}.json", drop)  # a rotation: the other keys' signatures stay
        meta_bytes = canonical_json(meta)
        backend.put(marker, canonical_json({"key": key, "name": name, "time": time.time(), "blobs": []}))
        _wait_for_gc(backend, lock_timeout)
        there = None if rewrite_blobs else backend.size(meta["archive"])
        if there == meta["archive_size"] and current == meta_bytes:
            cost["shared"] = there
        else:
            backend.put(meta["archive"], tmp)
            cost["uploaded"] = meta["archive_size"]
            if current is not None and not rewrite_blobs and there != meta["archive_size"]:
                cost["missing" if there is None else "wrong_size"] += 1
        backend.put(f"{key}.json", meta_bytes)  # last: the object now exists (renewed, if it did)
        cost["metadata_rewritten"] = current is not None and meta_bytes != current
        cost["signatures"] = signing.signature_change(current, meta_bytes)
    finally:
        tmp.unlink(missing_ok=True)
        backend.delete(marker)
    return cost


def push(names: list[str], to: str, secret_key: str, *, root: str | Path | None = None,
         lock_timeout: float = locks.LOCK_TIMEOUT_S, format: int = 2, policy: RetryPolicy | None = None,
         rewrite_blobs: bool = False, drop_signatures: tuple[str, ...] = ()) -> PushResult:
    """Push the registered store paths `names` and their references (recorded at registration),
    references first. An object the cache holds already is renewed when it is exactly what this push
    would write and has every blob at its size, and repaired otherwise (missing or resized blobs
    uploaded, the metadata written anew with this key: `repaired`). (`llmgw_store.api.push` turns
    PROFILE, PROFILE@N, keys and paths into names.) `rewrite_blobs`: upload every blob again, for a
    blob of the right size and the wrong bytes. `policy`: retries, stalls and deadlines. Signatures
    of other keys over the same bytes stay (a key rotation, signing.carry_signatures), except those
    of the keys in `drop_signatures` (its end)."""
    if format not in (1, 2):
        raise UsageError(f"object format {format}: this llmgw-store writes 1 (one archive) or 2 (shared blobs)")
    # Read and checked first: a public key, a missing file or a key of the wrong shape is exit 2
    # even when every object is in the cache already (and nothing would be signed).
    for dropped in drop_signatures:  # names a signer could have written, nothing else (exit 2)
        try:
            check_signing_key_name(dropped)
        except UsageError as exc:
            raise UsageError(f"--drop-signature: {exc}") from None
    secret = load_secret(secret_key)
    if secret.name in drop_signatures:
        raise UsageError(f"--drop-signature {secret.name}: that is the key this push signs with; sign with the new "
                         "key and drop the old one")
    backend = backend_for(to, policy)
    pushed, skipped, repaired = [], [], []
    total = {"uploaded": 0, "shared": 0, "blobs": 0}
    t_start = time.monotonic()
    with Store.open(root, lock_timeout) as store:
        for name in store.index.closure(names):
            # A temp root of this process from here on: a gc running meanwhile cannot take the path
            # while it is archived (it is checked again below, now that gc cannot).
            TempRoots(store.layout).add(name, lock_timeout)
            debug.pause("PUSH_PAUSE")
            row = store.index.path_by_name(name)
            if row is None:
                raise NotFoundError(f"{name} is not a registered store path in {store.layout.store}")
            current = _read_current(backend, row.key)
            started = time.monotonic()
            cost = (_push_v2 if format == 2 else _push_v1)(store, backend, row, secret, lock_timeout, current,
                                                           rewrite_blobs, tuple(drop_signatures))
            for k in total:
                total[k] += cost[k]
            took = f"in {time.monotonic() - started:.1f}s"
            mended = _repairs(cost) or ("every blob uploaded again (--rewrite-blobs)" if rewrite_blobs else "")
            if current is None:
                say(f"pushed {name}: {human_size(cost['uploaded'])} uploaded in {cost['blobs']} blobs, "
                    f"{human_size(cost['shared'])} the cache had already, {took}")
                pushed.append(name)
            elif mended:
                say(f"{name}: the cache held it damaged or signed otherwise; repaired it: {mended} {took}")
                repaired.append(name)
            else:
                say(f"{name}: the cache has it already; renewed it (cache gc counts its grace from now)")
                skipped.append(name)
    return PushResult(tuple(pushed), tuple(skipped), to, total["uploaded"], total["shared"], total["blobs"],
                      round(time.monotonic() - t_start, 3), tuple(repaired))
