"""`http(s)://host/prefix`: GET and HEAD read, PUT writes, DELETE and a folder listing in nginx's
`autoindex_format json` (`GET prefix/blobs/`: a JSON list of {name, type, mtime (RFC 1123),
size}) serve cache gc.

Requests go through the store's one HTTP stack (app/httpclient.py: httpx; its TLS, proxy and
netrc rules), one client per cache and process, shared by the pull's threads (kept-alive
connections); bodies taken raw (Accept-Encoding: identity, never inflated: a gzip bomb stays 64 KiB
on the way to the cap). Every request runs under the retry policy (retry.py), each socket read and
write bounded by what its attempt's clock has left (`httpclient.clock`).

Credentials, for a cache that wants them (docs/fleet.md's nginx takes writes only from an
authenticated builder): `user:password@` in the URL, sent with every request; else the netrc
entry of the host (app/credentials.netrc_login: $NETRC, else ~/.netrc; refused unless private to
its owner), sent with every request; else $LLMGW_STORE_CACHE_AUTH (`user:password`), sent with
writes (PUT, DELETE) only. They go as HTTP Basic to the cache's own origin, never to an origin it
redirects to, and never appear in a message (the URL is shown without them).

Redirects: followed for reads (at most MAX_REDIRECTS) to the cache's own scheme, host and port,
or to an origin listed in $LLMGW_STORE_CACHE_REDIRECTS_TO (`https://cdn.example.com`,
space-separated; `*` allows any); anything else is refused, and a write is never redirected.
"""

from __future__ import annotations

import email.utils
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from llmgw_store.app import httpclient
from llmgw_store.app.credentials import netrc_login, public_url
from llmgw_store.app.retry import retry_after as _retry_after
from llmgw_store.base.errors import IntegrityError, NetworkError, UsageError
from llmgw_store.cache.backends.base import (
    CHUNK,
    MAX_LISTED,
    Listed,
    Opened,
    StreamingBackend,
    check_folder,
    listed,
    object_name,
)
from llmgw_store.cache.backends.retry import RetryPolicy, Transient, Watch, run

MAX_REDIRECTS = 5
LISTING_MAX_BYTES = 64 << 20
SMALL_BODY = 64 << 10  # what is read of an answer that is not the object (an error page, a redirect's)
REDIRECT_STATUS = (301, 302, 303, 307, 308)
AUTH_ENV = "LLMGW_STORE_CACHE_AUTH"
REDIRECTS_ENV = "LLMGW_STORE_CACHE_REDIRECTS_TO"


