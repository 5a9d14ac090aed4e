"""Releases: signed pointers in a binary cache, naming the store path a fleet runs.

`releases/<name>.json` holds the release's name, the store key and store path name it points at,
that path's engine, version and variant, the signer, a signed time, a sequence number that only
grows, and the pointers it replaced (newest first, at most HISTORY_MAX), signed by the builder's
key. A node that follows a release pulls exactly that key: it computes nothing (no recipe, no
interpreter, no index).

A reader takes the document as hostile until checked (cache/pointer.py, which the no-op follow
runs too), in this order, before any field is used: its size (at most RELEASE_MAX_BYTES, the read stops there), JSON, a trusted signature (over the
canonical JSON without `signatures`), then its shape — every field's type and bound, the release
name the one asked for, the key a store key, the store name one of that key. Then the replay rule
(cache/seen.py): a pointer whose sequence number is older than the newest this reader has seen for
that cache and release is refused; a newer sequence number pointing at an older key is a rollback
the builder signed, and is taken.

A writer reads the current pointer first (verified against the keys it trusts, its own included)
to carry its history and to sign a sequence number above it: microseconds since the epoch, and
more than the current one and than any this root has seen, so a clock set back still moves on.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmgw_store.app.credentials import public_url
from llmgw_store.app.results import Result, fields_of
from llmgw_store.base.errors import IntegrityError, NetworkError, NotSubstituted, UsageError
from llmgw_store.base.report import say
from llmgw_store.cache import pointer
from llmgw_store.cache.backends import Backend, RetryPolicy, backend_for
from llmgw_store.cache.caches import Caches
from llmgw_store.cache.pointer import (  # noqa: F401  (HISTORY_MAX, RELEASE_NAME_MAX: named here too)
    HISTORY_MAX,
    RELEASE_FORMAT,
    RELEASE_MAX_BYTES,
    RELEASE_NAME_MAX,
    SEQ_MAX,
    check_release_name,
    iso,
    refusal,
    seq_ok,
)
from llmgw_store.cache.signing import SecretKey, load_secret, sign, trusted_keys
from llmgw_store.core.keys import canonical_json

KIND = "release"  # the kind of document in cache/seen.py


def object_of(release: str) -> str:
    return f"releases/{check_release_name(release)}.json"


@dataclass(frozen=True)
class Release(Result):
    """A checked release pointer."""

    release: str
    key: str
    name: str  # the store path name it points at
    engine: str | None
    version: str | None
    variant: str | None
    signer: str
    time: float
    seq: int
    history: tuple[dict[str, Any], ...] = ()  # earlier pointers, newest first: seq, time, key, name, signer
    cache: str = ""  # the cache it was read from or written to (no credentials)
    digest: str = ""  # sha256 of its signed part: the same document, the same digest

    def entry(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "key": self.key, "name": self.name, "signer": self.signer}

    def body(self) -> dict[str, Any]:
        out = fields_of(self)
        out["time"] = iso(self.time)
        out["history"] = [{**e, "time": iso(e["time"])} for e in self.history]
        return out


def parse(data: bytes, release: str, trusted: dict[str, bytes], label: str) -> Release:
    """The checked pointer of `release` in `data` (at most RELEASE_MAX_BYTES, read by the caller
    with that cap). IntegrityError for anything but a pointer of that release a trusted key signed
    (cache/pointer.py: the checks, which the no-op follow runs too)."""
    doc = pointer.check(data, release, trusted, label)
    return Release(release, doc["key"], doc["name"], doc["engine"], doc["version"], doc["variant"], doc["signer"],
                   doc["time"], doc["seq"], doc["history"], digest=doc["digest"])


def fetch(backend: Backend, release: str, trusted: dict[str, bytes]) -> Release | None:
    """The checked pointer of `release` in one cache; None when it holds none."""
    label = object_of(release)
    data = backend.get(label, max_bytes=RELEASE_MAX_BYTES)
    return None if data is None else parse(data, release, trusted, label)


def read_listed(backend: Backend, item, trusted: dict[str, bytes]) -> Release:
    """The checked pointer `item` (a Listed of releases/, as cache gc lists them). IntegrityError
    for anything but `releases/<release name>.json`, a regular file, holding a pointer of that
    release that a key of `trusted` signed (parse)."""
    label = str(item.name)[:200]
    base = label[len("releases/"):]
    release = base[:-len(".json")] if label.startswith("releases/") and base.endswith(".json") else None
    try:
        release = check_release_name(release)
    except UsageError:
        raise refusal(label, "not a release pointer's name (releases/<name>.json)") from None
    if not item.regular:
        raise refusal(label, "not a regular file (a link?)")
    r = fetch(backend, release, trusted)
    if r is None:
        raise refusal(label, "listed, but could not be read")
    return r


def _with_cache(r: Release, url: str) -> Release:
    return replace(r, cache=public_url(url))


def read(urls: list[str] | tuple[str, ...], release: str, trusted: list[str] | tuple[str, ...], *,
         var: Path | None = None, record: bool = False, policy: RetryPolicy | None = None) -> Release:
    """The pointer of `release` from the first of the caches `urls` that serves one that passes
    every check (parse), and is no older than the newest this root has seen of it from that cache
    (`var`: ROOT/var, cache/seen.py; `record`: raise that mark to it). A cache that fails is
    passed over as a pull does (cache/caches.py); NotFoundError when none has the release."""
    from llmgw_store.base.errors import NotFoundError
    from llmgw_store.cache import seen

    check_release_name(release)
    keys = trusted_keys(list(trusted))
    caches = Caches(list(urls), policy)
    caches.check()
    label = object_of(release)

    def one(backend) -> tuple[str, Release] | None:
        url = next(u for u in caches.urls if caches.backend(u) is backend)
        r = fetch(backend, release, keys)
        if r is None:
            return None
        if var is not None:
            where = f"{public_url(url).rstrip('/')}/{label}"
            if record:
                seen.accept(var, seen.ANY_CACHE, KIND, release, r.seq, r.digest, r.time, where)
            else:
                seen.check(var, seen.ANY_CACHE, KIND, release, r.seq, r.digest, where)
        return url, r

    try:
        found = caches.first(one)
    except (NetworkError, IntegrityError) as exc:
        raise _not_read(release, label, exc) from exc
    if found is None:
        raise NotFoundError(f"no binary cache given has the release {release} ({label}; asked: "
                            f"{' '.join(public_url(u) for u in urls)})")
    return _with_cache(found[1], found[0])


def _not_read(release: str, label: str, exc: NetworkError | IntegrityError) -> NotSubstituted:
    """The error of a pointer no cache served: typed by its cause as a pull's is (cache/misses.py:
    exit 69 unreachable, 77 untrusted, 65 damaged or replayed), with the action in its line."""
    from llmgw_store.cache.misses import ERRORS, cause_of

    cause = cause_of(exc)
    action = {"unreachable": "bring the cache back or fix this node's route to it, then run this again",
              "untrusted": "add the builder's public key to trusted_keys (--trusted-key)",
              "damaged": "set the release again from the builder (`llmgw-store release set`)"}[cause]
    where = exc.cache or "the binary cache"
    return ERRORS[cause](f"the release {release} ({label}) could not be read from {where} ({exc}): {action}",
                         details={"cause": cause, "release": release})


@dataclass(frozen=True)
class ReleaseSet(Result):
    release: Release
    previous: Release | None = None
    moved: bool = True  # False: the release pointed at this key already (a new sequence number all the same)

    def body(self) -> dict[str, Any]:
        r = self.release.body()
        previous = {**self.previous.entry(), "time": iso(self.previous.time)} if self.previous else None
        return {**r, "previous": previous, "moved": self.moved}


def write(url: str, release: str, target: dict[str, Any], secret_key: SecretKey | str | Path, *, trusted: list[str] | tuple[str, ...] = (),
          var: Path | None = None, policy: RetryPolicy | None = None) -> ReleaseSet:
    """Point `release` in the cache `url` at `target` (key, name, engine, version, variant), signed
    with `secret_key`. The cache must hold the object (its metadata checked as a pull checks it,
    against `trusted` and the signer's own key), so a node never follows a pointer to nothing. The
    current pointer, when there is one, is checked the same way: its history is carried on, and
    the new sequence number is above it; one that fails its checks is not carried on (one line
    says so) and its sequence number, if it has one, is still passed."""
    from llmgw_store.cache import seen
    from llmgw_store.cache.pull import fetch_meta

    secret = load_secret(secret_key)  # a public key, a missing file, a wrong shape: exit 2 before anything
    check_release_name(release)
    keys = trusted_keys(list(trusted))
    name, key = target["name"], target["key"]
    own = base64.b64decode(secret.public_key.partition(":")[2])
    keys[secret.name] = own  # the signer trusts its own key (to check the object and the pointer it replaces)
    backend = backend_for(url, policy)
    label = object_of(release)
    meta = fetch_meta(backend, key, keys, name)
    if meta is None:
        what = name or key
        raise UsageError(f"the cache {public_url(url)} has no {what}: push it first (`llmgw-store push {what} --to "
                         "URL`), then set the release")
    name = meta.name  # checked: a store path name of `key` (and the name asked, when one was)
    previous: Release | None = None
    floor = 0
    data = backend.get(label, max_bytes=RELEASE_MAX_BYTES)
    if data is not None:
        try:
            previous = parse(data, release, keys, label)
            floor = previous.seq
        except IntegrityError as exc:
            say(f"{label}: the current pointer fails its checks ({exc}); writing a new one without its history")
            try:
                raw = json.loads(data).get("seq")
                floor = raw if seq_ok(raw) else 0
            except (ValueError, AttributeError, RecursionError):
                floor = 0
    if var is not None:
        mark = seen.newest(var, seen.ANY_CACHE, KIND, release)
        floor = max(floor, mark.seq if mark else 0)
    seq = max(time.time_ns() // 1000, floor + 1)
    if seq > SEQ_MAX:
        raise IntegrityError(f"{label}: its sequence number cannot grow past {SEQ_MAX}; delete it and set it again")
    history = ([previous.entry(), *previous.history] if previous else [])[:HISTORY_MAX]
    doc: dict[str, Any] = {"format": RELEASE_FORMAT, "release": release, "key": key, "name": name,
                           "engine": target.get("engine"), "version": target.get("version"),
                           "variant": target.get("variant"), "signer": secret.name, "time": time.time(), "seq": seq,
                           "history": history}
    sign(doc, secret)
    body = canonical_json(doc)
    made = parse(body, release, {secret.name: own}, label)  # what nodes will check, checked before it is written
    backend.put(label, body)
    if var is not None:
        seen.accept(var, seen.ANY_CACHE, KIND, release, made.seq, made.digest, made.time, f"{public_url(url)}/{label}")
    say(f"release {release} -> {name} (sequence {seq}, signed by {secret.name})")
    return ReleaseSet(_with_cache(made, url), previous, previous is None or previous.key != key)
