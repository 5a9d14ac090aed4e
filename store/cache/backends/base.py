"""What every backend shares: the `Backend` protocol, object names, listings, and the one read
loop (caps, retries, resumption) the streaming backends run their bytes through."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from llmgw_store.base.errors import IntegrityError, NetworkError, UsageError
from llmgw_store.cache.backends.retry import RetryPolicy, Transient, Watch, is_document, run

CHUNK = 1 << 20
FOLDERS = ("blobs", "roots", "pending", "gc", "releases")
OBJECT_NAME_RE = re.compile(r"(?:(?:blobs|roots|pending|gc|releases)/)?[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")
MAX_LISTED = 10_000_000  # entries one listing may return: past it the cache is refused
# The only names a listing returns, per folder: the names this code writes. Whatever else a cache
# holds (a planted file, another tool's) is never listed, so never deleted by a cache gc.
_KEY = "[0123456789abcdfghijklmnpqrsvwxyz]{32}"
LISTED_NAME_RE = {
    "": re.compile(rf"{_KEY}\.(?:json|tar\.zst)"),
    "blobs": re.compile(r"[0-9a-f]{64}"),
    "pending": re.compile(rf"{_KEY}-[0-9]{{1,10}}-[0-9a-f]{{8}}\.json"),
    "gc": re.compile(r"[0-9a-f]{16}\.json"),
    "roots": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\.json"),
    "releases": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.json"),  # cache/releases.py
}


@dataclass(frozen=True)
class Listed:
    name: str  # the object's name, folder included
    size: int
    mtime: float  # seconds since the epoch, when it was last written
    regular: bool = True  # False: a link or another non-file under an object's name (file:// only)


class Opened(NamedTuple):
    """An object opened for reading from byte `start`: its whole length (None when the server did
    not say) and read(n) -> at most n bytes, b"" at its end."""

    total: int | None
    start: int
    read: Callable[[int], bytes]


class Backend(Protocol):
    """A binary cache's storage. Reads are capped (`max_bytes`: past it the object is refused,
    whatever it holds) and return None when the object is absent; a write is whole or absent for
    readers. Every method may be called from several threads at once."""

    policy: RetryPolicy

    def where(self, name: str) -> str:
        """The object's location, for messages (never with credentials)."""

    def get(self, name: str, *, max_bytes: int | None = None) -> bytes | None:
        """The object in memory."""

    def stream(self, name: str, write: Callable[[bytes], object], *, max_bytes: int | None) -> int | None:
        """The object's bytes handed to `write` as they arrive; its length."""

    def download(self, name: str, dest: Path, *, max_bytes: int) -> str | None:
        """The object in the new file `dest` (0600, never through a link); its sha256."""

    def size(self, name: str) -> int | None:
        """Its length, without reading it."""

    def put(self, name: str, src: Path | bytes) -> None:
        """Write the object (a new mtime even when the bytes are the same: that renews it)."""

    def delete(self, name: str) -> None:
        """Remove it; absent already is no error."""

    def list(self, folder: str = "") -> list[Listed]:
        """The objects of `folder` whose names this code writes (LISTED_NAME_RE)."""


def object_name(name: str) -> str:
    if not OBJECT_NAME_RE.fullmatch(name):
        raise UsageError(f"{name!r} is not a cache object name")
    return name


def check_folder(folder: str) -> str:
    if folder not in ("",) + FOLDERS:
        raise UsageError(f"{folder!r} is not a cache folder")
    return folder


def listed(folder: str, name: object, size: object, mtime: object, regular: bool = True) -> Listed | None:
    """A listing entry whose name is an object name of `folder` (others are left out)."""
    if not isinstance(name, str) or not isinstance(size, int) or not isinstance(mtime, (int, float)):
        return None
    full = f"{folder}/{name}" if folder else name
    if "/" in name or not LISTED_NAME_RE[folder].fullmatch(name) or not OBJECT_NAME_RE.fullmatch(full):
        return None
    return Listed(full, size, float(mtime), regular)


def too_big(where: str, max_bytes: int) -> IntegrityError:
    return IntegrityError(f"{where}: the cache serves more than {max_bytes} bytes for it; refusing it")


class StreamingBackend:
    """`get`, `stream` and `download` over one method a backend provides:
    `_open(name, offset, watch)`, a context manager yielding the object read from `offset`
    (`Opened`), or None when it is absent. It raises Transient for what another attempt may get
    past, and blocks on no read longer than `watch.timeout()`."""

    policy: RetryPolicy

    def _open(self, name: str, offset: int, watch: Watch) -> AbstractContextManager[Opened | None]:
        raise NotImplementedError

    def where(self, name: str) -> str:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Whatever a backend makes once before its first request (a client), outside the clocks
        of the attempts."""

    def _read(self, name: str, write: Callable[[bytes], object], max_bytes: int | None,
              opener=None, what: str | None = None) -> int | None:
        """Stream the object into `write`; its length, or None when absent. At most max_bytes + 1
        bytes are taken: past the cap it is refused, whatever it holds. A failed attempt is
        resumed at the first byte not yet delivered (a server that ignores the range sends the
        start again, which is skipped), so `write` sees each byte once, in order."""
        opener = opener or self._open
        delivered = 0
        self._prepare()

        def attempt(watch: Watch) -> int | None:
            nonlocal delivered
            with opener(name, delivered, watch) as opened:
                if opened is None:
                    if delivered:
                        raise NetworkError(f"{self.where(name)}: removed from the cache while it was read")
                    return None
                total, start, read = opened
                if max_bytes is not None and total is not None and total > max_bytes:
                    raise too_big(self.where(name), max_bytes)
                skip = delivered - start
                if skip < 0:
                    raise NetworkError(f"{self.where(name)}: served from byte {start}, not {delivered} as asked")
                while True:
                    want = CHUNK if max_bytes is None else max(1, min(CHUNK, max_bytes + 1 - delivered + skip))
                    chunk = read(want)
                    if not chunk:
                        if total is not None and delivered < total:
                            raise Transient(f"{self.where(name)}: the body ended after {delivered} of its {total} "
                                            "bytes")
                        return delivered
                    watch.got(len(chunk))
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                        if not chunk:
                            continue
                    if max_bytes is not None and delivered + len(chunk) > max_bytes:
                        raise too_big(self.where(name), max_bytes)
                    write(chunk)
                    delivered += len(chunk)

        return run(self.policy, what or f"GET {self.where(name)}", attempt, document=is_document(name))

    def stream(self, name: str, write: Callable[[bytes], object], *, max_bytes: int | None) -> int | None:
        return self._read(object_name(name), write, max_bytes)

    def get(self, name: str, *, max_bytes: int | None = None) -> bytes | None:
        buf = bytearray()
        return None if self._read(object_name(name), buf.extend, max_bytes) is None else bytes(buf)

    def download(self, name: str, dest: Path, *, max_bytes: int) -> str | None:
        digest = hashlib.sha256()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:

                def write(chunk: bytes) -> None:
                    digest.update(chunk)
                    out.write(chunk)

                found = self._read(object_name(name), write, max_bytes)
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        if found is None:
            dest.unlink(missing_ok=True)
            return None
        return digest.hexdigest()
