"""The build memo: what a cache-hit `build` needs, readable before the CLI framework loads.

    ROOT/var/memo/<blake2b of the memo key>      one small text file per (recipe bytes, options)

The memo key is everything a build's store key follows from that can be known without the index:
the recipe's bytes and absolute path, every build option that enters the key (KEY_OPTIONS: the
parameters cli/spec.py declares with hit="key", which tests/cli/test_cli_spec.py keeps equal), this
machine's platform facts and the key schema. The
facts the key takes from the index (the uv version, the interpreter, the latest version, the
publication time) are fixed by the files they were learnt from: the entry lists those files (the uv
binary, the interpreter) with their inode, size and mtime, and is stale when one differs; a version
that came from "latest" gives the entry an expiry (the latest memo's TTL). So an entry is a true
statement "these inputs give this store path" until one of those changes, and the fast path
(cli/fast.py) prints the path only if it is still in store/ with its manifest, and only against the
index the entry was written against: the index's epoch (a random number SQLite keeps in the
database header, made with the file, see core/index.py) is in the entry. An index file replaced in
place by another one (a backup copied back over it, a rebuilt one) has another epoch, though it
keeps the inode, and the entry is then no answer.

The builder writes an entry after each successful build or hit (`write`); `read` is the fast path's.
An entry is outside input to the reader: the file must be a regular file of the running user's,
mode 0600, no larger than MAX_BYTES, in a var/ and memo/ that are the user's and closed to others,
never reached through a link; ROOT and var/ pass the store's own directory check (core/dirs.py, as
the full command's); every field is checked. Anything else is a miss, never an error.
Writes are a new 0600 file renamed over the entry (atomic in one directory): a reader sees the old
entry or the new one. Only os, stat, blake2b and core/dirs are imported: this module is on the hot path.
"""

from __future__ import annotations

import os
import stat
import sys

from llmgw_store.core.dirs import is_store_name, open_var, private_dir, read_private, replace_private
from llmgw_store.core.locations import DB, MEMO, at, leaf

try:  # hashlib would load OpenSSL first (5 ms here); blake2b is built in
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter built without it
    from hashlib import blake2b

# Must equal keys.SCHEMA_VERSION (tests/cli/test_fastpath.py checks): a new key schema gives new memo
# keys, so no entry written for the old one is ever read. Imported keys would load blake3 and json.
KEY_SCHEMA = 1
FORMAT = "llmgw-store build memo 1"
MAX_BYTES = 16384
MAX_RECIPE_BYTES = 1 << 20  # a larger recipe file is built, never memoised
MAX_DEPS = 8
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# What the result document holds besides path, how, seconds and cache_hit (builder.BuildResult).
FIELDS = ("name", "key", "engine", "version", "variant", "as_of", "uv", "python")
VALUE_MAX = 512


def host_facts() -> str:
    """The platform facts the key holds (host.platform_facts), from os alone."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    return f"{sys.platform}|{os.uname().machine}|{libc}"


# The build options that enter the memo key, by their BuildOptions (and click parameter) names.
KEY_OPTIONS = ("version", "variant", "as_of", "index_url", "uv", "python_preference")


def memo_key(recipe_path: str, recipe_bytes: bytes, options: dict[str, object]) -> str:
    """The entry's file name: blake2b-256 over every input (`options`: KEY_OPTIONS' values), each
    length-prefixed (no two collide). The index URL enters without its userinfo, as it enters the
    store key (app/credentials.py)."""
    from llmgw_store.app.credentials import public_url

    h = blake2b(FORMAT.encode(), digest_size=32)
    index_url, uv = options["index_url"], options["uv"]
    assert uv is None or isinstance(uv, str | os.PathLike), "--uv is a path or nothing (BuildOptions.uv)"
    normal = {**options, "index_url": public_url(str(index_url)).rstrip("/"),
              "uv": None if uv is None else os.path.abspath(os.fspath(uv))}
    for part in (str(KEY_SCHEMA), host_facts(), os.path.abspath(recipe_path), blake2b(recipe_bytes).hexdigest(),
                 *(normal[k] for k in KEY_OPTIONS)):
        b = b"\xff" if part is None else str(part).encode("utf-8", "surrogateescape")
        h.update(len(b).to_bytes(4, "big") + b)
    return h.hexdigest()


def file_stamp(path: str) -> str | None:
    """index.file_stamp, repeated here without pathlib: inode, size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


SQLITE_MAGIC = b"SQLite format 3\x00"


