"""A profile's generation summary: what `generations` shows of each record, in one file, so a
listing of 1,000 generations reads one file, not 1,000 (roots/records.py keeps the records).

    ROOT/profiles/.<p>.summary   <64 hex: keyed digest>\\n<JSON: {format, profile, entries}>
                                 entries: {"<N>": {"stamp": [ino, size, mtime_ns, ctime_ns],
                                 "name", "created", "engine", "version", "variant", "rebuildable",
                                 "check", "rolled_back_to"}}

Invariants:
- The summary is a cache of the records, never a source: an entry is used only while its record
  file exists and has exactly the stamp the entry names (the inode, size, mtime and ctime the
  record had when the entry was taken from it: a record replaced, rewritten, renamed, linked or
  chmod-ed has another stamp). A record without a matching entry is read and checked in full
  (records.load) and its entry taken again.
- The digest is blake3 keyed with the records key (ROOT/var/records.key) over the JSON bytes as
  written, checked before anything in them is used: who can write profiles/ but not read var/
  cannot make a summary that is believed. A summary that fails (torn, edited, another store's,
  another profile's) is ignored whole and rebuilt from the records.
- Written atomically (tmp + rename, 0600, no fsync: a summary lost or torn by a crash is rebuilt)
  by every change of a record (records.write/remove, the switch fast path) under the profile's
  lock; a listing only looks (it reads the records whose entries are stale, and writes nothing:
  tests/integrity/test_readonly.py). Each entry carries the stamp of the record it came from, so a summary
  written from an older state is never believed for a newer record. Writing it is best-effort: a
  failure leaves the records, the truth, as they are.
- Imports only os, stat, blake3 and system/files, system/jsontext: roots/switch.py keeps it on its
  fast path.
"""

from __future__ import annotations

import os
import stat
from _operator import _compare_digest as compare_digest  # hmac's, without OpenSSL (roots/records.py)

from blake3 import blake3

from llmgw_store.core.locations import record_file, summary_file
from llmgw_store.system import files, jsontext

FORMAT = 1
SUMMARY_MAX = 64 << 20  # 1,000 entries with full check tails are ~10 MB
_FIELDS = ("name", "created", "engine", "version", "variant", "rebuildable", "check", "rolled_back_to")
_FIELD_SET = frozenset(_FIELDS)


def stamp(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def record_stamp(dir_fd: int, filename: str) -> list[int] | None:
    """The record file's stamp; None when it is not a regular file (gone, a link: records.load says why)."""
    try:
        st = os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return stamp(st) if stat.S_ISREG(st.st_mode) else None


def entry_of(body: dict) -> dict:
    """What `generations` shows of a record, from its checked body (records.Record.body())."""
    act = body.get("activation") or {}
    build = (body.get("inputs") or {}).get("build")
    return {"name": body["name"], "created": body["created"], "engine": body["engine"], "version": body["version"],
            "variant": body["variant"], "rebuildable": body.get("lock") is not None and isinstance(build, dict),
            "check": act.get("check"), "rolled_back_to": act.get("rolled_back_to")}


def read(dir_fd: int, profile: str, key: bytes) -> dict[int, dict] | None:
    """number -> entry (with its "stamp") of the profile's summary; None when there is none or it
    fails its digest or its shape (it is then ignored whole)."""
    try:
        raw = files.read_bounded(summary_file(profile), SUMMARY_MAX, dir_fd=dir_fd, owner=os.geteuid(),
                                 deny_mode=0o077, one_link=True)
    except OSError:  # absent, a link, not ours, open to others: not believed
        return None
    digest, _, text = raw.partition(b"\n")
    if len(digest) != 64 or not compare_digest(blake3(text, key=key).hexdigest().encode(), digest):
        return None
    try:
        doc = jsontext.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("profile") != profile \
            or not isinstance(doc.get("entries"), dict):
        return None
    out: dict[int, dict] = {}
    for n, e in doc["entries"].items():
        if not (isinstance(n, str) and n.isdigit() and isinstance(e, dict) and isinstance(e.get("stamp"), list)
                and _FIELD_SET <= e.keys()):
            return None
        out[int(n)] = e
    return out


def write(dir_fd: int, profile: str, key: bytes, entries: dict[int, dict]) -> None:
    """Replace the summary with `entries` (best-effort: see the module docstring)."""
    text = jsontext.canonical({"format": FORMAT, "profile": profile,
                               "entries": {str(n): e for n, e in sorted(entries.items())}})
    data = blake3(text, key=key).hexdigest().encode() + b"\n" + text
    try:
        files.write_atomic(summary_file(profile), data, dir_fd=dir_fd, mode=0o600, fsync=False)
    except OSError:
        pass


def note(dir_fd: int, profile: str, key: bytes, number: int, body: dict | None, *, first: bool = False) -> None:
    """Under the profile's lock, after record `number` was written with `body` (None: removed):
    its entry in the summary, taken with the stamp the file has now (roots/switch.py's fast path;
    records.write takes every changed entry again). `first`: the profile has no other record, so a
    summary is made when there is none; otherwise, without a summary that verifies, nothing is
    written (the next change through records.write makes it from the records)."""
    entries = read(dir_fd, profile, key)
    if entries is None and not first:
        return
    entries = entries or {}
    st = record_stamp(dir_fd, record_file(profile, number)) if body is not None else None
    if st is None:
        entries.pop(number, None)
    else:
        entries[number] = {**entry_of(body), "stamp": st}  # type: ignore[arg-type]
    write(dir_fd, profile, key, entries)
