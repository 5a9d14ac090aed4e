"""Generation records: what each generation of a profile was, kept on disk beside its links, so a
generation whose store path is gone ("cold") can be rebuilt exactly, and the profile's history
(who switched, when, which check ran and what it said) survives a lost index.

    ROOT/profiles/<p>-<N>-link      -> ../store/<name>   generation N (hot while its path exists)
    ROOT/profiles/.<p>-<N>.record   JSON, format 1: generation N's store path name, key, content
                                    hash, the key's inputs (the recipe's build table, engine, asOf,
                                    uv, interpreter, platform), requirements, and the full lock
                                    text (hashes included) the path was installed from
    ROOT/profiles/.<p>.history      JSON lines: the profile's last events (who switched, when, the
                                    check and its result, automatic rollbacks)

Names start with a dot, so no profile (names never do) and no generation link can be one of
them; `.<p>-<N>.record` splits at its last `-` into one profile and one number.

Invariants:
- Written only under the profile's lock, atomically: a temporary file in the same directory,
  fsync, rename(2) over the old one, fsync of the directory. A reader sees the old record or the
  new one, never a torn one; a killed writer leaves `.<name>.tmp-<pid>-<random>`, which the next
  change of the profile (holding the lock) removes.
- Records and the history are 0600, the store owner's alone (profiles/ itself stays 0755 for its
  links): they keep what a check printed, which may hold a token. One left 0644 by an older
  llmgw-store is closed up when it is next read or appended to.
- Deleting a generation removes its link, never its record (the generation becomes cold);
  `forget` and the `keep` bound remove records, and never the record of a generation whose link
  exists.
- A record is outside input when read back (it is a file; backups are restored, disks are
  edited): it is opened without following links, its size bounded before it is read, its shape
  checked field by field, every name checked (core/names), its key recomputed from its inputs, its
  lock checked against the lock digest and the whole document against its digest. What fails is
  refused (IntegrityError) and never used.
- The digest is a keyed hash (blake3 with the store's private records key, ROOT/var/records.key,
  32 random bytes made 0600 by the store's owner on first use; var/ is private): who can write
  profiles/ but not read var/ cannot forge a record. It is checked before any other field is used.
  A record file must be the store owner's, without write bits for group or others, and have one
  link (a hard link elsewhere is a second way to change it).
- A record's lock installs only from the recorded index: every requirement line is a plain
  `name==version` with hashes (no `@ URL`, no `-e`/`-i`/`--find-links` or other option), every
  file a pylock.toml names is an http(s) URL (no path, directory, VCS or archive source).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from _operator import _compare_digest as compare_digest  # hmac's, without loading OpenSSL (2 ms): a hot path
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

from llmgw_store.base.errors import IntegrityError
from llmgw_store.base.report import say
from llmgw_store.core import manifest, proofs
from llmgw_store.core.index import RegisteredPath, now_iso
from llmgw_store.core.keys import KEY_RE, canonical_json, is_store_name, path_name, store_key
from llmgw_store.core.layout import Layout
from llmgw_store.core.locations import RECORDS_KEY, history_file, is_generation_link, leaf, record_file
from llmgw_store.core.names import check_generation, check_profile
from llmgw_store.core.pathinfo import StorePathInfo
from llmgw_store.roots import summary
from llmgw_store.system import files

FORMAT = 1
RECORD_MAX = 32 << 20  # a lock with every hash (vLLM's pylock is well under 2 MB) and the inputs
HISTORY_MAX_BYTES = 8 << 20  # a history file larger than this is not read
HISTORY_ROTATE_BYTES = 1 << 20  # past this the history is rewritten with its last HISTORY_MAX events
HISTORY_MAX = 1000  # events kept per profile
DEFAULT_KEEP_RECORDS = 100  # records kept per profile, the newest, and always every hot one
LOCK_FORMATS = ("requirements.lock", "pylock.toml")
HEX64 = re.compile(r"[0-9a-f]{64}")
_SHORT = 200  # bound on the free-text strings of a record (dates, user names, check results)
_LIST_MAX = 10_000  # bound on lists (requirements, argv)
SECRET_BYTES = 32
SECRET_FILE = leaf(RECORDS_KEY)  # in ROOT/var (private)
# Records and the history are the store owner's alone: a check's output (its last lines, which may
# carry a token the check printed) is kept in them. profiles/ stays 0755 for the links.
FILE_MODE = 0o600

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": int, "profile": str, "generation": int, "name": str, "key": str, "content_hash": str,
    "engine": str, "version": str, "variant": str, "inputs": dict, "requirements": list,
    "lock_format": (str, type(None)), "lock": (str, type(None)), "lock_blake3": (str, type(None)),
    "created": str, "by": dict, "activation": dict, "digest": str,
}


@dataclass(frozen=True)
class Record:
    """One generation's record, checked (see `load`)."""

    profile: str
    generation: int
    name: str
    key: str
    content_hash: str
    engine: str
    version: str
    variant: str
    inputs: dict[str, Any]
    requirements: tuple[str, ...]
    lock_format: str | None
    lock: str | None
    created: str
    by: dict[str, Any]
    activation: dict[str, Any]
    digest: str

    @property
    def info(self) -> StorePathInfo:
        """What the record says of its store path (no sizes: a record has none)."""
        return StorePathInfo(name=self.name, key=self.key, engine=self.engine, version=self.version,
                             variant=self.variant, content_hash=self.content_hash, inputs=self.inputs)

    def body(self) -> dict[str, Any]:
        """The fields the digest covers, as written."""
        return {
            "format": FORMAT, "profile": self.profile, "generation": self.generation, "name": self.name,
            "key": self.key, "content_hash": self.content_hash, "engine": self.engine, "version": self.version,
            "variant": self.variant, "inputs": self.inputs, "requirements": list(self.requirements),
            "lock_format": self.lock_format, "lock": self.lock,
            "lock_blake3": blake3(self.lock.encode()).hexdigest() if self.lock is not None else None,
            "created": self.created, "by": self.by, "activation": self.activation,
        }


