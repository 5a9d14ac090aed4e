"""High-water marks of signed documents a reader has accepted: per cache URL, kind and name, the
newest sequence number seen (and the digest of the document that carried it), kept on the reader's
own disk (ROOT/var/seen.json).

A signed document that only grows — a release pointer, a roots document — can be replayed: whoever
writes the cache puts back older bytes a trusted key once signed, and the signature still holds.
The rule that stops it is the same for every kind, so it lives here once:

- a document whose sequence number is lower than the mark is refused (a replay, or a restore from
  a backup);
- one with the mark's sequence number is accepted only if it is the very document that set the
  mark (its digest): one signer never signs two documents with one number;
- one with a higher number is accepted, and raises the mark (`accept`).

The file is the reader's own, so it is trusted as the reader's state but still read bounded and
never through a link; one that does not parse stops the reader (a lost record would let a replay
through) with a line saying how to start over. Updates are serialised by a lock (var/locks/seen.lock)
and written with core/files.write_atomic: a reader sees the old record or the new one, whole.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core import debug, locks
from llmgw_store.core.credentials import public_url
from llmgw_store.core.errors import IntegrityError, StoreError
from llmgw_store.core.files import FileRefused, read_bounded, write_atomic
from llmgw_store.core.keys import canonical_json

SEEN_FILE = "seen.json"
SEEN_FORMAT = "llmgw-seen-1"
SEEN_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Mark:
    seq: int
    digest: str  # sha256 of the document that carried `seq` (its signed part: see `accept`'s callers)
    time: float  # the document's signed time


def cache_id(url: str) -> str:
    """The cache URL as marks are kept under it: without credentials or a trailing slash."""
    return public_url(url).rstrip("/")


def _path(var: Path) -> Path:
    return var / SEEN_FILE


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


def newest(var: Path, url: str, kind: str, name: str) -> Mark | None:
    """The mark of (url, kind, name) on this disk, if any."""
    m = _load(var).get(cache_id(url), {}).get(kind, {}).get(name)
    return Mark(m["seq"], m["digest"], float(m.get("time", 0.0))) if m else None


def _check(mark: Mark | None, seq: int, digest: str, label: str) -> None:
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
    _check(newest(var, url, kind, name), seq, digest, label)


def accept(var: Path, url: str, kind: str, name: str, seq: int, digest: str, signed_time: float, label: str, *,
           lock_timeout: float = locks.LOCK_TIMEOUT_S) -> None:
    """`check`, then raise the mark to `seq` (under the lock: two readers never lower it)."""
    lock = var / "locks" / "seen.lock"
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with locks.flock(lock, shared=False, timeout=lock_timeout, what="recording a signed document seen"):
        marks = _load(var)
        url_id = cache_id(url)
        m = marks.get(url_id, {}).get(kind, {}).get(name)
        mark = Mark(m["seq"], m["digest"], float(m.get("time", 0.0))) if m else None
        _check(mark, seq, digest, label)
        if mark is not None and mark.seq == seq:
            return
        debug.pause("SEEN_PAUSE")  # tests: a reader between its check and its write, holding the lock
        marks.setdefault(url_id, {}).setdefault(kind, {})[name] = {"seq": seq, "digest": digest,
                                                                   "time": signed_time, "at": time.time()}
        write_atomic(_path(var), canonical_json({"format": SEEN_FORMAT, "marks": marks}), mode=0o644)
