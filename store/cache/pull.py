"""Pull: fetch a signed store path (and what it references) from binary caches into this store.

Trust: everything a cache serves is hostile until checked, and is checked in this order before any
of it is used (to name a lock, a file, a path, or to print):
1. the metadata is at most METADATA_MAX_BYTES (the read stops there) and parses to the one shape
   push writes (`_shape`);
2. a trusted key signed it (`check_signature`);
3. it is bound to what was asked: the signed key equals the key requested, the signed name is a
   store path name of that key (and the name requested, if one was), references are store path
   names, the archive is `<key>.tar.zst`, digests are hex, sizes are sane (`_bound`).
Only a `Meta` — the result of all three — reaches the code that takes locks or writes. The archive
is then read at most up to its signed size with its sha256 computed on the way and compared before
anything is unpacked; unpacking stops past the signed size (plus headers); the unpacked tree's
content hash must match before it is renamed into store/ and registered (one transaction).
References are walked iteratively (a visited set, a cap on objects, cycles refused), each asked by
the key its name carries. A compromised cache can withhold objects or serve stale ones a trusted
key once signed for the same key; it cannot make a node install bytes no trusted key signed.

`CacheSubstituter` is what `build --substituter` asks before building (the build layer's
`Substituter` interface).
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.results import Result
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import IntegrityError, NetworkError, NotFoundError, StoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.cache.backends import RetryPolicy
from llmgw_store.cache.caches import Caches, shown
from llmgw_store.cache.objects import FORMAT, shape_v2
from llmgw_store.cache.signing import METADATA_MAX_BYTES, check_signature, trusted_keys
from llmgw_store.cache.tree_fetch import BlobRef, MetaV2, Stats, build_tree, stamp_tree
from llmgw_store.core import locks, manifest, oplog
from llmgw_store.core.keys import KEY_RE, is_store_name, key_of_name
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import TRASH, leaf
from llmgw_store.core.oplog import recorded
from llmgw_store.core.pathinfo import MAX_BYTES, OfPath, StorePathInfo
from llmgw_store.core.scratch import sweep_dead, to_trash
from llmgw_store.core.temproots import TempRoots
from llmgw_store.system.signals import raising
from llmgw_store.system.trees import force_rmtree

MAX_OBJECTS = 256  # in one pull's closure
# A tar stream holds the regular files' bytes (the signed `size`) plus, per entry (the signed
# `files`, and a few the manifest adds), a header, a long name and padding; plus the manifest and
# contents listing, which `size` leaves out.
UNPACK_PER_ENTRY = 8 << 10
UNPACK_MARGIN = 1 << 20
UNPACK_EXTRA_MEMBERS = 16  # the top directory and the manifest files, which the listing leaves out
_HEX64 = re.compile(r"[0-9a-f]{64}")

# field -> type, as push writes them; `inputs` and `compression` are optional.
_FIELDS = {"name": str, "key": str, "content_hash": str, "archive": str, "archive_sha256": str,
           "archive_size": int, "size": int, "files": int, "references": list, "signatures": list}
_OPTIONAL = {"inputs": dict, "compression": str}


@dataclass(frozen=True)
class Meta(OfPath):
    """A cache object's metadata after every check: signed by `signer`, for the store path `info`
    (StorePathInfo.from_cache_fields: bound to the key asked, bounded; OfPath reads its fields)."""

    info: StorePathInfo
    archive: str
    archive_sha256: str
    archive_size: int
    signer: str


def _parse(data: bytes, label: str) -> Any:
    try:
        doc = json.loads(data)
        json.dumps(doc)  # what parses must also re-encode (for the signature) without recursing out
        return doc
    except (ValueError, RecursionError) as exc:
        raise IntegrityError(f"{label}: not valid JSON ({type(exc).__name__}); refusing it") from None


def _shape(doc: Any, label: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise IntegrityError(f"{label}: the metadata is not a JSON object; refusing it")
    for fields, required in ((_FIELDS, True), (_OPTIONAL, False)):
        for field, typ in fields.items():
            if field not in doc and not required:
                continue
            value = doc.get(field)
            if not isinstance(value, typ) or isinstance(value, bool):
                raise IntegrityError(f"{label}: metadata field {field!r} is missing or not a {typ.__name__}; "
                                     "refusing it")
    return doc


def _refusal(label: str):
    def refuse(problem: str) -> IntegrityError:
        return IntegrityError(f"{label}: {problem}; refusing it")

    return refuse


def _signed_path(doc: dict[str, Any], key: str, name: str | None, refuse) -> StorePathInfo:
    """What both formats bind (StorePathInfo.from_cache_fields): the signed key is the key asked
    for, the signed name a store path name of it (and the name asked for, if one was); the
    references, store path names; the content hash and sizes, well formed."""
    try:
        return StorePathInfo.from_cache_fields(doc, key, name)
    except ValueError as exc:
        raise refuse(str(exc)) from None


def _bound(doc: dict[str, Any], key: str, name: str | None, signer: str, label: str) -> Meta:
    """Bind signed metadata to what was asked and check every value before it is used."""
    refuse = _refusal(label)
    info = _signed_path(doc, key, name, refuse)
    if doc["archive"] != f"{key}.tar.zst":
        raise refuse(f"its archive is not {key}.tar.zst")
    if not _HEX64.fullmatch(doc["archive_sha256"]):
        raise refuse("its archive digest is not 64 hex digits")
    if doc.get("compression", "zstd") != "zstd":
        raise refuse("its archive is not zstd-compressed")
    if not 0 <= doc["archive_size"] <= MAX_BYTES:
        raise refuse(f"its sizes are not between 0 and {MAX_BYTES}")
    return Meta(info=info, archive=doc["archive"], archive_sha256=doc["archive_sha256"],
                archive_size=doc["archive_size"], signer=signer)


def _bound_v2(doc: dict[str, Any], key: str, name: str | None, signer: str, label: str) -> MetaV2:
    """`_bound` for a content-addressed (format 2) object: the same bindings, its blobs' digests."""
    refuse = _refusal(label)
    info = _signed_path(doc, key, name, refuse)
    if doc["listing"]["size"] > manifest.CONTENTS_MAX or doc["manifest"]["size"] > manifest.MANIFEST_MAX \
            or doc["plan"]["size"] > manifest.CONTENTS_MAX:
        raise refuse("its listing, plan or manifest is larger than a store path's can be")

    def ref(part: str, digest: str) -> BlobRef:
        return BlobRef(digest, doc[part]["size"], doc[part]["csize"])

    return MetaV2(info=info, listing=ref("listing", doc["content_hash"]),
                  plan=ref("plan", doc["plan"]["digest"]), manifest=ref("manifest", doc["manifest"]["digest"]),
                  signer=signer)