def who() -> dict[str, Any]:
    """Who is changing the profile: uid and user name, and the operator behind sudo when there is one
    (informative: SUDO_USER is what sudo says, not proof)."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    out: dict[str, Any] = {"uid": os.getuid(), "user": user[:64]}
    sudo = os.environ.get("SUDO_USER")
    if sudo:
        out["sudo_user"] = sudo[:64]
    return out


# --- file names ------------------------------------------------------------------------------

def temporary_pattern(profile: str) -> re.Pattern[str]:
    """Temporary files a killed writer of this profile's records left (removed under its lock)."""
    p = re.escape(profile)
    return re.compile(rf"\.\.{p}(-\d+\.record|\.history|\.summary)\.tmp-\d+(-[0-9a-f]{{16}})?")


def numbers(layout: Layout, profile: str) -> list[int]:
    """Generation numbers that have a record file, ascending."""
    pat = re.compile(rf"\.{re.escape(profile)}-(\d{{1,10}})\.record")
    out = []
    for entry in os.scandir(layout.profiles) if layout.profiles.is_dir() else []:
        m = pat.fullmatch(entry.name)
        if m and 1 <= int(m.group(1)) <= 10**9:
            out.append(int(m.group(1)))
    return sorted(out)


# --- making a record -------------------------------------------------------------------------

@dataclass(frozen=True)
class Described:
    """What a new record says of its store path (`describe`): the path, and the lock proved."""

    info: StorePathInfo
    requirements: tuple[str, ...]
    lock_format: str | None
    lock: str | None


def describe(layout: Layout, row: RegisteredPath) -> Described:
    """What a record says of the registered store path `row` (an index row): its identity from the
    index, its inputs, requirements and lock from its manifest. The lock is taken only when it is
    proved to be the one installed: the contents listing hashes to the content hash the index
    records, and the manifest's lock text hashes to the listed digest of the lock file (as verify
    --repair proves it). Without that proof the record has no lock (the generation can then come
    back only from a binary cache)."""
    name = row.name
    env = layout.path_of(name)
    from llmgw_store.build.lockproof import proved_lock

    lock = lock_format = None
    requirements: list[str] = []
    try:
        doc = manifest.read(env)
        requirements = [r for r in doc.get("requirements", []) if isinstance(r, str)][:_LIST_MAX]
        lock, lock_format = proved_lock(env, name, row.content_hash)  # the one proof (build/lockproof.py)
        proofs.keep(layout.var, name, row.content_hash, lock_format, lock)  # proved once: kept for switches
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IntegrityError):
        pass
    if lock is None:
        say(f"{name}: no lock proved by its manifest; its record cannot rebuild it (a binary cache still can)")
    return Described(StorePathInfo.from_row(row), tuple(requirements), lock_format, lock)


