"""A release pointer's checks (cache/releases.py has the rest: reading, writing, the seen marks),
lean, because the no-op follow runs them (roots/follow.py): os, hashlib, math and _json
(system/jsontext) and the signature's check (cache/signatures.py), no re, json or dataclasses. So a
follow answered without the library and one answered by it refuse the same documents: `check` is
releases.parse's, not a copy.

A document is taken as hostile until checked, in this order, before any field is used: its size,
JSON, a trusted signature (over the canonical JSON without `signatures`), then its shape — every
field's type and bound, the release name the one asked for, the key a store key, the store name one
of that key.
"""

from __future__ import annotations

import math

from llmgw_store.base.errors import IntegrityError, UsageError
from llmgw_store.cache.signatures import check_signature, signed_part
from llmgw_store.core.dirs import NIX_BASE32, is_store_name
from llmgw_store.system import jsontext

RELEASE_FORMAT = "llmgw-release-1"
RELEASE_NAME_MAX = 64
RELEASE_MAX_BYTES = 64 << 10  # a pointer and 16 earlier ones are about 5 KiB
HISTORY_MAX = 16
SEQ_MAX = (1 << 63) - 1
FIELD_MAX = 200  # engine, version, variant, signer: short words
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _ALNUM | frozenset("._-")  # a release name's (release_name_ok), and a signer's
_WORD_CHARS = _ALNUM | frozenset("._+!-")
_FIELDS = frozenset({"format", "release", "key", "name", "engine", "version", "variant", "signer", "time", "seq",
                     "history", "signatures"})
_ENTRY = frozenset({"seq", "time", "key", "name", "signer"})


def sha256_hex(data: bytes) -> str:
    """hashlib.sha256(data).hexdigest(), from the interpreter's own sha256 where it has one (hashlib
    loads OpenSSL's, 2 ms of a follow that costs 30)."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # Python 3.12 and later (no stub)
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found]  # 3.11 (no stub)
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()


def _chars(value: object, chars: frozenset, most: int) -> bool:
    """`value` is `[A-Za-z0-9][chars]{0,most-1}` (re.fullmatch of that, without re)."""
    return isinstance(value, str) and 0 < len(value) <= most and value[0] in _ALNUM and set(value) <= chars


def release_name_ok(name: object) -> bool:
    """[A-Za-z0-9][A-Za-z0-9._-]*, at most 64, no '..' (releases.check_release_name)."""
    return _chars(name, _NAME_CHARS, RELEASE_NAME_MAX) and ".." not in name  # type: ignore[operator]


def check_release_name(name: object) -> str:
    """A release name: [A-Za-z0-9._-], starting with a letter or digit, at most 64, no '..' (it
    names a cache object, `releases/<name>.json`, and a mark in ROOT/var/seen.json)."""
    if not release_name_ok(name):
        from llmgw_store.base.text import shown

        if _chars(name, _NAME_CHARS, 1 << 30) and ".." not in name:  # type: ignore[operator]
            raise UsageError(f"{shown(name)} is not a release name: at most {RELEASE_NAME_MAX} characters")
        raise UsageError(f"{shown(name)} is not a release name: use [A-Za-z0-9._-], starting with a letter or digit, "
                         "no '/' or '..'")
    return name  # type: ignore[return-value]


def iso(t: float | None) -> str | None:
    """A signed time (seconds since the epoch) as `--json` documents give times (docs/json.md)."""
    if t is None:
        return None
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def refusal(label: str, problem: str) -> IntegrityError:
    return IntegrityError(f"{label}: {problem}; refusing it")


def seq_ok(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= SEQ_MAX


def _when(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _word(value: object) -> bool:
    return value is None or _chars(value, _WORD_CHARS, FIELD_MAX)


def _signer(value: object) -> bool:
    return _chars(value, _NAME_CHARS, 100)


def _store_pointer(key: object, name: object) -> bool:
    """`key` a store key, `name` a store path name of it (keys.KEY_RE, is_store_name, key_of_name)."""
    return (isinstance(key, str) and len(key) == 32 and set(key) <= NIX_BASE32 and isinstance(name, str)
            and is_store_name(name) and name[:32] == key)


def _entry_ok(e: object) -> bool:
    return (isinstance(e, dict) and set(e) == _ENTRY and seq_ok(e["seq"]) and _when(e["time"])
            and _store_pointer(e["key"], e["name"]) and _signer(e["signer"]))


def check(data: bytes, release: str, trusted: dict[str, bytes], label: str) -> dict:
    """The checked pointer of `release` in `data` (read by the caller with the RELEASE_MAX_BYTES
    cap): its fields, `history` a tuple, `time` a float, and `digest`, the sha256 of its signed part
    (the same document, the same digest: what cache/seen.py marks). IntegrityError for anything but
    a pointer of that release a trusted key signed."""
    if len(data) > RELEASE_MAX_BYTES:
        raise refusal(label, f"larger than a release pointer ({RELEASE_MAX_BYTES} bytes)")
    try:
        doc = jsontext.loads(data)
        jsontext.canonical(doc)  # what parses must re-encode (for the signature) without recursing out
    except (ValueError, RecursionError):
        raise refusal(label, "not valid JSON") from None
    if not isinstance(doc, dict):
        raise refusal(label, "not a release pointer")
    signer = check_signature(doc, trusted, label)
    # Signed by a trusted key: now its fields, each before it is used.
    if set(doc) != _FIELDS or doc["format"] != RELEASE_FORMAT:
        raise refusal(label, f"not a release pointer of format {RELEASE_FORMAT}")
    if doc["release"] != release:
        from llmgw_store.base.text import shown

        raise refusal(label, f"it is signed for another release ({shown(doc['release'])})")
    if not _store_pointer(doc["key"], doc["name"]):
        raise refusal(label, "its key and name are not a store key and a store path name of it")
    if not all(_word(doc[f]) for f in ("engine", "version", "variant")):
        raise refusal(label, "its engine, version or variant is not a short word")
    if doc["signer"] != signer:
        raise refusal(label, f"its signer field is not {signer}, the key that signed it")
    if not seq_ok(doc["seq"]) or not _when(doc["time"]):
        raise refusal(label, f"its sequence number or time is not a number from 1 to {SEQ_MAX}")
    history = doc["history"]
    if not isinstance(history, list) or len(history) > HISTORY_MAX or not all(_entry_ok(e) for e in history):
        raise refusal(label, f"its history is not a list of at most {HISTORY_MAX} earlier pointers")
    out = {f: doc[f] for f in ("release", "key", "name", "engine", "version", "variant", "signer", "seq")}
    out.update(time=float(doc["time"]), history=tuple(history), digest=sha256_hex(signed_part(doc)))
    return out
