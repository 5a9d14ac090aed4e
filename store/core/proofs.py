"""Kept proofs that a store path was installed from its lock, so a switch need not prove it again.

    ROOT/var/lockproofs/<name>     {name, content_hash, lock_format, lock_blake3, mac}

A generation's record keeps the lock its store path was installed from, once proved
(build/lockproof.proved_lock): the contents listing hashes to the content hash the index records,
and the manifest's lock text to the listed digest of the lock file. That proof reads the whole
listing (97,944 entries for vLLM). It is made once — when the path is built, or at its first record
— and kept here; a switch (roots/switch.py) then hashes only the manifest's lock text and compares
it with the kept digest, for the content hash the index still records.

A proof file is outside input when read back: a private file of the store owner's in the 0700
var/, never reached through a link, bounded, and its MAC (blake3 keyed with the store's records
key, ROOT/var/records.key, over a tag and the canonical body) checked before any field is used.
Who cannot read var/ cannot forge one. Anything else is no proof (the full proof runs again), never
an error. Writing is best effort (a proof not kept is made again). Only os, blake3 and system/files,
core/dirs, system/jsontext are imported: this module is on a switch's path.
"""

from __future__ import annotations

import os

from llmgw_store.core.locations import LOCKPROOFS, RECORDS_KEY, leaf
from llmgw_store.system import files, jsontext

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a switch's path)
if TYPE_CHECKING:
    from collections.abc import Mapping

SECRET_FILE = leaf(RECORDS_KEY)  # roots/records.py's SECRET_FILE: the same key seals records
SECRET_BYTES = 32
PROOFS_DIR = leaf(LOCKPROOFS)
PROOF_MAX = 4096
TAG = b"llmgw-store lock proof 1\x00"  # a proof's MAC is never a record's digest
LOCK_FORMATS = ("requirements.lock", "pylock.toml")
_FIELDS = ("name", "content_hash", "lock_format", "lock_blake3")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def secret(var_fd: int, make: bool = False) -> bytes | None:
    """The records key, if it is the owner's private 32-byte file with one link (made first with
    `make`, as records.secret makes it); None otherwise."""
    try:
        if make:
            return files.private_secret(SECRET_FILE, SECRET_BYTES, dir_fd=var_fd)
        key = files.read_bounded(SECRET_FILE, SECRET_BYTES, dir_fd=var_fd, owner=os.geteuid(), deny_mode=0o077,
                                 one_link=True)
    except OSError:
        return None
    return key if len(key) == SECRET_BYTES else None


def _mac(key: bytes, body: Mapping[str, object]) -> str:
    from blake3 import blake3

    return blake3(TAG + jsontext.canonical(body), key=key).hexdigest()


def keep(var: str | os.PathLike, name: str, content_hash: str, lock_format: str, lock: str,
         key: bytes | None = None) -> bool:
    """Keep the proof that store path `name`, with `content_hash`, was installed from `lock` (just
    proved by build/lockproof.proved_lock). `var`: ROOT/var. Whether it was kept."""
    from blake3 import blake3

    from llmgw_store.core.dirs import is_store_name, private_dir

    if not is_store_name(name) or lock_format not in LOCK_FORMATS:
        return False
    try:
        var_fd = os.open(var, _DIR)
    except OSError:
        return False
    try:
        key = key or secret(var_fd, make=True)
        if key is None:
            return False
        fd = private_dir(PROOFS_DIR, var_fd, True)
        if fd is None:
            return False
        body = {"name": name, "content_hash": content_hash, "lock_format": lock_format,
                "lock_blake3": blake3(lock.encode()).hexdigest()}
        try:
            files.write_atomic(name, jsontext.canonical({**body, "mac": _mac(key, body)}), dir_fd=fd, mode=0o600,
                               fsync=False)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
    finally:
        os.close(var_fd)


def recall(var_fd: int, key: bytes, name: str, content_hash: str) -> dict[str, str] | None:
    """The kept proof for store path `name` at `content_hash`, its MAC checked; None when there is
    none (or it is not one this store kept, or for other content)."""
    from _operator import _compare_digest  # hmac's, without OpenSSL

    from llmgw_store.core.dirs import private_dir, read_private

    fd = private_dir(PROOFS_DIR, var_fd, False)
    if fd is None:
        return None
    try:
        raw = read_private(fd, name, PROOF_MAX)
    finally:
        os.close(fd)
    if raw is None:
        return None
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in (*_FIELDS, "mac")):
        return None
    body: dict[str, str] = {k: doc[k] for k in _FIELDS}
    if not _compare_digest(_mac(key, body), doc["mac"]):
        return None
    if body["name"] != name or body["content_hash"] != content_hash or body["lock_format"] not in LOCK_FORMATS:
        return None
    return body


def drop(var: str | os.PathLike, name: str) -> None:
    """Remove the kept proof of store path `name` (gc took the path). Never through a link."""
    from llmgw_store.core.dirs import is_store_name, private_dir

    if not is_store_name(name):
        return
    try:
        var_fd = os.open(var, _DIR)
    except OSError:
        return
    try:
        fd = private_dir(PROOFS_DIR, var_fd, False)
    finally:
        os.close(var_fd)
    if fd is None:
        return
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
