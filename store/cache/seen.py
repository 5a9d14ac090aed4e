"""High-water marks of signed documents a reader has accepted: per cache URL, kind and name, the
newest sequence number seen (and the digest of the document that carried it), kept on the reader's
own disk (ROOT/var/seen.json, core/layout.py): the one record of them on a host, for every kind —
release pointers (`activate --release`, `release set`, cache gc) and nodes' roots documents (cache
gc, `cache/cache_gc.py`) alike.

A signed document that only grows — a release pointer, a roots document — can be replayed: whoever
writes the cache puts back older bytes a trusted key once signed, and the signature still holds.
The rule that stops it is the same for every kind, so it lives here once:

- a document whose sequence number is lower than the mark is refused (a replay, or a restore from
  a backup);
- one with the mark's sequence number is accepted only if it is the very document that set the
  mark (its digest): one signer never signs two documents with one number;
- one with a higher number is accepted, and raises the mark (`accept`).

The file is the reader's own, so it is trusted as the reader's state but still read bounded and
never through a link, at most SEEN_MAX_BYTES; one that does not parse stops the reader (a lost record
would let a replay through) with a line saying how to start over. Updates are serialised by a lock
(var/locks/seen.lock), checked again under it, and written with system/files.write_atomic: a reader
sees the old record or the new one, whole, and two readers at once never lower a mark. Marks are
kept per cache URL without its credentials, normalised (`cache_id`): a password rotated, or the
path spelled another way, is the same cache. A kind whose signer numbers its documents for every
cache at once (release pointers: one builder's sequence orders a release wherever it is copied)
is kept under ANY_CACHE: an older pointer served by a second substituter, a mirror that lags or a
new cache URL is the same replay.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.app import debug
from llmgw_store.app.credentials import public_url
from llmgw_store.base.errors import IntegrityError, StoreError
from llmgw_store.core import locks
from llmgw_store.core.keys import canonical_json
from llmgw_store.core.layout import Layout
from llmgw_store.system.files import FileRefused, read_bounded, write_atomic

SEEN_FORMAT = "llmgw-seen-1"
SEEN_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Mark:
    seq: int
    digest: str  # sha256 of the document that carried `seq` (its signed part: see `accept`'s callers)
    time: float  # the document's signed time


ANY_CACHE = "*"  # the scope of a document whose signer numbers it for every cache (a release pointer)


def cache_id(url: str) -> str:
    """The cache URL as marks are kept under it: without credentials, the scheme and host in lower
    case, the path normalised (`//`, `/./`, `..`, a trailing slash), so that one cache spelled
    another way keeps its marks (a replay must not pass for a first sight). ANY_CACHE stays itself."""
    import posixpath

    url = public_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url.rstrip("/") or url
    host, slash, path = rest.partition("/")
    path = posixpath.normpath("/" + path.lstrip("/")).lstrip("/") if slash else ""
    return f"{scheme.lower()}://{host.lower()}/{path}".rstrip("/")


@dataclass(frozen=True)
class Seen:
    """A checked document a reader is about to rely on: what `accept_all` records."""

    kind: str
    name: str
    seq: int
    digest: str
    time: float
    label: str
    scope: str | None = None  # the cache its mark is kept under: `accept_all`'s url, else this (ANY_CACHE)


def _layout(var: Path) -> Layout:
    return Layout(var.parent)  # `var` is always a store's Layout.var


def _path(var: Path) -> Path:
    return _layout(var).seen_marks


def _load(var: Path) -> dict:
    path = _path(var)
    try:
        data = read_bounded(path, SEEN_MAX_BYTES)
    except FileNotFoundError:
        return {}
    except FileRefused as exc:
        raise StoreError(f"{exc}: the record of signed documents seen cannot be read; move it away to start the "
                         "record over (replays are refused again from the next document seen)") from None
    try:
        doc = json.loads(data)
        marks = doc["marks"] if isinstance(doc, dict) and doc.get("format") == SEEN_FORMAT else None
        if not isinstance(marks, dict):
            raise ValueError
        for kinds in marks.values():
            for names in kinds.values():
                for m in names.values():
                    if not isinstance(m.get("seq"), int) or not isinstance(m.get("digest"), str):
                        raise ValueError
    except (ValueError, AttributeError, TypeError, KeyError):
        raise StoreError(f"{path}: not a record of the signed documents seen; move it away to start the record over "
                         "(replays are refused again from the next document seen)") from None
    return marks


def _mark(m: dict | None) -> Mark | None:
    return Mark(m["seq"], m["digest"], float(m.get("time", 0.0))) if m else None


def newest(var: Path, url: str, kind: str, name: str) -> Mark | None:
    """The mark of (url, kind, name) on this disk, if any."""
    return _mark(_load(var).get(cache_id(url), {}).get(kind, {}).get(name))


def marks(var: Path, url: str, kind: str) -> dict[str, Mark]:
    """Every mark of `kind` this disk holds for the cache `url`: name -> mark."""
    return {name: Mark(m["seq"], m["digest"], float(m.get("time", 0.0)))
            for name, m in _load(var).get(cache_id(url), {}).get(kind, {}).items()}


def check_mark(mark: Mark | None, seq: int, digest: str, label: str) -> None:
    """IntegrityError if the document (seq, digest) is older than `mark`, or another with its number."""
    if mark is None or seq > mark.seq:
        return
    if seq < mark.seq:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(mark.time))
        raise IntegrityError(f"{label}: sequence {seq} is older than {mark.seq} (signed at {when}), the newest this "
                             "node has seen (a replayed or restored document); refusing it")
    if digest != mark.digest:
        raise IntegrityError(f"{label}: sequence {seq} is the newest this node has seen, but on another document "
                             "(two documents signed with one sequence number); refusing it")


def check(var: Path, url: str, kind: str, name: str, seq: int, digest: str, label: str) -> None:
    """IntegrityError if the document (seq, digest) is older than the mark, or another with its number."""
    check_mark(newest(var, url, kind, name), seq, digest, label)


def accept(var: Path, url: str, kind: str, name: str, seq: int, digest: str, signed_time: float, label: str, *,
           lock_timeout: float = locks.LOCK_TIMEOUT_S) -> None:
    """`check`, then raise the mark to `seq` (under the lock: two readers never lower it)."""
    accept_all(var, url, [Seen(kind, name, seq, digest, signed_time, label)], lock_timeout=lock_timeout)


def accept_all(var: Path, url: str, docs: list[Seen], *, lock_timeout: float = locks.LOCK_TIMEOUT_S) -> None:
    """`check` every document of `docs` (of the cache `url`) against the record as it is under the
    lock, then raise their marks in one write; IntegrityError (nothing recorded) if any is older
    than its mark, or another document with its number, by then."""
    lock = _layout(var).seen_lock
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with locks.flock(lock, shared=False, timeout=lock_timeout, what="recording a signed document seen"):
        record = _load(var)
        raised = []
        for d in docs:
            mark = _mark(record.get(cache_id(d.scope or url), {}).get(d.kind, {}).get(d.name))
            check_mark(mark, d.seq, d.digest, d.label)
            if mark is None or mark.seq != d.seq:
                raised.append(d)
        if not raised:
            return
        debug.pause("SEEN_PAUSE")  # tests: a reader between its check and its write, holding the lock
        for d in raised:
            record.setdefault(cache_id(d.scope or url), {}).setdefault(d.kind, {})[d.name] = {
                "seq": d.seq, "digest": d.digest, "time": d.time, "at": time.time()}
        write_atomic(_path(var), canonical_json({"format": SEEN_FORMAT, "marks": record}), mode=0o600)
