"""Which entries of uv's cache a build installed from, recorded so that gc keeps them while the
path lives (a repair or a cold rollback reinstalls from them offline, with `uv --offline`), and
uv's own cache lock.

uv unpacks every wheel once into `CACHE/archive-v0/<id>/` (the wheel's files and its
`<name>-<version>.dist-info/`), and points at it from its wheel buckets (`wheels-v*/…/<version>-
<tag>` links, `.http` pointers). In the store's own cache that bucket is the wheel home
(`archive-v0` is the store's symlink to `store/.wheels`, see wheelhome.py): a build that links from
it knows its entries by inode. An environment installed with `--link-mode copy` (a private cache,
an old store) shares no inode with it, so the archive is found by content instead: an archive is
the source of an installed distribution when it holds a dist-info of the same name whose METADATA
and WHEEL are the same bytes. That is independent of the index, the bucket layout and uv's
pointer formats.

Everything read here is untrusted (the cache is writable by uv and by whoever is the store's
user): names are matched with re.fullmatch before use, nothing is followed through a symlink,
reads are bounded (MAX_META bytes a file, MAX_ARCHIVES entries listed).
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw_store.base.errors import LockTimeout
from llmgw_store.system.files import read_bounded

if TYPE_CHECKING:
    from llmgw_store.core.local_store import Store

CACHE = "uv"
ARCHIVE_BUCKET = "archive-v0"
ARCHIVE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
DIST_INFO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}\.dist-info")
MAX_META = 1 << 20
MAX_ARCHIVES = 1 << 20


def _read_small(path: Path) -> bytes | None:
    """At most MAX_META bytes of a regular file, never through a link (system/files); None otherwise."""
    try:
        return read_bounded(path, MAX_META)
    except OSError:  # absent, or refused (FileRefused is an OSError)
        return None


def _fingerprint(dist_info: Path) -> tuple[bytes | None, bytes | None]:
    return _read_small(dist_info / "METADATA"), _read_small(dist_info / "WHEEL")


def installed(env: Path) -> dict[str, tuple[bytes | None, bytes | None]]:
    """dist-info name -> (METADATA, WHEEL) of what is installed in `env`'s site-packages."""
    out = {}
    lib = env / "lib"
    for py in os.scandir(lib) if lib.is_dir() else []:
        site = Path(py.path) / "site-packages"
        if not py.is_dir(follow_symlinks=False) or not site.is_dir() or site.is_symlink():
            continue
        for e in os.scandir(site):
            if DIST_INFO_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                out[e.name] = _fingerprint(Path(e.path))
    return out


def bucket_dir(uv_cache: Path) -> Path | None:
    """The real directory of uv's archive bucket: `archive-v0` itself, or the wheel home when it is
    the store's link to it (the one target the store writes, `../../store/.wheels`; see
    wheelhome.py). None for a link to anywhere else: never followed."""
    bucket = uv_cache / ARCHIVE_BUCKET
    try:
        target = os.readlink(bucket)
    except OSError:
        return bucket  # a directory (an old store, a private cache), or nothing yet
    if target != WHEEL_HOME_LINK:
        return None
    return Path(os.path.normpath(uv_cache / target))


WHEEL_HOME_LINK = "../../store/.wheels"  # cache/uv/archive-v0 -> ROOT/store/.wheels


def archives(uv_cache: Path) -> list[os.DirEntry]:
    """The well-named, real directories of uv's archive bucket (at most MAX_ARCHIVES)."""
    bucket = bucket_dir(uv_cache)
    out: list[os.DirEntry] = []
    if bucket is None:
        return out
    try:
        with os.scandir(bucket) as it:
            for i, e in enumerate(it):
                if i >= MAX_ARCHIVES:
                    break
                if ARCHIVE_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                    out.append(e)
    except (FileNotFoundError, NotADirectoryError):
        pass
    return out


def sources(env: Path, uv_cache: Path) -> set[str]:
    """Archive ids of `uv_cache` whose wheel is installed in `env` (see the module docstring)."""
    wanted = installed(env)
    found: set[str] = set()
    if not wanted:
        return found
    for a in archives(uv_cache):
        try:
            names = [n for n in os.listdir(a.path) if n in wanted]
        except OSError:
            continue
        for n in names:
            if wanted[n] != (None, None) and _fingerprint(Path(a.path) / n) == wanted[n]:
                found.add(a.name)
    return found


def record(store: Store, name: str, env: Path, private_cache: Path | None,
           linked: set[str] | None = None) -> None:
    """Record the uv archives `env` (the `.partial` of store path `name`) was installed from:
    `linked`, the wheel home entries it links (wheelhome.adopt knows them by inode), else found by
    content. A build with a private cache (a repair) records nothing: that cache is deleted after it."""
    if private_cache is not None:
        return
    used = linked if linked is not None else sources(env, store.layout.uv_cache)
    if used:
        store.index.record_cache_uses(name, CACHE, used)


@contextmanager
def uv_cache_lock(uv_cache: Path, timeout: float) -> Iterator[None]:
    """uv's own lock on its cache (`.lock`, flock), exclusive: every uv command holds it shared for
    as long as it runs, so while this is held no uv process reads or links from the cache."""
    fd = os.open(uv_cache / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"uv's cache lock {uv_cache / '.lock'} was held for {timeout:g}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
