"""Where binary caches live: `file:///dir`, `http(s)://host/prefix` (GET to read, PUT to write,
DELETE and nginx-style `autoindex_format json` listings of `prefix/dir/` for cache gc) and
`s3://bucket/prefix` (boto3, optional). Every backend has `get(name, max_bytes=)` (the object in
memory), `download(name, dest, max_bytes=)` (into a new file; its sha256), both None when the
object does not exist, `stream(name, write, max_bytes=)`, `size(name)` (None when absent),
`put(name, src)`, `delete(name)` and `list(folder)` (Listed entries: name, size, mtime); a write is
whole or absent for readers. Every backend may be used from several threads at once.

Object names are flat (`<key>.json`) or one folder deep in the folders of FOLDERS
(`blobs/<digest>`, `roots/<node>.json`, ...); anything else is refused before it reaches a path or URL.

What a cache serves is hostile until checked: reads stream and stop as soon as an object passes
`max_bytes` (a declared length past it is refused before the body is read), object names are
checked before they reach a path or URL, and a `file://` object that is a link or not a regular
file is refused rather than followed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Tuple

from llmgw_store.core.errors import IntegrityError, NetworkError, UsageError

CHUNK = 1 << 20
FOLDERS = ("blobs", "roots", "pending", "gc")
OBJECT_NAME_RE = re.compile(r"(?:(?:blobs|roots|pending|gc)/)?[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")
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
}


@dataclass(frozen=True)
class Listed:
    name: str  # the object's name, folder included
    size: int
    mtime: float  # seconds since the epoch, when it was last written

# (declared length or None, read(n) -> at most n bytes, b"" at the end), or None when absent.
Stream = Optional[Tuple[Optional[int], Callable[[int], bytes]]]


def _object_name(name: str) -> str:
    if not OBJECT_NAME_RE.fullmatch(name):
        raise UsageError(f"{name!r} is not a cache object name")
    return name


def _folder(folder: str) -> str:
    if folder not in ("",) + FOLDERS:
        raise UsageError(f"{folder!r} is not a cache folder")
    return folder


def _listed(folder: str, name: object, size: object, mtime: object) -> Listed | None:
    """A listing entry whose name is an object name of `folder` (others are left out)."""
    if not isinstance(name, str) or not isinstance(size, int) or not isinstance(mtime, (int, float)):
        return None
    full = f"{folder}/{name}" if folder else name
    if "/" in name or not LISTED_NAME_RE[folder].fullmatch(name) or not OBJECT_NAME_RE.fullmatch(full):
        return None
    return Listed(full, size, float(mtime))


def _too_big(where: str, max_bytes: int) -> IntegrityError:
    return IntegrityError(f"{where}: the cache serves more than {max_bytes} bytes for it; refusing it")


class _Backend:
    def _open(self, name: str):  # -> context manager yielding a Stream
        raise NotImplementedError

    def where(self, name: str) -> str:
        raise NotImplementedError

    def _copy(self, name: str, write: Callable[[bytes], object], max_bytes: int | None) -> int | None:
        """Stream the object into `write`; its length, or None when absent. Reads at most
        max_bytes + 1 bytes: past the cap it is refused, whatever it holds."""
        with self._open(_object_name(name)) as stream:
            if stream is None:
                return None
            declared, read = stream
            if max_bytes is not None and declared is not None and declared > max_bytes:
                raise _too_big(self.where(name), max_bytes)
            total = 0
            while True:
                want = CHUNK if max_bytes is None else min(CHUNK, max_bytes + 1 - total)
                chunk = read(want)
                if not chunk:
                    return total
                total += len(chunk)
                if max_bytes is not None and total > max_bytes:
                    raise _too_big(self.where(name), max_bytes)
                write(chunk)

    def stream(self, name: str, write: Callable[[bytes], object], *, max_bytes: int | None) -> int | None:
        """The object's bytes handed to `write` as they arrive (at most max_bytes of them: past
        that it is refused); its length, or None when absent."""
        return self._copy(name, write, max_bytes)

    def get(self, name: str, *, max_bytes: int | None = None) -> bytes | None:
        buf = bytearray()
        return None if self._copy(name, buf.extend, max_bytes) is None else bytes(buf)

    def download(self, name: str, dest: Path, *, max_bytes: int) -> str | None:
        """The object streamed into the new file `dest` (0600, never through a link); its sha256
        hex digest, computed on the way. Absent or refused: `dest` does not exist afterwards."""
        digest = hashlib.sha256()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:

                def write(chunk: bytes) -> None:
                    digest.update(chunk)
                    out.write(chunk)

                found = self._copy(name, write, max_bytes)
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        if found is None:
            dest.unlink(missing_ok=True)
            return None
        return digest.hexdigest()


def _reader(chunks: Iterator[bytes]) -> Callable[[int], bytes]:
    """read(n) over a stream that delivers chunks of its own size (an HTTP body)."""
    pending = b""

    def read(n: int) -> bytes:
        nonlocal pending
        while not pending:
            pending = next(chunks, None)
            if pending is None:
                pending = b""
                return b""
        out, pending = pending[:n], pending[n:]
        return out

    return read


class FileBackend(_Backend):
    """Every access goes through directory fds opened with O_NOFOLLOW|O_DIRECTORY: the cache root
    and its folders are refused when they are links (a `blobs/` linked to /etc must not make a gc,
    running as root, delete or overwrite files there), and names are used relative to those fds."""

    def __init__(self, root: Path):
        self.root = root

    def where(self, name: str) -> str:
        return str(self.root / name)

    def _dir_fd(self, folder: str, *, create: bool = False) -> int | None:
        """An fd of the cache root (folder "") or of one of its folders; None when absent."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.root, 0o755)
            except FileExistsError:
                pass
        try:
            root = os.open(self.root, flags)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise IntegrityError(f"{self.root}: the cache root is a link or not a directory; refusing it") from None
            raise NetworkError(f"{self.root}: {exc.strerror}") from None
        if not folder:
            return root
        try:
            if create:
                try:
                    os.mkdir(folder, 0o755, dir_fd=root)
                except FileExistsError:
                    pass
            try:
                return os.open(folder, flags, dir_fd=root)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise IntegrityError(f"{self.root / folder}: is a link or not a directory; refusing it") from None
                raise NetworkError(f"{self.root / folder}: {exc.strerror}") from None
        finally:
            os.close(root)

    @contextmanager
    def _dir(self, folder: str, *, create: bool = False):
        fd = self._dir_fd(folder, create=create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    @contextmanager
    def _open(self, name: str):
        path = self.root / name
        folder, _, base = name.rpartition("/")
        with self._dir(folder) as dfd:
            if dfd is None:
                yield None
                return
            try:
                # O_NONBLOCK: a FIFO planted in the cache must not hang the open; O_NOFOLLOW: a link
                # planted there must not make this process (root) read a file of its choosing.
                fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                yield None
                return
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise IntegrityError(f"{path}: is not a regular file (a link); refusing it") from None
                raise NetworkError(f"{path}: {exc.strerror}") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise IntegrityError(f"{path}: is not a regular file; refusing it")
                yield st.st_size, lambda n: os.read(fd, n)
            finally:
                os.close(fd)

    def put(self, name: str, src: Path | bytes) -> None:
        _object_name(name)
        folder, _, base = name.rpartition("/")
        tmp = f".{base}.{os.getpid()}.{threading.get_ident()}.tmp"
        with self._dir(folder, create=True) as dfd:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as out:
                    if isinstance(src, bytes):
                        out.write(src)
                    else:
                        with open(src, "rb") as f:
                            while chunk := f.read(CHUNK):
                                out.write(chunk)
                # Within one directory fd: readers see the whole object or none.
                os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                raise

    def size(self, name: str) -> int | None:
        folder, _, base = _object_name(name).rpartition("/")
        with self._dir(folder) as dfd:
            if dfd is None:
                return None
            try:
                st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def delete(self, name: str) -> None:
        folder, _, base = _object_name(name).rpartition("/")
        with self._dir(folder) as dfd:
            if dfd is None:
                return
            try:
                os.unlink(base, dir_fd=dfd)  # unlink never follows a link, and dfd is no link
            except FileNotFoundError:
                pass

    def list(self, folder: str = "") -> list[Listed]:
        where = self.root / _folder(folder) if folder else self.root
        out: list[Listed] = []
        with self._dir(folder) as dfd:
            if dfd is None:
                return out
            with os.scandir(dfd) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and not e.name.startswith("."):
                        item = _listed(folder, e.name, st.st_size, st.st_mtime)
                        if item is not None:
                            out.append(item)
                    if len(out) > MAX_LISTED:
                        raise IntegrityError(f"{where}: lists more than {MAX_LISTED} objects; refusing it")
        return out


class HttpBackend(_Backend):
    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self._shared = None
        self._lock = threading.Lock()
        # GETs of a plain http:// cache go through http.client, one kept-alive connection per
        # thread: no httpx import on a pull's path, and a fraction of its CPU per request (a pull
        # makes thousands). https://, credentials in the URL, a proxy from the environment, and
        # redirects take httpx.
        self._direct = base.startswith("http://") and "@" not in base[len("http://"):].split("/")[0] and not any(
            os.environ.get(v) for v in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"))
        self._tls = threading.local()

    def where(self, name: str) -> str:
        return f"{self.base}/{name}"

    @contextmanager
    def _client(self):
        """One connection pool for the backend's life (httpx clients are thread-safe): parallel
        blob downloads reuse connections instead of opening one per object."""
        import httpx

        with self._lock:
            if self._shared is None:
                # Bodies are taken raw (iter_raw), never inflated: httpx would inflate a gzip body a
                # whole network chunk at a time, before the cap sees it (a gzip bomb). Objects are
                # zstd already and metadata is small; a server that compresses anyway fails the
                # digest or the parse.
                self._shared = httpx.Client(
                    timeout=300, follow_redirects=True,
                    limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
                    headers={"User-Agent": "llmgw-store", "Accept-Encoding": "identity"})
        yield self._shared

    def _direct_get(self, url: str):
        """The response to `GET url` on this thread's connection (reconnecting once when a
        kept-alive connection turns out closed), or None for a redirect (httpx follows those)."""
        import http.client
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in (0, 1):
            conn = getattr(self._tls, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._tls.conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=300)
            try:
                conn.request("GET", target, headers={"User-Agent": "llmgw-store", "Accept-Encoding": "identity"})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: once more, on a new one
                raise NetworkError(f"GET {url}: {exc}") from exc
            if resp.status in (301, 302, 303, 307, 308):
                self._drop()
                return None
            return resp
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        conn = getattr(self._tls, "conn", None)
        self._tls.conn = None
        if conn is not None:
            conn.close()

    @contextmanager
    def _open(self, name: str):
        import http.client

        url = self.where(name)
        resp = self._direct_get(url) if self._direct else None
        if resp is not None:
            length = resp.getheader("content-length", "")
            declared = int(length) if length.isdigit() else None
            got = 0

            def read(n: int) -> bytes:
                nonlocal got
                try:
                    chunk = resp.read(n)
                except (OSError, http.client.HTTPException) as exc:
                    self._drop()
                    raise NetworkError(f"GET {url}: {exc}") from exc
                got += len(chunk)
                if not chunk and declared is not None and got < declared:
                    # http.client ends a body cut short quietly; it is a failed read, not a short object.
                    raise NetworkError(f"GET {url}: the body ended after {got} of its {declared} bytes")
                return chunk

            try:
                if resp.status == 404:
                    yield None
                elif resp.status != 200:
                    raise NetworkError(f"GET {url}: HTTP {resp.status}")
                else:
                    yield declared, read
            finally:
                if not resp.isclosed():  # a body not read to its end (refused, an error body): no reuse
                    self._drop()
            return
        import httpx

        try:
            with self._client() as c, c.stream("GET", url) as r:
                if r.status_code == 404:
                    yield None
                    return
                if r.status_code != 200:
                    raise NetworkError(f"GET {url}: HTTP {r.status_code}")
                length = r.headers.get("content-length", "")
                yield (int(length) if length.isdigit() else None), _reader(r.iter_raw())
        except httpx.HTTPError as exc:
            raise NetworkError(f"GET {url}: {exc}") from exc

    def put(self, name: str, src: Path | bytes) -> None:
        import httpx

        url = self.where(_object_name(name))
        try:
            with self._client() as c:
                if isinstance(src, bytes):
                    r = c.put(url, content=src)
                else:
                    with open(src, "rb") as f:
                        r = c.put(url, content=f, headers={"Content-Length": str(src.stat().st_size)})
        except httpx.HTTPError as exc:
            raise NetworkError(f"PUT {url}: {exc}") from exc
        if r.status_code not in (200, 201, 204):
            raise NetworkError(f"PUT {url}: HTTP {r.status_code} (does the server accept writes?)")

    def size(self, name: str) -> int | None:
        import httpx

        url = self.where(_object_name(name))
        try:
            with self._client() as c:
                r = c.head(url)
        except httpx.HTTPError as exc:
            raise NetworkError(f"HEAD {url}: {exc}") from exc
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise NetworkError(f"HEAD {url}: HTTP {r.status_code}")
        length = r.headers.get("content-length", "")
        return int(length) if length.isdigit() else 0

    def delete(self, name: str) -> None:
        import httpx

        url = self.where(_object_name(name))
        try:
            with self._client() as c:
                r = c.delete(url)
        except httpx.HTTPError as exc:
            raise NetworkError(f"DELETE {url}: {exc}") from exc
        if r.status_code not in (200, 202, 204, 404):
            raise NetworkError(f"DELETE {url}: HTTP {r.status_code} (does the server accept deletes?)")

    def list(self, folder: str = "") -> list[Listed]:
        """`GET <base>/<folder>/`, answered as nginx's `autoindex_format json` does: a JSON list of
        {name, type, mtime (RFC 1123), size}. At most 64 MiB of it is read."""
        import email.utils
        import json

        url = f"{self.base}/{_folder(folder)}/" if folder else f"{self.base}/"
        limit = 64 << 20
        buf = bytearray()
        with self._open_url(url) as stream:
            if stream is None:
                return []
            _, read = stream
            while chunk := read(CHUNK):
                buf.extend(chunk)
                if len(buf) > limit:
                    raise _too_big(url, limit)
        try:
            doc = json.loads(buf)
        except ValueError:
            raise IntegrityError(f"GET {url}: the listing is not JSON (autoindex_format json); refusing it") from None
        if not isinstance(doc, list) or len(doc) > MAX_LISTED:
            raise IntegrityError(f"GET {url}: the listing is not a JSON list; refusing it")
        out = []
        for e in doc:
            if not isinstance(e, dict) or e.get("type") != "file" or not isinstance(e.get("mtime"), str):
                continue
            try:
                mtime = email.utils.parsedate_to_datetime(e["mtime"]).timestamp()
            except (TypeError, ValueError):
                continue
            item = _listed(folder, e.get("name"), e.get("size"), mtime)
            if item is not None:
                out.append(item)
        return out

    @contextmanager
    def _open_url(self, url: str):
        import httpx

        try:
            with self._client() as c, c.stream("GET", url) as r:
                if r.status_code == 404:
                    yield None
                    return
                if r.status_code != 200:
                    raise NetworkError(f"GET {url}: HTTP {r.status_code}")
                yield None, _reader(r.iter_raw())
        except httpx.HTTPError as exc:
            raise NetworkError(f"GET {url}: {exc}") from exc


class S3Backend(_Backend):
    """S3-compatible object storage through boto3 (`pip install 'llmgw-store[s3]'`). Credentials and
    region come from boto3's usual places; `LLMGW_STORE_S3_ENDPOINT` (or AWS_ENDPOINT_URL) names a
    non-AWS endpoint (MinIO, Ceph, a test server)."""

    def __init__(self, url: str):
        try:
            import boto3
        except ImportError:
            raise UsageError("s3:// caches need boto3: pip install 'llmgw-store[s3]'") from None
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise UsageError(f"{url!r}: an S3 cache URL is s3://bucket/prefix")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        endpoint = os.environ.get("LLMGW_STORE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
        from botocore.config import Config

        # Pulls fetch blobs from many threads through this one (thread-safe) client.
        self.client = boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=32))

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"s3://{self.bucket}/{self._key(name)}"

    @contextmanager
    def _open(self, name: str):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                yield None
                return
            raise NetworkError(f"{self.where(name)}: {exc}") from exc
        except BotoCoreError as exc:
            raise NetworkError(f"{self.where(name)}: {exc}") from exc
        body = resp["Body"]
        try:
            length = resp.get("ContentLength")
            yield (length if isinstance(length, int) else None), body.read
        except BotoCoreError as exc:
            raise NetworkError(f"{self.where(name)}: {exc}") from exc
        finally:
            body.close()

    def put(self, name: str, src: Path | bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if isinstance(src, bytes):
                self.client.put_object(Bucket=self.bucket, Key=self._key(_object_name(name)), Body=src)
            else:
                self.client.upload_file(str(src), self.bucket, self._key(_object_name(name)))
        except (ClientError, BotoCoreError) as exc:
            raise NetworkError(f"{self.where(name)}: {exc}") from exc

    def size(self, name: str) -> int | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=self._key(_object_name(name)))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise NetworkError(f"{self.where(name)}: {exc}") from exc
        except BotoCoreError as exc:
            raise NetworkError(f"{self.where(name)}: {exc}") from exc
        length = resp.get("ContentLength")
        return length if isinstance(length, int) else 0

    def delete(self, name: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(_object_name(name)))
        except (ClientError, BotoCoreError) as exc:
            raise NetworkError(f"{self.where(name)}: {exc}") from exc

    def list(self, folder: str = "") -> list[Listed]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = self._key(f"{_folder(folder)}/" if folder else "")
        out: list[Listed] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/")
            for page in pages:
                for o in page.get("Contents", []):
                    item = _listed(folder, o["Key"][len(prefix):], o.get("Size"), o["LastModified"].timestamp())
                    if item is not None:
                        out.append(item)
                if len(out) > MAX_LISTED:
                    raise IntegrityError(f"{self.where(prefix)}: lists more than {MAX_LISTED} objects; refusing it")
        except (ClientError, BotoCoreError) as exc:
            raise NetworkError(f"{self.where(prefix)}: {exc}") from exc
        return out


def backend_for(url: str):
    if url.startswith("file://"):
        return FileBackend(Path(url[len("file://"):]))
    from llmgw_store.core import network

    network.require(f"the binary cache {url}", "only file:// caches can be used offline")
    if url.startswith(("http://", "https://")):
        return HttpBackend(url)
    if url.startswith("s3://"):
        return S3Backend(url)
    raise UsageError(f"{url!r}: a cache URL is file:///dir, http(s)://host/prefix or s3://bucket/prefix")