def fetch_meta(backend, key: str, trusted: dict[str, bytes], name: str | None = None) -> Meta | MetaV2 | None:
    """The checked metadata of `key` (and `name`, when asked by name) in `backend`; None when the
    cache does not have it; IntegrityError when it has something that fails a check. A `format`
    field says a content-addressed object (2); without one it is a monolithic archive (v1)."""
    label = f"{key}.json"
    data = backend.get(label, max_bytes=METADATA_MAX_BYTES)
    if data is None:
        return None
    doc = _parse(data, label)
    if isinstance(doc, dict) and "format" in doc:
        if doc["format"] != FORMAT or isinstance(doc["format"], bool):
            raise IntegrityError(f"{label}: its object format {str(doc['format'])[:20]!r} is not one this "
                                 f"llmgw-store reads (1 or {FORMAT}): upgrade llmgw-store on this node; refusing it")
        shape_v2(doc, label)
        return _bound_v2(doc, key, name, check_signature(doc, trusted, label), label)
    doc = _shape(doc, label)
    return _bound(doc, key, name, check_signature(doc, trusted, label), label)


def _find_meta(caches: Caches, key: str, trusted: dict[str, bytes], name: str | None) -> Meta | MetaV2:
    meta = caches.first(lambda backend: fetch_meta(backend, key, trusted, name))
    if meta is None:
        raise NotFoundError(f"no cache has {key}")
    return meta