def make(profile: str, number: int, described: Described, activation: dict[str, Any],
         created: str | None = None, by: dict[str, Any] | None = None) -> Record:
    info = described.info
    w = info.whole("a generation record")  # from the index row: every field known
    return Record(
        profile=profile, generation=number, name=info.name, key=info.key, content_hash=info.content_hash,
        engine=w.engine, version=w.version, variant=w.variant, inputs=info.inputs,
        requirements=described.requirements, lock_format=described.lock_format, lock=described.lock,
        created=created or _now(), by=by or who(), activation=activation, digest="",
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def with_activation(rec: Record, activation: dict[str, Any]) -> Record:
    from dataclasses import replace

    return replace(rec, activation=activation)


# --- writing ---------------------------------------------------------------------------------

def _dir_fd(layout: Layout) -> int:
    """profiles/, which Store.open has checked (a real directory of ours), opened without following
    a link: every record is read and written relative to this descriptor."""
    return os.open(layout.profiles, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _write_atomically(layout: Layout, filename: str, data: bytes) -> None:
    """tmp + fsync + rename + fsync(dir) (system/files.write_atomic): the file is the old one or the
    new one, whole, even after a crash or a power cut once this returns; 0600, since a record and
    the history carry check output, which may hold tokens. Called under the profile's lock."""
    dfd = _dir_fd(layout)
    try:
        files.write_atomic(filename, data, dir_fd=dfd, mode=FILE_MODE)
    finally:
        os.close(dfd)


def secret(layout: Layout) -> bytes:
    """The store's records key: 32 random bytes in ROOT/var/records.key, made on first use
    (system/files.private_secret: 0600, whole or absent, never through a link), as the bytecode
    secret is. A key file that is not the store owner's private 32-byte regular file with one link
    is refused (IntegrityError): no record is then written or trusted."""
    path = layout.records_key
    try:
        return files.private_secret(path, SECRET_BYTES)
    except files.FileRefused:
        raise IntegrityError(f"the records key {path} is not the store owner's private {SECRET_BYTES}-byte "
                             "file; no record is trusted until it is removed (records written with it are "
                             "then refused)") from None
    except OSError as exc:
        raise IntegrityError(f"cannot make or read the records key {path} ({exc.strerror}); records cannot be "
                             "written or checked") from None


def seal(key: bytes, body: dict[str, Any]) -> str:
    """The record's digest: blake3 keyed with the store's records key over its canonical body."""
    return blake3(canonical_json(body), key=key).hexdigest()


def write(layout: Layout, rec: Record) -> Record:
    """Write (or replace) generation `rec.generation`'s record; returns it with its digest."""
    body = rec.body()
    digest = seal(secret(layout), body)
    doc = {**body, "digest": digest}
    _write_atomically(layout, record_file(rec.profile, rec.generation),
                      json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")
    _note(layout, rec.profile, rec.generation, body)
    from dataclasses import replace

    return replace(rec, digest=digest)


def remove(layout: Layout, profile: str, number: int) -> bool:
    """Remove generation `number`'s record (under the profile's lock); whether there was one."""
    dfd = _dir_fd(layout)
    try:
        os.unlink(record_file(profile, number), dir_fd=dfd)
        os.fsync(dfd)
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)
    _note(layout, profile, number, None)
    return True


def _note(layout: Layout, profile: str, number: int, body: dict[str, Any] | None) -> None:
    refresh_summary(layout, profile)


def refresh_summary(layout: Layout, profile: str) -> None:
    """The profile's summary follows its records (roots/summary.py), under the profile's lock:
    every entry whose record changed (the one just written, or any changed behind its back: a
    copied or restored store has other inodes) taken again, the summary made if there was none."""
    summarised(layout, profile, numbers(layout, profile), write=True)


def prune(layout: Layout, profile: str, keep: int, hot: set[int] | list[int] | dict[int, Any]) -> list[int]:
    """Remove the oldest records of cold generations (no link in `hot`) until at most `keep` remain,
    counting hot ones, which are never removed. Returns the numbers removed."""
    have = numbers(layout, profile)
    excess = len(have) - max(keep, 0)
    removed = []
    for n in have:
        if excess <= 0:
            break
        if n in hot:
            continue
        if remove(layout, profile, n):
            removed.append(n)
            excess -= 1
    if removed:
        say(f"profile {profile}: dropped the records of cold generation(s) {', '.join(map(str, removed))} "
            f"(keeping {keep})")
    return removed


# --- reading (outside input: every byte checked before use) ----------------------------------

def _read_bounded(layout: Layout, filename: str, limit: int, dir_fd: int | None = None) -> bytes | None:
    """The file's bytes, or None when it does not exist (system/files.read_bounded): never through a
    link, never a FIFO or a device, never another user's file, never one others may write or with
    a second hard link, never more than `limit` bytes; IntegrityError otherwise. A record or
    history an older llmgw-store left readable by all (0644) is closed up to 0600 first.
    `dir_fd`: profiles/ opened already (by _dir_fd), for a caller reading many records."""
    dfd = _dir_fd(layout) if dir_fd is None else dir_fd
    try:
        return files.read_bounded(filename, limit, dir_fd=dfd, owner=os.geteuid(), deny_mode=0o022, one_link=True,
                                  tighten=0o044)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if isinstance(exc, files.FileRefused) and "link" not in exc.reason and "regular" not in exc.reason:
            raise IntegrityError(f"{layout.profiles / filename} {exc.reason}; it is not used: remove it") from None
        why = exc.reason if isinstance(exc, files.FileRefused) else exc.strerror
        raise IntegrityError(f"{layout.profiles / filename} cannot be read as a record ({why}); it is not a plain "
                             "file: remove it") from None
    finally:
        if dir_fd is None:
            os.close(dfd)


def load(layout: Layout, profile: str, number: int, *, key: bytes | None = None,
         dir_fd: int | None = None) -> Record | None:
    """Generation `number`'s record, checked; None when there is none. IntegrityError naming the file
    and what is wrong when it is not a record this store wrote, or was changed since. `key` (the
    records key, `secret`) and `dir_fd` (profiles/, `_dir_fd`): read once by a caller loading many."""
    check_profile(profile)
    check_generation(number)
    raw = _read_bounded(layout, record_file(profile, number), RECORD_MAX, dir_fd)
    if raw is None:
        return None
    try:
        return _checked(json.loads(raw.decode()), profile, number, secret(layout) if key is None else key)
    except _Bad as exc:
        where = layout.profiles / record_file(profile, number)
        raise IntegrityError(f"{where} is not a valid generation record ({exc}); it is not used: restore it from "
                             f"a backup or forget it (`llmgw-store generations {profile} --forget {number}`)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        where = layout.profiles / record_file(profile, number)
        raise IntegrityError(f"{where} is not a valid generation record (not JSON: {str(exc)[:100]}); it is not "
                             f"used: forget it (`llmgw-store generations {profile} --forget {number}`)") from None


class _Bad(Exception):
    pass


def _short(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > _SHORT:
        raise _Bad(f"{what} must be a string of at most {_SHORT} characters")
    return value


def _checked(doc: Any, profile: str, number: int, secret_key: bytes) -> Record:
    if not isinstance(doc, dict):
        raise _Bad("not a JSON object")
    # First, before any field is used: the keyed digest proves this store wrote these bytes.
    digest = doc.get("digest")
    body = {k: v for k, v in doc.items() if k != "digest"}
    if not isinstance(digest, str) or not compare_digest(seal(secret_key, body), digest):
        raise _Bad("its digest does not match its contents under the store's records key (it was changed, "
                   "or not written by this store)")
    unknown = set(doc) - set(_FIELDS)
    if unknown:
        raise _Bad(f"unknown field {min(unknown)[:40]!r}")
    for field, types in _FIELDS.items():
        if field not in doc:
            raise _Bad(f"missing field {field!r}")
        if not isinstance(doc[field], types) or isinstance(doc[field], bool):
            raise _Bad(f"field {field!r} has the wrong type")
    if doc["format"] != FORMAT:
        raise _Bad(f"format {doc['format']}, this llmgw-store reads {FORMAT}")
    if doc["profile"] != profile or doc["generation"] != number:
        raise _Bad(f"it names profile {doc['profile'][:40]!r} generation {doc['generation']}, not {profile} {number}")
    name, key = doc["name"], doc["key"]
    if not is_store_name(name):
        raise _Bad(f"{name[:80]!r} is not a store path name")
    if not KEY_RE.match(key) or not name.startswith(key + "-"):
        raise _Bad("its key is not the key of its store path name")
    for field in ("engine", "version", "variant"):
        _short(doc[field], field)
    if path_name(key, doc["engine"], doc["version"], doc["variant"]) != name:
        raise _Bad("its engine, version and variant do not make its store path name")
    if any(f in doc["inputs"] and doc["inputs"][f] != doc[f] for f in ("engine", "version", "variant")):
        raise _Bad("its engine, version and variant are not those of its inputs")
    if not HEX64.fullmatch(doc["content_hash"]):
        raise _Bad("its content hash is not 64 hex digits")
    if store_key(doc["inputs"]) != key:
        raise _Bad("its inputs do not hash to its key (they were changed)")
    reqs = doc["requirements"]
    if len(reqs) > _LIST_MAX or not all(isinstance(r, str) and len(r) <= 4096 for r in reqs):
        raise _Bad("requirements must be a list of strings")
    lock, fmt, lock_digest = doc["lock"], doc["lock_format"], doc["lock_blake3"]
    if (lock is None) != (fmt is None) or (lock is None) != (lock_digest is None):
        raise _Bad("lock, lock_format and lock_blake3 go together")
    if lock is not None:
        if fmt not in LOCK_FORMATS:
            raise _Bad(f"lock_format must be one of {', '.join(LOCK_FORMATS)}")
        if blake3(lock.encode()).hexdigest() != lock_digest:
            raise _Bad("its lock does not hash to its lock digest (the lock was changed)")
        _check_lock_sources(lock, fmt)
    _short(doc["created"], "created")
    by = doc["by"]
    if not isinstance(by.get("uid"), int) or any(not isinstance(v, (str, int)) or len(str(v)) > 64 for v in by.values()) \
            or len(by) > 8:
        raise _Bad("'by' must say a uid and a user")
    _check_activation(doc["activation"])
    return Record(
        profile=profile, generation=number, name=name, key=key, content_hash=doc["content_hash"],
        engine=doc["engine"], version=doc["version"], variant=doc["variant"], inputs=doc["inputs"],
        requirements=tuple(reqs), lock_format=fmt, lock=lock, created=doc["created"], by=by,
        activation=doc["activation"], digest=doc["digest"],
    )


_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}(\[[A-Za-z0-9._,-]{1,200}\])?==[A-Za-z0-9.+!_-]{1,100}"
                  r"( ?;[^@\\]{1,500})?")
_HASH = re.compile(r"--hash=(sha256|sha384|sha512):[0-9a-f]{64,128}")
_LOCK_LINES_MAX = 200_000


def _check_lock_sources(lock: str, fmt: str) -> None:
    """A recorded lock may install only from the recorded index (see the module docstring)."""
    if fmt == "pylock.toml":
        import tomllib

        try:
            doc = tomllib.loads(lock)
        except ValueError:
            raise _Bad("its pylock.toml is not TOML") from None
        packages = doc.get("packages", [])
        if not isinstance(packages, list) or len(packages) > _LIST_MAX:
            raise _Bad("its pylock.toml packages must be a list")
        for p in packages:
            if not isinstance(p, dict) or any(k in p for k in ("vcs", "directory", "archive")):
                raise _Bad("its lock names a package not from an index (vcs, directory or archive source)")
            files = list(p.get("wheels", [])) if isinstance(p.get("wheels", []), list) else [None]
            if "sdist" in p:
                files.append(p["sdist"])
            for f in files:
                url = f.get("url") if isinstance(f, dict) else None
                if not isinstance(f, dict) or not isinstance(url, str) or "path" in f or not re.match(r"https?://[^/@\s]+/", url):
                    raise _Bad("its lock names a file that is not an http(s) URL of an index")
        return
    lines = lock.replace("\\\n", " ").splitlines()
    if len(lines) > _LOCK_LINES_MAX:
        raise _Bad("its lock is too long")
    for line in lines:
        text = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not text:
            continue
        words = text.split()
        reqs = [w for w in words if not _HASH.fullmatch(w)]
        if not reqs or reqs[0].startswith("-") or not _PIN.fullmatch(" ".join(reqs)):
            raise _Bad(f"its lock has a line that is not a pinned requirement with hashes from the index "
                       f"({shown_line(text)})")


def shown_line(text: str) -> str:
    return repr(text[:60])


def _check_activation(act: dict[str, Any]) -> None:
    """{kind, check: {argv, mode, result, exit, timed_out, seconds, tail} | None, rolled_back_to, at}."""
    if len(act) > 16:
        raise _Bad("activation has too many fields")
    for k, v in act.items():
        if not isinstance(k, str) or len(k) > 40:
            raise _Bad("activation field names are short strings")
        if k == "check" and v is not None:
            if not isinstance(v, dict) or len(v) > 16:
                raise _Bad("activation.check must be an object")
            argv = v.get("argv")
            if not isinstance(argv, list) or len(argv) > 256 or not all(isinstance(a, str) and len(a) <= 4096 for a in argv):
                raise _Bad("activation.check.argv must be a list of strings")
            tail = v.get("tail", "")
            if not isinstance(tail, str) or len(tail) > 8192:
                raise _Bad("activation.check.tail must be a string of at most 8192 characters")
        elif k != "check" and not (v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= _SHORT)):
            raise _Bad(f"activation.{k} must be a number or a short string")


def load_all(layout: Layout, profile: str, which: list[int] | None = None) -> tuple[dict[int, Record], dict[int, str]]:
    """Every record of the profile (or those numbered `which`, as `numbers` lists them): (number ->
    record, number -> why it was refused). The key is read and profiles/ opened once for all."""
    good: dict[int, Record] = {}
    bad: dict[int, str] = {}
    which = numbers(layout, profile) if which is None else which
    if not which:
        return good, bad
    try:
        key = secret(layout)
    except IntegrityError as exc:
        return good, {n: str(exc) for n in which}
    dfd = _dir_fd(layout)
    try:
        for n in which:
            try:
                rec = load(layout, profile, n, key=key, dir_fd=dfd)
            except IntegrityError as exc:
                bad[n] = str(exc)
                continue
            if rec is not None:
                good[n] = rec
    finally:
        os.close(dfd)
    return good, bad


@dataclass(frozen=True)
class Shown:
    """What `generations` shows of one checked record (roots/summary.py's entry)."""

    name: str
    created: str
    engine: str
    version: str
    variant: str
    rebuildable: bool
    check: Any
    rolled_back_to: Any


def summarised(layout: Layout, profile: str, which: list[int], *,
               write: bool = False) -> tuple[dict[int, Shown], dict[int, str]]:
    """load_all for a listing: what each record numbered `which` shows (number -> Shown, number ->
    why it was refused), from the profile's summary where its entry has the record file's stamp,
    else from the record read and checked in full (records.load). With `write` (a change of the
    profile, under its lock) the summary is written again when it differs from what was read; a
    listing only looks, and writes nothing (roots/summary.py)."""
    good: dict[int, Shown] = {}
    bad: dict[int, str] = {}
    if not which:
        return good, bad
    try:
        key = secret(layout)
    except IntegrityError as exc:
        return good, {n: str(exc) for n in which}
    dfd = _dir_fd(layout)
    try:
        known = summary.read(dfd, profile, key)
        fresh: dict[int, dict] = {}
        stale = known is None
        for n in which:
            filename = record_file(profile, n)
            before = summary.record_stamp(dfd, filename)
            entry = (known or {}).get(n)
            if entry is None or before is None or entry["stamp"] != before:
                try:
                    rec = load(layout, profile, n, key=key, dir_fd=dfd)
                except IntegrityError as exc:
                    bad[n] = str(exc)
                    continue
                if rec is None:
                    continue
                entry = summary.entry_of(rec.body())
                if before is not None and summary.record_stamp(dfd, filename) == before:
                    fresh[n] = {**entry, "stamp": before}  # unchanged while it was read
                    stale = True
            else:
                fresh[n] = entry
            good[n] = Shown(**{f: entry[f] for f in Shown.__dataclass_fields__})
        if write and (stale or set(known or ()) != set(fresh)):
            summary.write(dfd, profile, key, fresh)
    finally:
        os.close(dfd)
    return good, bad


def recorded_keys(layout: Layout) -> dict[str, str]:
    """store key -> `PROFILE@N`, for the record of every generation of every profile (hot or cold,
    as many as `keep_records` leaves): what a rollback may bring back, so what `push-roots`
    publishes for the cache gc to keep. A record that fails its checks is left out (no rollback
    would use it)."""
    out: dict[str, str] = {}
    if not layout.profiles.is_dir():
        return out
    for entry in sorted(os.scandir(layout.profiles), key=lambda e: e.name):
        name = entry.name
        if name.startswith(".") or is_generation_link(name) or not entry.is_symlink():
            continue
        good, _ = load_all(layout, name)
        for n, rec in good.items():
            out.setdefault(rec.key, f"{name}@{n}")
    return out


# --- history ---------------------------------------------------------------------------------
# One JSON object a line, appended (O_APPEND, under the profile's lock) and fdatasync-ed: a switch
# writes one short line, not the whole history. When the file passes HISTORY_ROTATE_BYTES it is
# rewritten atomically with its last HISTORY_MAX events. A line cut short by a crash is skipped
# when read.

def history(layout: Layout, profile: str, last: int = HISTORY_MAX) -> list[dict[str, Any]]:
    """The profile's recorded events, oldest first (the `last` ones). The file is informative: what
    cannot be read is reported and skipped (never used for any decision)."""
    try:
        raw = _read_bounded(layout, history_file(profile), HISTORY_MAX_BYTES)
    except IntegrityError as exc:
        say(f"ignoring the history of {profile}: {exc}")
        return []
    if raw is None:
        return []
    events = []
    last = min(last, HISTORY_MAX)
    for line in raw.split(b"\n")[-(last + 1):]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and len(event) <= 16:
            events.append(event)
    return events[-last:]


def add_event(layout: Layout, profile: str, event: str, **fields: Any) -> dict[str, Any]:
    """Append an event (under the profile's lock): `event` with `fields`, when and who."""
    entry = {"event": event, "at": now_iso(), "by": who(), **fields}
    line = json.dumps(entry, sort_keys=True).encode() + b"\n"
    dfd = _dir_fd(layout)
    try:
        fd = os.open(history_file(profile), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, FILE_MODE, dir_fd=dfd)
    except OSError as exc:
        os.close(dfd)
        say(f"cannot record the event in {layout.profiles / history_file(profile)}: {exc.strerror}")
        return entry
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
            say(f"not recording the event: {layout.profiles / history_file(profile)} is not a plain file of ours")
            return entry
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)  # an older llmgw-store made it 0644: check output is the owner's
        size = st.st_size
        if size + len(line) > HISTORY_ROTATE_BYTES:
            lines = [json.dumps(e, sort_keys=True).encode() + b"\n" for e in history(layout, profile)]
            lines = lines[-(HISTORY_MAX - 1):] + [line]
            while len(lines) > 1 and sum(map(len, lines)) > HISTORY_ROTATE_BYTES // 2:
                lines.pop(0)
            _write_atomically(layout, history_file(profile), b"".join(lines))
        else:
            os.write(fd, line)
            os.fdatasync(fd)
    finally:
        os.close(fd)
        os.close(dfd)
    return entry


def present(layout: Layout, name: str) -> bool:
    """Whether store path `name` is on disk (hot)."""
    return os.path.isdir(layout.path_of(name))


def remove_temporaries(layout: Layout, profile: str) -> None:
    pat = temporary_pattern(profile)
    dfd = _dir_fd(layout)
    try:
        for entry in os.scandir(layout.profiles):
            if pat.fullmatch(entry.name):
                try:
                    os.unlink(entry.name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
    finally:
        os.close(dfd)

