"""The follow of a release that has not moved, as it costs (the fast path, cli/fast.py, runs this
before the full `activate --release`): the node's own mark of the release, one read of the
pointer, its checks, and a comparison with the profile's current generation — no store opened as
the library opens it, no pull, no click.

    activate PROFILE --release NAME     (or `activate PROFILE` with the config file's `releases`)

`noop` answers only when everything says the release has not moved since this node last followed
it: the pointer the first cache serves passes every check releases.read makes (cache/pointer.py:
size, JSON, a trusted signature, then its shape — the very function), its sequence number and
digest are those of the node's mark (ROOT/var/seen.json: the pointer this node last accepted, so a
replayed, older or other pointer is never answered here), and its store path is the profile's
current generation (roots/switch.unchanged: under the profile's lock, the store settled, the
profile not held). Then the answer is the full command's "already at" result, and nothing is
written: the full command writes nothing either for that case (its mark is already that one).
Anything else returns None with nothing changed, and the full command runs — a moved release, a
first follow, a hold, a cache that fails or lacks the pointer (the full command passes it over to
the next cache), a pointer that fails a check (the full command refuses it, saying why), a key
file or URL this module does not take as plain.

The pointer is read as the cache backend reads it: a `file://` cache directly (its root and
`releases/` opened O_NOFOLLOW|O_DIRECTORY, the object O_NOFOLLOW|O_NONBLOCK, a regular file, the
read capped), an http(s) one through its backend (cache/backends: `get` with the cap), whose
import is then the cost of this path.
"""

from __future__ import annotations

import os
import stat

from llmgw_store.cache import pointer
from llmgw_store.cache.signatures import plain_trusted_keys
from llmgw_store.core import locations as loc
from llmgw_store.roots import switch
from llmgw_store.system import files, jsontext

SEEN_FORMAT = "llmgw-seen-1"  # cache/seen.py's
SEEN_MAX_BYTES = 16 << 20  # seen.SEEN_MAX_BYTES
ANY_CACHE = "*"  # seen.ANY_CACHE: release pointers are marked for every cache at once
KIND = "release"  # releases.KIND
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def noop(root: str, profile: str, release: str, *, substituters: tuple[str, ...], trusted: tuple[str, ...],
         environ, offline: bool, no_check: bool, cache_network: dict) -> tuple[dict, dict] | None:
    """(the Switch document, the pointer's checked fields and the cache it came from) of a follow
    that switches nothing; None, nothing changed, to leave the follow to the full command."""
    if not switch.profile_ok(profile) or not pointer.release_name_ok(release):
        return None
    urls = [u for u in substituters if u.startswith("file://")] if offline else list(substituters)
    if not urls:
        return None
    try:
        keys = plain_trusted_keys(trusted, environ)
        if not keys or os.path.lexists(f"{loc.at(root, loc.HOLDS)}/{profile}"):  # held: the full command says so
            return None
        mark = _mark(root, release)
    except Exception:  # anything not plain here is the full command's to say
        return None
    if mark is None:
        return None
    url = urls[0]
    label = f"releases/{release}.json"
    try:
        data = _read(url, label, cache_network)
        if data is None:
            return None
        doc = pointer.check(data, release, keys, label)
    except Exception:  # a cache that fails, a pointer that fails a check: the full command's to say
        return None
    if (doc["seq"], doc["digest"]) != mark:
        return None  # moved (newer), replayed (older) or other bytes: the full command decides
    done = switch.unchanged(root, profile, doc["name"], no_check=no_check, unless_held=True)
    if done is None:
        return None
    from llmgw_store.app.credentials import public_url

    return done, {**doc, "cache": public_url(url)}


def _mark(root: str, release: str) -> tuple[int, str] | None:
    """(sequence, digest) of this node's mark of `release` (cache/seen.py's record, read as it reads
    it: bounded, never through a link); None without one, or for a record seen.py would refuse."""
    try:
        raw = files.read_bounded(loc.at(root, loc.SEEN), SEEN_MAX_BYTES)
        doc = jsontext.loads(raw)
    except (OSError, ValueError):
        return None
    marks = doc.get("marks") if isinstance(doc, dict) and doc.get("format") == SEEN_FORMAT else None
    if not isinstance(marks, dict):
        return None
    try:  # every mark well formed, as seen._load wants them (else it stops the command, saying so)
        for kinds in marks.values():
            for names in kinds.values():
                for m in names.values():
                    if not isinstance(m.get("seq"), int) or not isinstance(m.get("digest"), str):
                        return None
        m = marks.get(ANY_CACHE, {}).get(KIND, {}).get(release)
    except (AttributeError, TypeError):
        return None
    return None if m is None else (m["seq"], m["digest"])


def _read(url: str, label: str, cache_network: dict) -> bytes | None:
    """The object `label` of the cache `url`, at most RELEASE_MAX_BYTES + 1 bytes; None when absent."""
    cap = pointer.RELEASE_MAX_BYTES
    if not url.startswith("file://"):
        from llmgw_store.cache.backends import RetryPolicy, backend_for

        # One attempt: a cache that fails now is left to the full command, whose retries then run
        # once (a fast path that retried too would double the time a follow takes to fail).
        policy = RetryPolicy.from_env(**{**cache_network, "attempts": 1})
        return backend_for(url, policy).get(label, max_bytes=cap)
    root = os.open(url[len("file://"):], _DIR)
    try:
        folder = os.open("releases", _DIR, dir_fd=root)
    finally:
        os.close(root)
    try:
        fd = os.open(label.rpartition("/")[2], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, cap + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
