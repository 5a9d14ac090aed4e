"""Garbage collection of a binary cache by the roots its nodes publish.

Each node publishes `roots/<node>.json` (`push_roots`): its name, the time, a sequence number
that only grows, and the keys of every store path its roots hold (profiles' generations, pins,
paths in use, closures included), signed with the node's key. `gc` keeps every object a trusted
roots document names (and what those reference, by their metadata), every object younger than the
grace period (a push of an object already there renews it), and every blob such an object's plan
holds; it deletes the other objects, then the blobs no kept object holds that are older than the
grace period. Deleting an object's metadata comes before deleting its blobs, so a
pull never finds metadata whose blobs were deleted by design.

No roots document at all stops the gc too (unless `allow_no_roots`): with none, everything older
than the grace would be deleted, which is far more often a wrong URL than the intent.

A roots document that is not signed by the `--keep-from` key named after its node, is malformed,
or is bound to another node name than its object name, stops the gc before anything is deleted: a
gc that ignored a node's roots would delete what that node runs. So does one that is a link or not
a regular file, one that cannot be read, and a genuinely signed but older one — replayed, or
restored from a backup — which names what the node ran then, not now: one whose sequence number is
lower than the newest this gc host has seen of that node in that cache (its high-water mark, kind
"roots", in cache/seen.py's record: a file of the host's own var/, never of the cache, which
whoever restores or replays documents can write too), or that has the newest number on another
document, and one signed longer ago than the grace while an object it does not hold was pushed after it
(the replay a host that never saw the newer document cannot tell by number; an honest node
publishes more often than the grace). So does the absence of the document of a node this host has
seen, while its key is still given. A live object whose plan cannot be read stops it too.

Releases: the object each release pointer (`releases/<name>.json`, cache/releases.py) names is
kept, and so are the keys of its history (at most releases.HISTORY_MAX), so that a fleet-wide
rollback by `release set` to an earlier key still finds its object — whatever the roots documents
say. A pointer is trusted when a key gc is given signed it: the builders' keys (`release_keys`,
`--trusted-key`, as nodes check the pointers they follow) or a `--keep-from` key (a builder
publishing its own roots is given there); a pointer only ever adds to what is kept, and one none
of them signed, a malformed one, a link, or one older than the newest this host has seen of that
release in that cache (kind "release" in the same record as `activate --release` keeps) stops the
gc, nothing deleted: a gc that ignored a pointer would delete what the fleet is told to run.

Racing a push loses nothing (the protocol is in cache/push.py): gc writes `gc/<nonce>.json` (with
an expiry) before it lists anything and removes it after its last delete; a push's
`pending/<key>-<nonce>.json` names the blobs it will reference and is honoured for PENDING_STALE.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.app import debug
from llmgw_store.app.results import Result
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import IntegrityError, StoreError, UsageError
from llmgw_store.base.report import say
from llmgw_store.cache import releases, seen
from llmgw_store.cache.backends import RetryPolicy, backend_for
from llmgw_store.cache.objects import HEX64
from llmgw_store.cache.seen import Mark, Seen
from llmgw_store.cache.signing import METADATA_MAX_BYTES, check_signature, load_secret, sign, signed_part, trusted_keys
from llmgw_store.cache.tree_fetch import BlobRef, fetch_small
from llmgw_store.core.keys import KEY_RE, canonical_json, key_of_name
from llmgw_store.core.names import inline_key

NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
PROFILE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")  # core/names.check_profile's rule, as a roots document names them
ROOTS_FORMAT = "llmgw-roots-2"  # 1 had no sequence number: refused, the node publishes again
ROOTS_KIND = "roots"  # the kind of document in cache/seen.py (the name: the node)
MAX_RELEASES = 10_000  # pointers gc checks in one cache; more stops it
MAX_ROOT_KEYS = 100_000
GC_MAX_SECONDS = 3600  # a gc marker expires after this: a killed gc does not block pushes forever
GC_RENEW_MARGIN = 300  # gc stops deleting when its marker expires sooner than this: a push may then go ahead
GC_RENEW_BATCH = 256  # deletes between two renewals of the marker (and at most GC_RENEW_MARGIN / 5 seconds)
PENDING_STALE = 24 * 3600  # a pending marker older than this is a push that died
PENDING_MAX_BYTES = 64 << 20
_OBJECT = re.compile(r"([0-9a-z]{32})\.(json|tar\.zst)")


def check_node(name: str) -> str:
    if not isinstance(name, str) or not NODE_RE.fullmatch(name):
        raise UsageError(f"{str(name)[:80]!r} is not a node name: letters, digits, '.', '_', '-', at most 63")
    return name


@dataclass(frozen=True)
class PushRootsResult(Result):
    node: str
    keys: tuple[str, ...]
    to: str
    object: str
    seq: int = 0
    cold: tuple[str, ...] = ()  # keys held only by the records of cold generations (their way back)


def next_sequence(counter: Path | None) -> int:
    """A roots document's sequence number: microseconds since the epoch, and more than the last one
    this store published (kept in `counter`, a file of the store's private var/), so that a clock
    set back still gives a number the cache gc takes as newer."""
    now = time.time_ns() // 1000
    if counter is None:
        return now
    try:
        last = int(counter.read_text()[:32].strip() or 0)
    except (OSError, ValueError):
        last = 0
    seq = max(now, last + 1)
    tmp = counter.with_name(f".{counter.name}.{os.getpid()}")
    tmp.write_text(f"{seq}\n")
    os.replace(tmp, counter)  # one directory: the counter is the old number or the new, never half
    return seq


def push_roots(keys: list[str], to: str, secret_key: str, node: str | None = None, *, counter: Path | None = None,
               policy: RetryPolicy | None = None, cold: tuple[str, ...] = (),
               profiles: dict[str, str] | None = None, releases: dict[str, str] | None = None,
               held: tuple[str, ...] = ()) -> PushRootsResult:
    """Publish the signed roots document of `node` holding `keys`. One key per node, named after
    it: the node is the secret key's name (gc refuses a document whose signer is named otherwise,
    so one node's key cannot publish another node's roots). `counter`: where this store keeps its
    last sequence number (next_sequence)."""
    secret = load_secret(secret_key)  # a public key, a missing file or a wrong shape: exit 2 here
    key_name = secret.name
    if node is not None and node != key_name:
        raise UsageError(f"--node {node[:64]!r} differs from the secret key's name {key_name[:64]!r}: a node "
                         "publishes its roots with its own key, named after it (keygen NODE)")
    node = check_node(key_name)
    keys = sorted(set(keys))
    if not all(KEY_RE.match(k) for k in keys):
        raise UsageError("a roots document holds store keys only")
    doc: dict[str, Any] = {"format": ROOTS_FORMAT, "node": node, "time": time.time(), "seq": next_sequence(counter),
                           "keys": keys}
    if profiles:  # profile -> the key its current generation runs (for `llmgw-store fleet`; gc reads `keys`)
        doc["profiles"] = {p: k for p, k in sorted(profiles.items()) if k in keys}
    if releases:  # profile -> the release it follows (for `llmgw-store fleet`: in_sync, out_of_date)
        doc["releases"] = dict(sorted(releases.items()))
    if held:  # profiles held where they are (`hold`): `fleet` shows them held, not out of date
        doc["held"] = sorted(held)
    sign(doc, secret)
    name = f"roots/{node}.json"
    backend_for(to, policy).put(name, canonical_json(doc))
    say(f"published the roots of {node}: {len(keys)} store path(s)"
        + (f", {len(cold)} of them cold generations (kept for rollback)" if cold else ""))
    return PushRootsResult(node, tuple(keys), to, name, doc["seq"], tuple(cold))


@dataclass(frozen=True)
class RootsDoc:
    node: str
    keys: list[str]
    seq: int
    time: float
    profiles: dict[str, str] = field(default_factory=dict)  # profile -> key it runs (optional in the document)
    digest: str = ""  # sha256 of its signed part: the same document, the same digest (cache/seen.py)


def read_roots(backend, item, trusted: dict[str, bytes]) -> RootsDoc:
    """The checked roots document `item` (a Listed of roots/): the one reader, for gc and `fleet`."""
    return _read_roots(backend, item, trusted)


def _stopped(label: str, problem: str) -> IntegrityError:
    return IntegrityError(f"{label}: {problem}; refusing it (gc stopped, nothing deleted)")


def _read_roots(backend, item, trusted: dict[str, bytes]) -> RootsDoc:
    """The checked roots document `item`; IntegrityError (the gc stops) for anything else."""
    label = item.name
    if not item.regular:
        raise _stopped(label, "is not a regular file (a link?)")
    try:
        data = backend.get(item.name, max_bytes=METADATA_MAX_BYTES)
    except StoreError as exc:
        raise IntegrityError(f"{exc} (gc stopped, nothing deleted)") from None
    if data is None:
        raise _stopped(label, "listed, but could not be read")
    try:
        doc = json.loads(data)
    except ValueError:
        raise _stopped(label, "not valid JSON") from None
    if isinstance(doc, dict) and doc.get("format") == "llmgw-roots-1":
        raise _stopped(label, "a roots document without a sequence number (an older llmgw-store wrote it): publish "
                              "the node's roots again (push-roots)")
    if not isinstance(doc, dict) or doc.get("format") != ROOTS_FORMAT or not isinstance(doc.get("keys"), list) \
            or not isinstance(doc.get("node"), str) or not isinstance(doc.get("seq"), int) \
            or isinstance(doc.get("seq"), bool) or not isinstance(doc.get("time"), (int, float)):
        raise _stopped(label, "not a roots document")
    node = doc["node"]
    try:
        # Only the key named after the node may sign its roots: node-1's key cannot publish node-2's.
        if node not in trusted:
            raise IntegrityError(f"{label}: not signed by a trusted key named {node[:64]!r} (one key per node, "
                                 "named after it); refusing it")
        check_signature(doc, {node: trusted[node]}, label)
    except IntegrityError as exc:
        raise IntegrityError(f"{exc} (gc stopped, nothing deleted: trust the node's key with --keep-from, or "
                             "remove the document of a retired node)") from None
    if f"roots/{doc['node']}.json" != item.name:
        raise _stopped(label, f"signed for node {doc['node'][:64]!r}")
    keys = doc["keys"]
    if len(keys) > MAX_ROOT_KEYS or not all(isinstance(k, str) and KEY_RE.match(k) for k in keys):
        raise _stopped(label, "its keys are not store keys")
    profiles = doc.get("profiles", {})
    if not isinstance(profiles, dict) or len(profiles) > MAX_ROOT_KEYS or not all(
            isinstance(p, str) and PROFILE_RE.fullmatch(p) and isinstance(k, str) and KEY_RE.match(k)
            for p, k in profiles.items()):
        raise _stopped(label, "its profiles are not profile names and store keys")
    return RootsDoc(node, keys, doc["seq"], float(doc["time"]), profiles,
                    hashlib.sha256(signed_part(doc)).hexdigest())


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _check_newest(url: str, docs: list[tuple[str, RootsDoc]], seen: dict[str, Mark]) -> None:
    """Stop (IntegrityError) on a document older than the newest this host has seen of its node;
    when every document this host has seen before is older (two nodes or more), the cache's roots
    were rolled back as a whole (a backup restored), and the one line says so."""
    older = [(label, doc) for label, doc in docs if doc.node in seen and doc.seq < seen[doc.node].seq]
    if not older:
        return
    known = [doc for _, doc in docs if doc.node in seen]
    if len(older) >= 2 and len(older) == len(known):
        names = sorted(doc.node[:64] for _, doc in older)
        nodes = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise IntegrityError(
            f"cache {url[:200]}: the roots documents of every node this host has seen there ({nodes}) are older than "
            "the ones it saw before: the cache was rolled back as a whole (a backup restored?); refusing them (gc "
            "stopped, nothing deleted): have each node publish its roots again (push-roots)")
    label, doc = older[0]
    last = seen[doc.node]
    raise IntegrityError(
        f"{label}: sequence {doc.seq} (signed at {_when(doc.time)}) is older than {last.seq}, the newest this "
        f"host has seen of {doc.node} (a replayed or restored document); refusing it (gc stopped, nothing deleted): "
        "publish the node's roots again (push-roots)")


def _check_present(docs: list[tuple[str, RootsDoc]], seen: dict[str, Mark], trusted: dict[str, bytes]) -> None:
    """Stop (IntegrityError) when a node this host has accepted a document of, and whose key it is
    still told to keep the roots of, has none now: deleting a document would otherwise make the gc
    delete what that node runs. A retired node is one whose key is no longer given."""
    have = {doc.node for _, doc in docs}
    gone = sorted(n for n in seen if n in trusted and n not in have)
    if gone:
        node = gone[0][:64]
        raise IntegrityError(
            f"roots/{node}.json: missing, but this host has seen sequence {seen[gone[0]].seq} of {node} in this "
            "cache (deleted?); refusing to go on (gc stopped, nothing deleted): publish the node's roots again "
            "(push-roots), or, for a retired node, no longer pass its key to --keep-from")


def _check_recent(label: str, doc: RootsDoc, cutoff: float, grace: float, pushed: dict[str, float]) -> None:
    """Stop (IntegrityError) on a document signed longer ago than the grace while an object it does
    not hold was pushed after it: an older document replayed (which no sequence number this host
    holds can show), or a node that has not published since — either way trusting it would delete
    what the node may run now."""
    if doc.time >= cutoff:
        return
    held = set(doc.keys)
    after = [(t, k) for k, t in pushed.items() if t > doc.time and k not in held]
    if not after:
        return
    t, key = max(after)
    raise IntegrityError(
        f"{label}: signed at {_when(doc.time)}, longer ago than the grace ({_ago(grace)}), and {key}.json was pushed "
        f"after it ({_when(t)}): a replayed document, or a node that has not published since; refusing it (gc "
        "stopped, nothing deleted): publish the node's roots again (push-roots), more often than the grace")


def _held_by_releases(pointed: list[releases.Release]) -> dict[str, str]:
    """key -> why a release holds it: what a pointer names now, then the keys of its history (a
    rollback by `release set` to an earlier key must still find the object)."""
    now: dict[str, list[str]] = {}
    before: dict[str, list[str]] = {}
    for r in pointed:
        now.setdefault(r.key, []).append(r.release)
        for e in r.history:
            before.setdefault(e["key"], []).append(r.release)
    why = {k: f"held by release {', '.join(sorted(names))}" for k, names in now.items()}
    for k, names in before.items():
        earlier = f"held by release {', '.join(sorted(set(names)))} (an earlier pointer, for rollback)"
        why[k] = f"{why[k]}; {earlier}" if k in why else earlier
    return why


def _blobs_of(backend, key: str, doc: dict[str, Any]) -> set[str]:
    """The blobs a format-2 object holds: its listing, plan and manifest, and every blob of its plan."""
    label = f"{key}.json"
    try:
        listing = doc["content_hash"]
        plan = doc["plan"]
        held = {listing, plan["digest"], doc["manifest"]["digest"]}
        data = fetch_small(backend, BlobRef(plan["digest"], plan["size"], plan["csize"]), label)
        for b in json.loads(data)["blobs"]:
            held.add(b["d"])
    except (KeyError, TypeError, ValueError, IntegrityError) as exc:
        raise IntegrityError(f"{label}: a kept object whose plan cannot be read ({exc}); gc stopped, nothing "
                             "deleted: push it again, or delete its metadata") from None
    if not all(isinstance(d, str) and HEX64.fullmatch(d) for d in held):
        raise IntegrityError(f"{label}: a kept object whose plan names something other than blobs; gc stopped")
    return held


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _renew(backend, marker: str) -> float:
    """Rewrite this gc's marker with a new expiry; that expiry. Only while the marker as the cache
    holds it is unexpired by GC_RENEW_MARGIN at least: once it may have expired (gc paused or
    slow, or the marker gone or tampered with), a push may have trusted blobs this gc meant to
    delete, so gc deletes nothing more."""
    data = backend.get(marker, max_bytes=4096)
    try:
        expires = float(json.loads(data)["expires"]) if data else 0.0
    except (ValueError, KeyError, TypeError):
        expires = 0.0
    now = time.time()
    if expires - now < GC_RENEW_MARGIN:
        raise StoreError(f"cache gc: its marker {marker} expired or is about to ({expires - now:.0f}s left); "
                         "stopped deleting (a push may be going ahead): run the gc again")
    new = now + GC_MAX_SECONDS
    backend.put(marker, canonical_json({"time": now, "expires": new}))
    return new


def _delete_while_marked(backend, marker: str, names: list[str]) -> None:
    """Delete `names` in order, renewing the gc marker before each batch (see _renew)."""
    expires, renewed = 0.0, 0.0
    for count, name in enumerate(names):
        now = time.time()
        if count % GC_RENEW_BATCH == 0 or now - renewed > GC_RENEW_MARGIN / 5 or expires - now < GC_RENEW_MARGIN:
            expires, renewed = _renew(backend, marker), now
        backend.delete(name)


@dataclass(frozen=True)
class CacheGcResult(Result):
    dry_run: bool
    deleted_objects: tuple[str, ...]  # <key>.json and <key>.tar.zst
    deleted_blobs: int
    freed_bytes: int
    kept_objects: int
    kept_blobs: int
    roots: dict[str, int] = field(default_factory=dict)  # node -> keys its document holds
    seconds: float = 0.0
    why_kept: dict[str, str] = field(default_factory=dict)  # <key>.json -> why the gc keeps that object


def _key_values(given: list[str] | tuple[str, ...]) -> list[str]:
    values: list[str] = []
    for v in given:  # a directory stands for the .public files in it; a key is never a path
        values += sorted(str(p) for p in Path(v).glob("*.public")) if inline_key(v) is None and os.path.isdir(v) \
            else [v]
    return values


def _read_releases(backend, url: str, listed, keys: dict[str, bytes], var: Path) -> list[releases.Release]:
    """Every release pointer of the cache, checked (releases.read_listed, then against this host's
    marks); IntegrityError (the gc stops) for the first that fails."""
    if len(listed) > MAX_RELEASES:
        raise IntegrityError(f"cache {url[:200]}: more than {MAX_RELEASES} release pointers; refusing them (gc "
                             "stopped, nothing deleted)")
    marks = seen.marks(var, seen.ANY_CACHE, releases.KIND)  # a release's, from whichever cache
    out = []
    for item in sorted(listed, key=lambda i: i.name):
        try:
            r = releases.read_listed(backend, item, keys)
            seen.check_mark(marks.get(r.release), r.seq, r.digest, item.name)
        except IntegrityError as exc:
            raise IntegrityError(f"{exc} (gc stopped, nothing deleted)") from None
        out.append(r)
    return out


@dataclass
class _Listing:
    """What the cache holds, listed once after the marker is written and before anything is read.
    Anything but a regular file under an object's name (a link, a FIFO: file:// only) is never
    deleted; under roots/ and releases/ it stops the gc (_read_roots, releases.read_listed)."""
    top: list[Any]
    pending: list[Any]
    root_docs: list[Any]
    pointers: list[Any]
    blobs: list[Any]
    gc_markers: list[Any]


def _list_cache(backend) -> _Listing:
    return _Listing(top=[i for i in backend.list("") if i.regular],
                    pending=[i for i in backend.list("pending") if i.regular],
                    root_docs=backend.list("roots"),
                    pointers=backend.list("releases"),
                    blobs=[i for i in backend.list("blobs") if i.regular],
                    gc_markers=[i for i in backend.list("gc") if i.regular])


@dataclass
class _Documents:
    """The roots documents and release pointers gc trusts, each checked (signature, shape, not older
    than this host's high-water mark); `accepted`: the marks raised from them before the first delete."""
    docs: list[tuple[str, RootsDoc]]
    pointed: list[releases.Release]
    accepted: list[Seen]


def _read_documents(backend, url: str, listing: _Listing, trusted: dict[str, bytes],
                    release_keys: list[str] | tuple[str, ...], var: Path) -> _Documents:
    """Every roots document and release pointer of `listing`, checked; IntegrityError (the gc stops,
    nothing deleted) for any that is not to be trusted."""
    last_seen = seen.marks(var, url, ROOTS_KIND)
    docs = [(item.name, _read_roots(backend, item, trusted)) for item in listing.root_docs]
    _check_newest(url, docs, last_seen)
    _check_present(docs, last_seen, trusted)
    for label, doc in docs:  # older ones are named above; this is one number on two documents
        try:
            seen.check_mark(last_seen.get(doc.node), doc.seq, doc.digest, label)
        except IntegrityError as exc:
            raise IntegrityError(f"{exc} (gc stopped, nothing deleted)") from None
    accepted = [Seen(ROOTS_KIND, doc.node, doc.seq, doc.digest, doc.time, label) for label, doc in docs]
    pointed = _read_releases(backend, url, listing.pointers, {**trusted_keys(_key_values(release_keys)), **trusted},
                             var) if listing.pointers else []
    accepted += [Seen(releases.KIND, r.release, r.seq, r.digest, r.time, releases.object_of(r.release),
                      scope=seen.ANY_CACHE) for r in pointed]
    return _Documents(docs, pointed, accepted)


@dataclass
class _Kept:
    """What gc keeps: the live keys, each with the first reason found for it, and the blobs held."""
    live: set[str] = field(default_factory=set)
    why: dict[str, str] = field(default_factory=dict)
    blobs: set[str] = field(default_factory=set)

    def keep(self, key: str, reason: str) -> None:
        self.live.add(key)
        self.why.setdefault(key, reason)


def _held_by_documents(documents: _Documents, top: list[Any], cutoff: float, grace: float,
                       kept: _Kept) -> dict[str, int]:
    """Keep what the roots documents and release pointers hold; the number of keys per node. A
    document signed longer ago than the grace while an object it does not hold was pushed after it
    stops the gc (_check_recent)."""
    roots: dict[str, int] = {}
    holders: dict[str, list[str]] = {}
    pushed = {m.group(1): i.mtime for i in top if (m := _OBJECT.fullmatch(i.name)) and i.name.endswith(".json")}
    for label, doc in documents.docs:
        _check_recent(label, doc, cutoff, grace, pushed)
        roots[doc.node] = len(doc.keys)
        kept.live.update(doc.keys)
        for k in doc.keys:
            holders.setdefault(k, []).append(doc.node)
    for k, nodes in holders.items():
        kept.why[k] = f"held by the roots of {', '.join(sorted(nodes))}"
    for k, reason in _held_by_releases(documents.pointed).items():
        kept.live.add(k)
        kept.why[k] = f"{kept.why[k]}; {reason}" if k in kept.why else reason
    return roots


def _objects_by_key(top: list[Any]) -> dict[str, list[Any]]:
    objects: dict[str, list[Any]] = {}
    for item in top:
        m = _OBJECT.fullmatch(item.name)
        if m:
            objects.setdefault(m.group(1), []).append(item)
    return objects


def _keep_young(objects: dict[str, list[Any]], cutoff: float, now: float, kept: _Kept) -> None:
    for key, items in objects.items():
        young = [i.mtime for i in items if i.name.endswith(".json") and i.mtime > cutoff]
        if young:  # young: a push may not have published its roots yet
            kept.keep(key, f"younger than the grace (written {_ago(now - max(young))} ago)")


def _keep_pending(backend, listing: _Listing, marker: str, now: float, kept: _Kept) -> list[Any]:
    """Keep what the pushes in progress name (the key and the blobs of each pending marker younger
    than PENDING_STALE); the stale markers, pushes' and other gcs', to delete."""
    stale_markers = []
    for item in listing.pending:
        if item.mtime < now - PENDING_STALE:
            stale_markers.append(item)
            continue
        data = backend.get(item.name, max_bytes=PENDING_MAX_BYTES)
        try:
            doc = json.loads(data) if data else {}
            kept.blobs.update(d for d in doc.get("blobs", []) if isinstance(d, str) and HEX64.fullmatch(d))
            if isinstance(doc.get("key"), str) and KEY_RE.match(doc["key"]):
                kept.keep(doc["key"], f"a push in progress ({item.name})")
        except (ValueError, AttributeError):
            continue
    for item in listing.gc_markers:
        if item.name != marker and item.mtime < now - 2 * GC_MAX_SECONDS:
            stale_markers.append(item)
    return stale_markers


def _close_over_references(backend, kept: _Kept) -> None:
    """The closure of what is live, over the references the metadata declare; the blobs of each
    format-2 object reached are held. A kept object whose metadata is not JSON stops the gc."""
    todo, reached = list(kept.live), set()
    while todo:
        key = todo.pop()
        if key in reached:
            continue
        reached.add(key)
        data = backend.get(f"{key}.json", max_bytes=METADATA_MAX_BYTES)
        if data is None:
            continue  # a root naming a key never pushed here holds nothing
        try:
            doc = json.loads(data)
        except ValueError:
            raise IntegrityError(f"{key}.json: a kept object that is not JSON; gc stopped, nothing deleted") \
                from None
        refs = doc.get("references") if isinstance(doc, dict) else None
        for r in refs if isinstance(refs, list) else []:
            k = key_of_name(r) if isinstance(r, str) else None
            if k:
                todo.append(k)
                kept.why.setdefault(k, f"referenced by {key}")
        if isinstance(doc, dict) and doc.get("format") == 2:
            kept.blobs |= _blobs_of(backend, key, doc)
    kept.live = reached


def gc(url: str, keep_from: list[str], *, grace: float, var: Path, release_keys: list[str] | tuple[str, ...] = (),
       dry_run: bool = False, allow_no_roots: bool = False, policy: RetryPolicy | None = None) -> CacheGcResult:
    """Collect the cache `url` (see the module docstring). `var`: this host's ROOT/var, whose record
    of high-water marks (cache/seen.py) is read before anything else and raised before the first
    delete. `release_keys`: the keys that may sign release pointers, with those of `keep_from`."""
    started = time.monotonic()
    now = time.time()
    cutoff = now - grace
    backend = backend_for(url, policy)
    trusted = trusted_keys(_key_values(keep_from))
    if not trusted:
        raise UsageError("cache gc needs the public keys of the nodes whose roots it keeps: --keep-from KEY")
    marker = f"gc/{secrets.token_hex(8)}.json"
    if not dry_run:
        # From here until the marker is removed, a push waits before it trusts what the cache holds.
        backend.put(marker, canonical_json({"time": now, "expires": now + GC_MAX_SECONDS}))
    try:
        listing = _list_cache(backend)
        documents = _read_documents(backend, url, listing, trusted, release_keys, var)
        kept = _Kept()
        roots = _held_by_documents(documents, listing.top, cutoff, grace, kept)
        if not roots and not allow_no_roots:
            # No node's roots: every object past the grace would go. That is a wrong URL, a wrong
            # --keep-from, or roots never published far more often than an intended wipe.
            raise StoreError(f"cache gc: no roots document found in {url[:200]} (roots/<node>.json, published by "
                             "push-roots); refusing to delete everything older than the grace (nothing deleted; "
                             "--allow-no-roots to do it)")
        objects = _objects_by_key(listing.top)
        _keep_young(objects, cutoff, now, kept)
        stale_markers = _keep_pending(backend, listing, marker, now, kept)
        _close_over_references(backend, kept)
        live, blobs = kept.live, listing.blobs

        doomed_objects = [i for key, items in objects.items() if key not in live for i in items if i.mtime <= cutoff]
        doomed_blobs = [b for b in blobs if b.name[len("blobs/"):] not in kept.blobs and b.mtime <= cutoff]
        debug.pause("CACHE_GC_PAUSE")
        freed = sum(i.size for i in doomed_objects) + sum(b.size for b in doomed_blobs)
        verb = "would delete" if dry_run else "deleting"
        say(f"{verb} {len(doomed_objects)} object file(s) and {len(doomed_blobs)} blob(s), {human_size(freed)}; "
            f"keeping {len(live & objects.keys())} object(s) held by {len(roots)} node(s), "
            f"{len(documents.pointed)} release(s) or younger than the grace")
        why_kept = {f"{k}.json": kept.why.get(k, "kept") for k in sorted(live & objects.keys())}
        if dry_run:
            for name, reason in why_kept.items():
                say(f"keeping {name}: {reason}")
        if not dry_run:
            # Before any delete, on this host, checked again under its lock (another gc or reader
            # may have seen newer documents meanwhile): a replay of an older one is refused from now on.
            try:
                seen.accept_all(var, url, documents.accepted)
            except IntegrityError as exc:
                raise IntegrityError(f"{exc} (gc stopped, nothing deleted)") from None
            # Metadata before archives and blobs: an object is gone before any of its bytes are.
            doomed = [i.name for i in sorted(doomed_objects, key=lambda i: not i.name.endswith(".json"))]
            doomed += [b.name for b in doomed_blobs] + [i.name for i in stale_markers]
            _delete_while_marked(backend, marker, doomed)
        return CacheGcResult(dry_run, tuple(sorted(i.name for i in doomed_objects)), len(doomed_blobs), freed,
                             len(live & objects.keys()), len(blobs) - len(doomed_blobs), roots,
                             round(time.monotonic() - started, 3), why_kept)
    finally:
        if not dry_run:
            backend.delete(marker)