def _target(target: str) -> tuple[str, str | None]:
    """(key, store path name or None) of what the user asked for: a key, a name or a store path."""
    if KEY_RE.match(target):
        return target, None
    name = Path(target).name
    if not is_store_name(name):
        raise UsageError(f"{target!r} is neither a store key nor a store path name")
    return name[:32], name


def _closure(caches: Caches, key: str, name: str | None, trusted: dict[str, bytes]) -> list[Meta | MetaV2]:
    """The checked object of `key` and every object it references, references before referrers.
    Iterative depth-first walk: a reference back to an object still on the walk's path is a cycle,
    which no registration can make (a path is registered after its references); refused."""
    found: dict[str, Meta | MetaV2] = {}
    order: list[str] = []
    on_path: set[str] = set()

    def visit(k: str, n: str | None):
        if len(found) >= MAX_OBJECTS:
            raise IntegrityError(f"{key}: references more than {MAX_OBJECTS} objects; refusing it")
        found[k] = _find_meta(caches, k, trusted, n)
        on_path.add(k)
        return iter(found[k].references)

    stack = [(key, visit(key, name))]
    while stack:
        k, refs = stack[-1]
        ref = next(refs, None)
        if ref is None:
            stack.pop()
            on_path.discard(k)
            order.append(k)
            continue
        ref_key = key_of_name(ref)
        assert ref_key is not None, "references are store path names (_bind_name_and_references)"
        if ref == found[k].name:
            continue
        if ref_key in on_path:
            raise IntegrityError(f"{found[k].name}: its references make a cycle through {ref}; refusing it")
        if ref_key in found:
            if found[ref_key].name != ref:
                raise IntegrityError(f"{found[k].name}: references {ref}, but {ref_key} is "
                                     f"{found[ref_key].name}; refusing it")
            continue
        stack.append((ref_key, visit(ref_key, ref)))
    return [found[k] for k in order]


def _check_store_files(tree: Path, entries: list[manifest.Entry], name: str) -> None:
    """Where the store writes or reads a file (`.llmgw/*`, `pyvenv.cfg`) an unpacked object holds a
    regular file (manifest.refused_entry), and its `.llmgw/contents` is a regular file holding the
    very listing the signed content hash covers: a link there (to /dev/zero) would be followed by
    every later reader of the path."""
    for e in entries:
        why = manifest.refused_entry(e)
        if why:
            raise IntegrityError(f"{name}: {why}; refusing it")
    try:
        same = manifest.read_contents_bytes(tree) == manifest.listing(entries)
    except ValueError as exc:
        raise IntegrityError(f"{name}: its contents listing cannot be read as a file ({exc}); refusing it") from None
    if not same:
        raise IntegrityError(f"{name}: its contents listing is not the tree's; refusing it")


def _check_relocatable(tree: Path, name: str) -> None:
    """The environment must find its interpreter here: pyvenv.cfg's home must hold a python."""
    try:
        text = manifest.read_pyvenv_cfg(tree)  # bounded, never through a link (a signed link to /dev/zero)
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{name}: its pyvenv.cfg cannot be read as a file ({exc}); refusing it") from None
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip())
            if not any((home / p).exists() for p in ("python3", "python")):
                raise UsageError(f"{name}: its interpreter {home} does not exist on this machine; install that "
                                 "Python there (or build the recipe locally)")


class _Capped:
    """A decompressed stream that yields at most `limit` bytes: past it the object is refused (a
    zstd bomb or a tree larger than signed stops here, in both passes)."""

    def __init__(self, raw, limit: int, label: str):
        self.raw, self.limit, self.label, self.count = raw, limit, label, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n is not None and n >= 0 else self.limit + 1 - self.count)
        self.count += len(data)
        if self.count > self.limit:
            raise IntegrityError(f"{self.label}: unpacks to more than {self.limit} bytes, more than its signed size "
                                 "allows; refusing it")
        return data


def _unpacked_limit(meta: Meta) -> int:
    return meta.size + UNPACK_MARGIN + UNPACK_PER_ENTRY * (meta.files + 8)