def _origin(url: str) -> str:
    """scheme://host:port of a URL (the default port written out, the host lower-cased)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"{_shown(url)!r}: not a valid port") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or (443 if scheme == 'https' else 80)}"


def _shown(url: str) -> str:
    """The URL without credentials: what messages may print."""
    return public_url(url)


def _env_auth() -> str | None:
    value = os.environ.get(AUTH_ENV, "")
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user:
        raise UsageError(f"{AUTH_ENV}: give user:password")
    return httpclient.basic(user, password)


def _allowed_origins(own: str, extra: str) -> frozenset[str]:
    out = {own}
    for item in extra.replace(",", " ").split():
        if item == "*":
            out.add("*")
            continue
        if urlsplit(item).scheme not in ("http", "https") or not urlsplit(item).hostname:
            raise UsageError(f"{REDIRECTS_ENV}: {item[:80]!r} is not an origin (https://host[:port]) or *")
        out.add(_origin(item))
    return frozenset(out)


def _needs_tls(allowed: frozenset[str]) -> bool:
    """Whether a request of this cache may meet TLS: an https origin it may reach, or an https proxy."""
    from urllib.request import getproxies_environment

    if "*" in allowed or any(o.startswith("https://") for o in allowed):
        return True
    return any(str(p).lower().startswith("https://") for p in getproxies_environment().values())


def _status(method: str, shown: str, resp, *, write: bool = False) -> NetworkError:
    """The error an unexpected status is: Transient for 408, 429 and 5xx (Retry-After honoured)."""
    code = resp.status_code
    if code in (408, 429) or 500 <= code <= 599:
        # nginx answers 500 to a PUT into a folder it may not create: say so, though it is retried.
        hint = " (nginx answers this to a write without create_full_put_path on)" if write and code == 500 else ""
        return Transient(f"{method} {shown}: HTTP {code}{hint}",
                         retry_after=_retry_after(resp.headers.get("Retry-After")))
    hint = ""
    if code in (401, 403):
        hint = (f" (the cache wants credentials{' for writes' if write else ''}: a netrc entry for its host, or "
                f"{AUTH_ENV}=user:password for writes)")
    elif code == 413:
        hint = " (the server refuses a body this large: nginx needs client_max_body_size 0)"
    elif code == 409 and write:
        hint = " (the server cannot create the object's folder: nginx needs create_full_put_path on)"
    elif write and code in (405, 501):
        hint = " (does the server accept writes?)"
    return NetworkError(f"{method} {shown}: HTTP {code}{hint}")


def _chunks(src: Path | bytes, watch: Watch):
    """A PUT's body, a block at a time: each send is bounded by the attempt's clock, and each block
    sent is progress (so the answer is waited for a stall time after the last one, however long
    the upload took)."""
    if isinstance(src, bytes):
        for at in range(0, len(src), CHUNK):
            yield src[at:at + CHUNK]
            watch.got(min(CHUNK, len(src) - at))
        return
    with open(src, "rb") as f:
        while block := f.read(CHUNK):
            yield block
            watch.got(len(block))


class HttpBackend(StreamingBackend):
    def __init__(self, url: str, policy: RetryPolicy | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"{_shown(url)!r}: an HTTP cache URL is http(s)://host/prefix")
        self.policy = policy or RetryPolicy.from_env()
        self.origin = _origin(url)
        self.base = _shown(url).rstrip("/")
        given = httpclient.basic(unquote(parts.username), unquote(parts.password or "")) if parts.username else None
        login = None if given else netrc_login(parts.hostname)
        netrc = httpclient.basic(*login) if login else None
        self._read_auth = given or netrc
        self._write_auth = given or netrc or _env_auth()
        self._allowed = _allowed_origins(self.origin, self.policy.redirects_to)
        self._client = None
        self._client_lock = threading.Lock()

    def where(self, name: str) -> str:
        return f"{self.base}/{name}"

    def _prepare(self) -> None:
        self._http()

    def _http(self):
        """The cache's client, made before its first request's first attempt (httpx is imported
        then, not before, and outside the clock of an attempt)."""
        with self._client_lock:
            if self._client is None:
                self._client = httpclient.client(tls=_needs_tls(self._allowed))
            return self._client

    def _send(self, method: str, url: str, watch: Watch, *, headers: dict[str, str] | None = None,
              body=None, write: bool = False):
        """One attempt: the answer, its body still to be read (close it), read redirects followed
        (see the module docstring)."""
        httpx = httpclient.load()

        http = self._http()
        for _ in range(MAX_REDIRECTS + 1):
            origin = _origin(url)
            hdrs = {"Accept-Encoding": "identity", **(headers or {})}
            auth = (self._write_auth if write else self._read_auth) if origin == self.origin else None
            if auth:
                hdrs["Authorization"] = auth
            request = http.build_request(method, url, headers=hdrs, content=body)
            request.extensions["timeout"] = httpclient.clock(watch)
            try:
                resp = http.send(request, stream=True)
            except httpx.TransportError as exc:
                raise httpclient.failed(f"{method} {_shown(url)}", exc, watch) from None
            try:
                watch.got(0)
            except BaseException:  # answered past the attempt's clock: its connection is not kept
                resp.close()
                raise
            if resp.status_code not in REDIRECT_STATUS or method not in ("GET", "HEAD"):
                return resp
            location = resp.headers.get("Location") or ""
            self._finish(resp)
            nxt = urljoin(url, location)
            if urlsplit(nxt).scheme not in ("http", "https") or not urlsplit(nxt).hostname:
                raise NetworkError(f"{method} {_shown(url)}: redirected to {_shown(nxt)[:200]!r}; refusing it")
            if "*" not in self._allowed and _origin(nxt) not in self._allowed:
                raise NetworkError(f"{method} {_shown(url)}: redirected to {_origin(nxt)}, not this cache's scheme and "
                                   f"host; refusing it (allow that origin with {REDIRECTS_ENV})")
            url = nxt
        raise NetworkError(f"{method} {_shown(url)}: more than {MAX_REDIRECTS} redirects; refusing it")

    @staticmethod
    def _finish(resp) -> None:
        """Read a small answer's body (at most SMALL_BODY) so its connection can serve again, then
        close it (a longer one closes the connection with it)."""
        try:
            got = 0
            for chunk in resp.iter_raw():
                got += len(chunk)
                if got >= SMALL_BODY:
                    break
        except Exception:  # the answer is known already; its body is not needed
            pass
        finally:
            resp.close()

    # --- reads ---------------------------------------------------------------------------------

    @contextmanager
    def _open_url(self, url: str, offset: int, watch: Watch):
        httpx = httpclient.load()

        shown = _shown(url)
        resp = self._send("GET", url, watch, headers={"Range": f"bytes={offset}-"} if offset else None)
        try:
            if resp.status_code == 404:
                self._finish(resp)  # its connection serves the next request (a fallback asks many)
                yield None
                return
            if resp.status_code not in (200, 206):
                raise _status("GET", shown, resp)
            length = resp.headers.get("Content-Length", "")
            declared = int(length) if length.isdigit() else None
            start, total = 0, declared
            if resp.status_code == 206:
                start, total = self._content_range(resp.headers.get("Content-Range", ""), declared, shown)
            body = resp.iter_raw()
            left = b""  # what the last network read brought beyond what was asked

            def read(n: int) -> bytes:
                nonlocal left
                if not left:
                    try:
                        left = next(body, b"")
                    except httpx.TransportError as exc:
                        raise httpclient.failed(f"GET {shown}", exc, watch) from None
                if len(left) <= n:
                    out, left = left, b""
                    return out
                out, left = left[:n], left[n:]
                return out

            yield Opened(total, start, read)
        finally:
            resp.close()  # a body not read to its end (refused, an error, a failure) closes its connection

    @staticmethod
    def _content_range(value: str, declared: int | None, shown: str) -> tuple[int, int | None]:
        unit, _, rest = value.partition(" ")
        span, _, whole = rest.partition("/")
        first = span.partition("-")[0]
        if unit != "bytes" or not first.isdigit():
            raise NetworkError(f"GET {shown}: a partial answer without a byte range ({value[:60]!r})")
        start = int(first)
        if whole.isdigit():
            return start, int(whole)
        return start, None if declared is None else start + declared

    def _open(self, name: str, offset: int, watch: Watch):
        return self._open_url(self.where(name), offset, watch)

    # --- writes and the rest -------------------------------------------------------------------

    def put(self, name: str, src: Path | bytes) -> None:
        url = self.where(object_name(name))
        size = len(src) if isinstance(src, bytes) else src.stat().st_size

        def attempt(watch: Watch) -> None:
            resp = self._send("PUT", url, watch, headers={"Content-Length": str(size)}, body=_chunks(src, watch),
                              write=True)
            self._finish(resp)
            if resp.status_code not in (200, 201, 204):
                raise _status("PUT", url, resp, write=True)

        self._prepare()
        run(self.policy, f"PUT {url}", attempt)

    def size(self, name: str) -> int | None:
        url = self.where(object_name(name))

        def attempt(watch: Watch) -> int | None:
            resp = self._send("HEAD", url, watch)
            self._finish(resp)
            if resp.status_code == 404:
                return None
            if resp.status_code != 200:
                raise _status("HEAD", url, resp)
            length = resp.headers.get("Content-Length", "")
            return int(length) if length.isdigit() else 0

        self._prepare()
        return run(self.policy, f"HEAD {url}", attempt)

    def delete(self, name: str) -> None:
        url = self.where(object_name(name))

        def attempt(watch: Watch) -> None:
            resp = self._send("DELETE", url, watch, write=True)
            self._finish(resp)
            if resp.status_code not in (200, 202, 204, 404):
                raise _status("DELETE", url, resp, write=True)

        self._prepare()
        run(self.policy, f"DELETE {url}", attempt)

    def list(self, folder: str = "") -> list[Listed]:
        """`GET <base>/<folder>/`, answered as nginx's `autoindex_format json` does; at most
        LISTING_MAX_BYTES of it is read."""
        label = f"{check_folder(folder)}/" if folder else ""
        url = f"{self.base}/{label}"
        buf = bytearray()
        found = self._read(label, buf.extend, LISTING_MAX_BYTES,
                           opener=lambda _name, offset, watch: self._open_url(url, offset, watch), what=f"GET {url}")
        if found is None:
            return []
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
            item = listed(folder, e.get("name"), e.get("size"), mtime)
            if item is not None:
                out.append(item)
        return out