def index_epoch(root: str) -> str | None:
    """Which index ROOT/var/db.sqlite is: its epoch, a random number made with the file and kept in
    the SQLite header's application id (core/index.py), read from the file's first 100 bytes
    without loading SQLite. None when there is no index, or it has no epoch (yet: one set on an
    older index reaches the header at SQLite's next checkpoint); no entry is written or read then."""
    try:
        fd = os.open(at(root, DB), FILE_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        header = os.read(fd, 100)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return None
    epoch = int.from_bytes(header[68:72], "big")
    return f"epoch={epoch}" if epoch else None



def read(root: str, digest: str) -> dict[str, str] | None:
    """The entry `digest` under ROOT, checked, if it is still true: the files it lists unchanged, not
    expired, its store path in store/ with a manifest. None for anything else."""
    var_fd = open_var(root)
    if var_fd is None:
        return None
    try:
        memo_fd = private_dir(leaf(MEMO), var_fd, False)
    finally:
        os.close(var_fd)
    if memo_fd is None:
        return None
    try:
        data = read_private(memo_fd, digest, MAX_BYTES)
    finally:
        os.close(memo_fd)
    if data is None:
        return None
    entry = parse(data)
    if entry is None or not _still_true(root, entry):
        return None
    return entry


def parse(data: bytes) -> dict[str, str] | None:
    """The fields of an entry's bytes, or None when they are not exactly an entry."""
    if len(data) > MAX_BYTES:
        return None
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    if len(lines) > len(FIELDS) + MAX_DEPS + 4 or lines[0] != FORMAT or lines[-1] != "":
        return None
    entry: dict[str, str] = {}
    deps: list[str] = []
    for line in lines[1:-1]:
        field, sep, value = line.partition("=")
        if not sep or not value or len(value) > VALUE_MAX or not value.isprintable():
            return None
        if field == "dep":
            deps.append(value)
        elif field in FIELDS or field in ("expires", "index"):
            if field in entry:
                return None
            entry[field] = value
        else:
            return None
    if set(entry) != set(FIELDS) | {"expires", "index"} or len(deps) > MAX_DEPS:
        return None
    if not is_store_name(entry["name"]) or entry["key"] != entry["name"][:32]:
        return None
    try:
        float(entry["expires"])
    except ValueError:
        return None
    for dep in deps:
        stamp, space, path = dep.partition(" ")
        if not space or not stamp or not path.startswith("/"):
            return None
    entry["deps"] = "\n".join(deps)
    return entry


def _still_true(root: str, entry: dict[str, str]) -> bool:
    import time

    expires = float(entry["expires"])
    if expires and time.time() >= expires:
        return False
    for dep in filter(None, entry["deps"].split("\n")):
        stamp, _, path = dep.partition(" ")
        if file_stamp(path) != stamp:
            return False
    if index_epoch(root) != entry["index"]:
        return False  # another index file (lost, rebuilt, copied back in place): the slow path answers
    return store_path_present(root, entry["name"])


def store_path_present(root: str, name: str) -> bool:
    """ROOT/store/<name> is a directory (not a link) holding its manifest: it was renamed into place
    complete, and gc has not moved it out (gc renames a dead path to var/trash before deleting it)."""
    try:
        store_fd = os.open(os.path.join(root, "store"), DIR_FLAGS)
    except OSError:
        return False
    try:
        st = os.fstat(store_fd)
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return False
        if not stat.S_ISDIR(os.stat(name, dir_fd=store_fd, follow_symlinks=False).st_mode):
            return False
        return stat.S_ISREG(os.stat(f"{name}/.llmgw/manifest.json", dir_fd=store_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(store_fd)


def write(root: str, digest: str, fields: dict[str, str], deps: list[str], expires: float = 0.0) -> bool:
    """Record that the memo key `digest` gives the build result `fields`, while the files `deps` keep
    their stamps and until `expires` (0: no expiry). Best effort: False when it could not be written
    (the next hit then takes the slow path, which is still correct)."""
    lines = [FORMAT]
    lines += [f"{f}={fields[f]}" for f in FIELDS]
    lines.append(f"expires={expires!r}")
    for path in deps[:MAX_DEPS]:
        stamp = file_stamp(path)
        if stamp is None:
            return False
        lines.append(f"dep={stamp} {os.path.abspath(path)}")
    index = index_epoch(root)
    if index is None:
        return False
    lines.append(f"index={index}")
    data = ("\n".join(lines) + "\n").encode()
    if parse(data) is None or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        return False  # a value with a newline, an unprintable character or too long: no entry
    var_fd = open_var(root, create=False)
    if var_fd is None:
        return False
    try:
        memo_fd = private_dir(leaf(MEMO), var_fd, True)
    finally:
        os.close(var_fd)
    if memo_fd is None:
        return False
    try:
        return replace_private(memo_fd, digest, data)
    finally:
        os.close(memo_fd)


def forget(root: str, digest: str) -> None:
    """Remove an entry that is no longer true (best effort)."""
    var_fd = open_var(root)
    if var_fd is None:
        return
    try:
        memo_fd = private_dir(leaf(MEMO), var_fd, False)
        if memo_fd is not None:
            try:
                os.unlink(digest, dir_fd=memo_fd)
            except OSError:
                pass
            finally:
                os.close(memo_fd)
    finally:
        os.close(var_fd)