@contextmanager
def _zstd_stream(archive: Path, limit: int, label: str):
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(open(archive, "rb"), closefd=True) as zr:
            yield _Capped(zr, limit, label)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{label}: not a zstd stream ({exc}); refusing it") from None


def _unpack(archive: Path, dest: Path, meta: Meta) -> None:
    """One pass, through the store's one extractor (system/extract.py): nothing written follows a
    link, every member lies under `meta.name/`, and no more bytes or members than the signed
    metadata declares (with a small margin) are decompressed or written. Environments hold absolute
    links (bin/python -> the interpreter): as signed content they are kept, never followed."""
    from llmgw_store.system.extract import extract_tar

    limit = _unpacked_limit(meta)
    with _zstd_stream(archive, limit, meta.archive) as zr:
        extract_tar(zr, dest, policy="signed", top=meta.name, max_bytes=limit,
                    max_members=meta.files + UNPACK_EXTRA_MEMBERS, label=meta.archive)


def fetch_into_store(store: Store, caches: Caches, meta: Meta | MetaV2) -> tuple[Path, Stats]:
    """Fetch one checked object from `caches`, check it whole, and install it (Store.install: the
    rename into store/ and the registration). Caller holds the key's lock, and has found nothing
    of the key in the store (Store.recover)."""
    started = time.monotonic()
    served_before = dict(caches.served)
    sweep_stale_pulls(store.layout.tmp)  # what pulls killed by SIGKILL left (a build's substitution too)
    build_id = store.index.start_build(meta.key, meta.name)
    try:
        if isinstance(meta, MetaV2):
            stats = _fetch_v2(store, caches, meta, build_id, started)
        else:
            stats = _fetch_v1(store, caches, meta, build_id, started)
    except BaseException as exc:
        store.index.fail_build(build_id, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        raise
    seconds = time.monotonic() - started
    oplog.fetched(stats.bytes_fetched)
    say(f"substituted {meta.name} from {served_by(caches, served_before)} (signed by {meta.signer}) in "
        f"{seconds:.1f}s: fetched "
        f"{human_size(stats.bytes_fetched)} in {stats.blobs_fetched} blobs, reused {human_size(stats.bytes_reused)} "
        "from store paths here"
        + (f" ({human_size(stats.bytes_reused_stamped)} of it stamped as checked, not read)"
           if stats.bytes_reused_stamped else "")
        + (f", resumed {human_size(stats.bytes_resumed)}" if stats.bytes_resumed else ""))
    if stats.phases:
        say("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in stats.phases.items()))
    return store.layout.path_of(meta.name), stats


def served_by(caches: Caches, before: dict[str, int]) -> str:
    """The caches that served items since `before` (a copy of `caches.served`), as a message says them."""
    urls = [u for u, n in caches.served.items() if n > before.get(u, 0)]
    if not urls:
        return "the cache"
    return ("cache " if len(urls) == 1 else "caches ") + ", ".join(shown(u) for u in urls)


def _install(store: Store, tree: Path, doc: dict[str, Any], meta: Meta | MetaV2, build_id: int, started: float,
             stats: Stats) -> str:
    """Register the pulled tree from its manifest (checked: StorePathInfo.from_manifest) with the
    signed references."""
    t0 = time.monotonic()
    try:
        info = StorePathInfo.from_manifest(doc, meta.name)
    except ValueError as exc:
        raise IntegrityError(f"{meta.name}: {exc}; refusing it") from None
    how = store.install(tree, replace(info, references=meta.references), build_id=build_id,
                        seconds=round(time.monotonic() - started, 3), outcome="substituted")
    # Registered from the signed manifest, whose time is the builder's: on this node the path was
    # first used now (gc's grace and `list` read last_used).
    store.index.touch(meta.name)
    stats.phases["register"] = time.monotonic() - t0
    return how


def _fetch_v1(store: Store, caches: Caches, meta: Meta, build_id: int, started: float) -> Stats:
    """A monolithic (format 1) object: the archive downloaded (from the first cache that serves
    it with the signed sha256), unpacked through the store's one extractor, the tree's content
    hash and manifest compared with the signed ones, then installed."""
    layout = store.layout
    scratch = layout.tmp / f"pull-{os.getpid()}-{meta.key}"
    archive = layout.tmp / f"pull-{os.getpid()}-{meta.key}.tar.zst"

    def download(backend) -> str | None:
        archive.unlink(missing_ok=True)  # a dead process of the same pid, or a cache passed over, left it
        digest = backend.download(meta.archive, archive, max_bytes=meta.archive_size)
        if digest is not None and digest != meta.archive_sha256:
            raise IntegrityError(f"{meta.archive}: sha256 differs from the signed metadata; refusing it")
        return digest

    try:
        force_rmtree(scratch)
        if caches.first(download) is None:
            raise IntegrityError(f"{meta.archive}: the cache has its metadata but not the archive; refusing it")
        # From here the archive's bytes are the ones a trusted key signed.
        scratch.mkdir(parents=True)
        _unpack(archive, scratch, meta)
        tree = scratch / meta.name
        entries = manifest.scan(tree)
        if manifest.content_hash(entries) != meta.content_hash:
            raise IntegrityError(f"{meta.name}: the unpacked tree's content hash differs from the signed metadata; "
                                 "refusing it")
        _check_store_files(tree, entries, meta.name)
        doc = manifest.read(tree)
        if doc.get("content_hash") != meta.content_hash or doc.get("key") != meta.key:
            raise IntegrityError(f"{meta.name}: its manifest does not match the signed metadata; refusing it")
        _check_relocatable(tree, meta.name)
        stats = Stats(bytes_fetched=meta.archive_size, blobs_fetched=1, files=meta.files)
        _install(store, tree, doc, meta, build_id, started, stats)
        return stats
    finally:
        force_rmtree(scratch)
        archive.unlink(missing_ok=True)


def resume_dir(tmp: Path, key: str) -> Path:
    """Where a format-2 pull of `key` that failed on the network leaves the files it fetched and
    checked, for the next pull of the key (taken under the key's lock; swept after RESUME_KEEP_S)."""
    return tmp / f"resume-{key}"


def _fetch_v2(store: Store, caches: Caches, meta: MetaV2, build_id: int, started: float) -> Stats:
    """A content-addressed (format 2) object, through cache/tree_fetch.py, then installed."""
    layout = store.layout
    scratch = layout.tmp / f"pull-{os.getpid()}-{meta.key}"
    keep = resume_dir(layout.tmp, meta.key)
    try:
        to_trash(scratch, layout.trash)  # a dead process of the same pid left it; we hold the key's lock
        scratch.mkdir(mode=0o700, parents=True)
        resumed = None
        if os.path.isdir(keep) and not os.path.islink(keep):
            # Ours alone from here (the key's lock): out of the sweep's reach, into this pull's scratch.
            resumed = scratch / "resumed"
            os.rename(keep, resumed)
        tree = scratch / meta.name
        tree.mkdir(mode=0o755)
        debug.pause("PULL_PAUSE")
        try:
            doc, stats = build_tree(caches, meta, store, tree, resumed)
        except (NetworkError, KeyboardInterrupt):
            # Every cache failed on the network, or the pull was stopped (^C, SIGTERM: build_tree
            # has let its workers finish the blob each was writing): keep what was fetched (each
            # file is hashed again before the next pull of the key takes it; one cut short does
            # not hash right and is fetched).
            to_trash(keep, layout.trash)
            os.rename(tree, keep)
            say(f"kept what was fetched of {meta.name} in {keep}: the next pull of it resumes from there")
            raise
        _check_relocatable(tree, meta.name)
        if _install(store, tree, doc, meta, build_id, started, stats) == "installed":
            stamp_tree(store, layout.path_of(meta.name), stats)  # every file of it was checked by this pull
        return stats
    finally:
        # What a resumed pull did not take, or a failed pull's files: out of the way at once; the
        # next gc deletes them (a large tree takes seconds, which no pull should wait for).
        to_trash(scratch, layout.trash)


@dataclass(frozen=True)
class PullResult(Result):
    pulled: tuple[str, ...]
    already_present: tuple[str, ...]
    path: str  # the local store path of what was asked for
    bytes_fetched: int = 0  # compressed bytes downloaded (v2 objects; a v1 object counts its archive)
    bytes_reused: int = 0  # file bytes copied from store paths already on this node
    files: int = 0
    seconds: float = 0.0
    phases: dict[str, float] | None = None
    bytes_resumed: int = 0  # file bytes a pull of the same key that failed had fetched and checked
    bytes_reused_stamped: int = 0  # of bytes_reused, linked without reading them again (core/stamps.py)


def _local_path(store: Store, key: str) -> Path | None:
    """The registered path of `key` in this store (its local name), if it is there."""
    row = store.index.path_by_key(key)
    path = store.layout.path_of(row.name) if row else None
    return path if path is not None and path.is_dir() else None


SCRATCH_RE = re.compile(r"pull-([0-9]{1,7})-[0-9a-z]{32}(?:\.tar\.zst)?")  # Linux pids are at most 2^22
MAX_STALE_SCAN = 100_000


RESUME_RE = re.compile(r"resume-[0-9a-z]{32}")
RESUME_KEEP_S = 24 * 3600


def sweep_stale_pulls(tmp: Path) -> None:
    """Clear what pulls left in ROOT/var/tmp into ROOT/var/trash (core/scratch.to_trash: a rename;
    the next gc deletes it): `pull-<pid>-<key>[.tar.zst]` of a pid that no longer runs (killed by
    SIGKILL) — whose partial tree first becomes `resume-<key>`, when there is none, so the next
    pull of the key takes the files it checked — and `resume-<key>` trees no pull of their key
    took within RESUME_KEEP_S. (A pull takes a resume tree under its key's lock by renaming it
    away first; a sweep that loses that race removes nothing of it, or a few files the pull then
    fetches.)"""
    trash = tmp.parent / leaf(TRASH)  # Layout.trash
    _salvage_dead(tmp)
    sweep_dead(tmp, SCRATCH_RE, MAX_STALE_SCAN, "a pull", trash)
    try:
        with os.scandir(tmp) as it:
            cutoff = time.time() - RESUME_KEEP_S
            old = [e.name for _, e in zip(range(MAX_STALE_SCAN), it, strict=False)
                   if RESUME_RE.fullmatch(e.name) and e.stat(follow_symlinks=False).st_mtime < cutoff]
    except FileNotFoundError:
        return
    for name in old:
        try:
            to_trash(tmp / name, trash)
        except OSError:
            pass


def _salvage_dead(tmp: Path) -> None:
    """`pull-<pid>-<key>/<name>` of a dead pid (a format-2 pull's partial tree, the files it wrote
    checked or cut short) becomes `resume-<key>` when there is none. Its files are hashed again
    before any is taken (tree_fetch._take_resumed), so what the kill cut short is fetched."""
    from llmgw_store.core.locks import pid_alive

    try:
        with os.scandir(tmp) as it:
            dead = [(m, e.name) for _, e in zip(range(MAX_STALE_SCAN), it, strict=False)
                    if (m := SCRATCH_RE.fullmatch(e.name)) and not e.name.endswith(".tar.zst")
                    and int(m.group(1)) != os.getpid() and e.is_dir(follow_symlinks=False)]
        for m, name in dead:
            if pid_alive(int(m.group(1))):
                continue
            key = name.rsplit("-", 1)[1]
            keep = resume_dir(tmp, key)
            if os.path.lexists(keep):
                continue
            with os.scandir(tmp / name) as it:
                trees = [e.name for e in it if is_store_name(e.name) and key_of_name(e.name) == key
                         and e.is_dir(follow_symlinks=False)]
            if len(trees) == 1:
                os.rename(tmp / name / trees[0], keep)
    except OSError:
        return  # what is left is trashed whole by the sweep


@recorded("pull")
def pull(target: str, from_: list[str], trusted: list[str], *, root: str | Path | None = None,
         lock_timeout: float = locks.BUILD_LOCK_TIMEOUT_S, policy: RetryPolicy | None = None) -> PullResult:
    """Pull `target` (a key, a store path name or path) and its references from the caches
    `from_`, asked in order for each object and each blob (cache/caches.py); `policy`: retries,
    stalls and deadlines (default: from the environment)."""
    started = time.monotonic()
    caches = Caches(from_, policy)
    caches.check()
    keys = trusted_keys(trusted)
    key, name = _target(target)
    # Every object of the closure is checked before the store is touched.
    objects = _closure(caches, key, name, keys)
    pulled, present = [], []
    total = Stats()
    with Store.open(root, lock_timeout, create=True) as store, raising():  # SIGTERM as ^C: scratch removed, exit 143
        sweep_stale_pulls(store.layout.tmp)
        for meta in objects:
            local = _local_path(store, meta.key)
            if local is None:
                TempRoots(store.layout).add(meta.name, lock_timeout)
                # The key's lock: from here only this process creates, clears or registers its path.
                with locks.hold(store.layout.locks, meta.key, f"pulling {meta.name}", lock_timeout):
                    local = _local_path(store, meta.key)
                    if local is None and not store.recover(meta.name):
                        _, stats = fetch_into_store(store, caches, meta)
                        total.bytes_fetched += stats.bytes_fetched
                        total.bytes_reused += stats.bytes_reused
                        total.bytes_resumed += stats.bytes_resumed
                        total.bytes_reused_stamped += stats.bytes_reused_stamped
                        total.files += stats.files
                        for k, v in stats.phases.items():
                            total.phases[k] = total.phases.get(k, 0.0) + round(v, 3)
                        pulled.append(meta.name)
                        continue
                    local = _local_path(store, meta.key)
            assert local is not None, "registered under its key's lock, and a temp root keeps gc from it"
            present.append(local.name)
        return PullResult(tuple(pulled), tuple(present), str(_local_path(store, key)), total.bytes_fetched,
                          total.bytes_reused, total.files, round(time.monotonic() - started, 3), total.phases,
                          total.bytes_resumed, total.bytes_reused_stamped)


class CacheSubstituter:
    """The build layer's `Substituter`: asks the binary caches for the key before a build, each
    object and blob from every cache in order (cache/caches.py). A cache that is down, lacks the
    key or serves something that fails a check is passed over (one line on stderr); when no cache
    serves it, the build layer decides what happens (`substitution`), and under --substitute-only
    raises `refusal(...)`: the cause, typed (cache/misses.py)."""

    def __init__(self, urls: list[str] | tuple[str, ...], trusted: list[str] | tuple[str, ...],
                 policy: RetryPolicy | None = None):
        self.urls, self.keys = tuple(urls), trusted_keys(trusted)
        self.caches = Caches(self.urls, policy)
        self.failure: StoreError | None = None  # what stopped the last substitute() outside a cache's passing over
        self.bytes_fetched = 0  # by every substitution of this command (the metrics' bytes fetched)

    def substitute(self, store: Store, key: str, name: str) -> bool:
        """True once `name` is in the store from a cache (caller holds the key's lock); False when
        no cache served it (what that means — build, or fail under --substitute-only — is
        build/builder.py's `substitution`)."""
        self.failure = None
        try:
            meta = self.caches.first(lambda backend: fetch_meta(backend, key, self.keys, name))
            if meta is not None:
                _, stats = fetch_into_store(store, self.caches, meta)
                self.bytes_fetched += stats.bytes_fetched
                return True
        except StoreError as exc:
            self.failure = exc
            where = getattr(exc, "cache", None) or " ".join(shown(u) for u in self.urls)
            say(f"cache {where}: {exc}; passing it over")
        return False

    def refusal(self, key: str, name: str, inputs: dict[str, Any] | None = None) -> StoreError:
        """Why `key` came from no cache, as the error a --substitute-only command ends with: a
        failure of this node itself (its disk, its interpreter) as it is, else the caches' cause."""
        from llmgw_store.cache import misses

        if self.failure is not None and not isinstance(self.failure, (NetworkError, IntegrityError)):
            return self.failure
        return misses.refusal(self.caches, self.keys, key, name, inputs, self.failure)

    def reached(self) -> float:
        """When a cache last answered this command (seconds since the epoch; 0: none did)."""
        return self.caches.reached
