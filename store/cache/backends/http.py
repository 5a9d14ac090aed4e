"""`http(s)://host/prefix`: GET and HEAD read, PUT writes, DELETE and a folder listing in nginx's
`autoindex_format json` (`GET prefix/blobs/`: a JSON list of {name, type, mtime (RFC 1123),
size}) serve cache gc.

One HTTP client for every request, http.client: one kept-alive connection per thread and origin
(a pull makes thousands of requests; httpx costs several times the CPU per request, and is not
imported on this path); TLS with the system's CA store (SSL_CERT_FILE or SSL_CERT_DIR override
it); proxies from the environment (http_proxy, https_proxy, all_proxy, no_proxy; an http://
proxy); bodies taken raw (Accept-Encoding: identity, never inflated: a gzip bomb stays 64 KiB on
the way to the cap). Every request runs under the retry policy (retry.py).

Credentials, for a cache that wants them (docs/fleet.md's nginx takes writes only from an
authenticated builder): `user:password@` in the URL, sent with every request; else the netrc
entry of the host ($NETRC, else ~/.netrc; refused unless private to its owner), sent with every
request; else $LLMGW_STORE_CACHE_AUTH (`user:password`), sent with writes (PUT, DELETE) only.
They go as HTTP Basic to the cache's own origin, never to an origin it redirects to, and never
appear in a message (the URL is shown without them).

Redirects: followed for reads (at most MAX_REDIRECTS) to the cache's own scheme, host and port,
or to an origin listed in $LLMGW_STORE_CACHE_REDIRECTS_TO (`https://cdn.example.com`,
space-separated; `*` allows any); anything else is refused, and a write is never redirected.
"""

from __future__ import annotations

import base64
import email.utils
import io
import json
import os
import socket
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from llmgw_store.app.credentials import netrc_file, public_url
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
REDIRECT_STATUS = (301, 302, 303, 307, 308)
AUTH_ENV = "LLMGW_STORE_CACHE_AUTH"
REDIRECTS_ENV = "LLMGW_STORE_CACHE_REDIRECTS_TO"
_ssl_context = None
_ssl_lock = threading.Lock()


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


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _netrc_auth(host: str) -> str | None:
    """The Basic credential of the netrc entry for `host` ($NETRC, else ~/.netrc), if any. A netrc
    others could read or write, or owned by someone else, is refused (as Python's netrc does for
    ~/.netrc): its passwords are not secrets any more, or not ours."""
    path = netrc_file()
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read this netrc file ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            raise UsageError(f"{path}: the netrc file is not a regular file of at most 1 MiB; refusing it")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UsageError(f"{path}: the netrc file must be owned by this user and private to it (chmod 600)")
        text = os.read(fd, st.st_size + 1).decode("utf-8", "replace")
    finally:
        os.close(fd)
    entry = _netrc_entry(text, host)
    if entry is None or not entry[0]:
        return None
    return _basic(*entry)


def _netrc_entry(text: str, host: str) -> tuple[str, str] | None:
    """(login, password) of `machine host` in a netrc text, else of its `default` entry."""
    kept, in_macro = [], False
    for line in text.splitlines():  # a macdef runs to the next blank line: its words are no entries
        if in_macro:
            in_macro = bool(line.strip())
        elif line.split()[:1] == ["macdef"]:
            in_macro = True
        else:
            kept.append(line)
    tokens = iter(" ".join(kept).split())
    found: dict[str, tuple[str, str]] = {}
    current: str | None = None
    fields: dict[str, str] = {}
    for tok in tokens:
        if tok in ("machine", "default"):
            if current is not None and current not in found:
                found[current] = (fields.get("login", ""), fields.get("password", ""))
            current, fields = (next(tokens, "") if tok == "machine" else "\0default"), {}
        elif tok in ("login", "password", "account") and current is not None:
            fields[tok] = next(tokens, "")
    if current is not None and current not in found:
        found[current] = (fields.get("login", ""), fields.get("password", ""))
    return found.get(host) or found.get("\0default")


def _env_auth() -> str | None:
    value = os.environ.get(AUTH_ENV, "")
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user:
        raise UsageError(f"{AUTH_ENV}: give user:password")
    return _basic(user, password)


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


def _proxy(url: str) -> tuple[str, int, str | None] | None:
    """(host, port, Proxy-Authorization) of the proxy the environment names for `url`, if any."""
    from urllib.request import getproxies_environment, proxy_bypass  # on Linux: proxy_bypass_environment

    parts = urlsplit(url)
    proxies = getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or proxy_bypass(parts.hostname or ""):
        return None
    p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if p.scheme != "http" or not p.hostname:
        raise UsageError(f"proxy {_shown(proxy)[:80]!r}: only an http:// proxy is supported for binary caches")
    auth = _basic(unquote(p.username), unquote(p.password or "")) if p.username else None
    return p.hostname, p.port or 80, auth


def _ssl():
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            import ssl

            _ssl_context = ssl.create_default_context()
        return _ssl_context


def _failed(method: str, shown: str, exc: BaseException, watch: Watch) -> NetworkError:
    """What an OSError of an attempt means: Transient, unless another attempt cannot help (a
    certificate that does not verify, a host name that does not exist)."""
    import ssl

    if isinstance(exc, (TimeoutError, socket.timeout)) and watch.cutoff <= time.monotonic():
        return watch.stalled()
    if isinstance(exc, ssl.SSLCertVerificationError):
        return NetworkError(f"{method} {shown}: {exc.verify_message or exc}")
    if isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_NONAME:
        return NetworkError(f"{method} {shown}: unknown host ({exc.strerror})")
    return Transient(f"{method} {shown}: {exc or type(exc).__name__}")


def _status(method: str, shown: str, resp, *, write: bool = False) -> NetworkError:
    """The error an unexpected status is: Transient for 408, 429 and 5xx (Retry-After honoured)."""
    code = resp.status
    if code in (408, 429) or 500 <= code <= 599:
        # nginx answers 500 to a PUT into a folder it may not create: say so, though it is retried.
        hint = " (nginx answers this to a write without create_full_put_path on)" if write and code == 500 else ""
        return Transient(f"{method} {shown}: HTTP {code}{hint}",
                         retry_after=_retry_after(resp.getheader("Retry-After")))
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


class HttpBackend(StreamingBackend):
    def __init__(self, url: str, policy: RetryPolicy | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"{_shown(url)!r}: an HTTP cache URL is http(s)://host/prefix")
        self.policy = policy or RetryPolicy.from_env()
        self.origin = _origin(url)
        self.base = _shown(url).rstrip("/")
        given = _basic(unquote(parts.username), unquote(parts.password or "")) if parts.username else None
        netrc = None if given else _netrc_auth(parts.hostname)
        self._read_auth = given or netrc
        self._write_auth = given or netrc or _env_auth()
        self._allowed = _allowed_origins(self.origin, self.policy.redirects_to)
        self._tls = threading.local()

    def where(self, name: str) -> str:
        return f"{self.base}/{name}"

    # --- connections: one per thread and origin, kept alive ---------------------------------

    def _conn(self, origin: str):
        conns = self._tls.__dict__.setdefault("conns", {})
        conn = conns.get(origin)
        if conn is not None:
            return conn, True
        import http.client

        proxy = _proxy(origin)
        scheme, _, hostport = origin.partition("://")
        host, _, port = hostport.rpartition(":")
        host = host.strip("[]")
        if scheme == "https":
            if proxy:
                conn = http.client.HTTPSConnection(proxy[0], proxy[1], context=_ssl(), blocksize=CHUNK)
                conn.set_tunnel(host, int(port), headers={"Proxy-Authorization": proxy[2]} if proxy[2] else None)
            else:
                conn = http.client.HTTPSConnection(host, int(port), context=_ssl(), blocksize=CHUNK)
        else:
            conn = http.client.HTTPConnection(*(proxy[:2] if proxy else (host, int(port))), blocksize=CHUNK)
        conn._llmgw_proxy = proxy if scheme == "http" else None
        conns[origin] = conn
        return conn, False

    def _drop(self, origin: str) -> None:
        conn = self._tls.__dict__.get("conns", {}).pop(origin, None)
        if conn is not None:
            conn.close()

    def _roundtrip(self, origin: str, method: str, url: str, headers: dict[str, str], body, watch: Watch):
        """One request on this thread's connection to `origin` and its answer's headers, with the
        socket it is read from. An idle kept-alive connection the server closed costs a reconnect,
        not an attempt."""
        import http.client

        shown = _shown(url)
        for again in (False, True):
            conn, reused = self._conn(origin)
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            hdrs = dict(headers)
            if conn._llmgw_proxy is not None:  # plain http through a proxy: the absolute URL
                target = _shown(url)
                if conn._llmgw_proxy[2]:
                    hdrs["Proxy-Authorization"] = conn._llmgw_proxy[2]
            if hasattr(body, "seek"):
                body.seek(0)
            try:
                timeout = watch.timeout()
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, target, body=body, headers=hdrs)
                sock = conn.sock
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                early = self._early_answer(conn, body) if body is not None else None
                if early is not None:
                    return early
                self._drop(origin)
                if reused and not again and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError,
                                                             BrokenPipeError, ConnectionAbortedError)):
                    continue
                raise _failed(method, shown, exc, watch) from None
            watch.got(0)
            return resp, sock
        raise AssertionError("unreachable")

    @staticmethod
    def _early_answer(conn, body):
        """The answer a server sent while refusing a body it would not take (nginx: 401 to a
        writer without credentials, 413 to one past client_max_body_size), if one can be read."""
        try:
            sock = conn.sock
            if sock is None:
                return None
            sock.settimeout(2)
            resp = conn.getresponse()
            return resp, sock
        except Exception:
            return None

    def _send(self, method: str, url: str, watch: Watch, *, headers: dict[str, str] | None = None,
              body=None, write: bool = False):
        """One attempt: (answer, its socket, its origin), read redirects followed (see the module
        docstring); the answer's body is still to be read."""
        for _ in range(MAX_REDIRECTS + 1):
            origin = _origin(url)
            hdrs = {"User-Agent": "llmgw-store", "Accept-Encoding": "identity", **(headers or {})}
            auth = (self._write_auth if write else self._read_auth) if origin == self.origin else None
            if auth:
                hdrs["Authorization"] = auth
            resp, sock = self._roundtrip(origin, method, url, hdrs, body, watch)
            if resp.status not in REDIRECT_STATUS or method not in ("GET", "HEAD"):
                return resp, sock, origin
            location = resp.getheader("Location") or ""
            self._finish(resp, origin)
            nxt = urljoin(url, location)
            if urlsplit(nxt).scheme not in ("http", "https") or not urlsplit(nxt).hostname:
                raise NetworkError(f"{method} {_shown(url)}: redirected to {_shown(nxt)[:200]!r}; refusing it")
            if "*" not in self._allowed and _origin(nxt) not in self._allowed:
                raise NetworkError(f"{method} {_shown(url)}: redirected to {_origin(nxt)}, not this cache's scheme and "
                                   f"host; refusing it (allow that origin with {REDIRECTS_ENV})")
            url = nxt
        raise NetworkError(f"{method} {_shown(url)}: more than {MAX_REDIRECTS} redirects; refusing it")

    def _finish(self, resp, origin: str) -> None:
        """Read a small answer's body to its end, so the connection can be used again (else drop it)."""
        try:
            resp.read(64 << 10)
        except OSError:
            pass
        if not resp.isclosed():
            self._drop(origin)

    # --- reads ---------------------------------------------------------------------------------

    @contextmanager
    def _open_url(self, url: str, offset: int, watch: Watch):
        import http.client

        shown = _shown(url)
        resp, sock, origin = self._send("GET", url, watch, headers={"Range": f"bytes={offset}-"} if offset else None)
        try:
            if resp.status == 404:
                yield None
                return
            if resp.status not in (200, 206):
                raise _status("GET", shown, resp)
            length = resp.getheader("Content-Length", "")
            declared = int(length) if length.isdigit() else None
            start, total = 0, declared
            if resp.status == 206:
                start, total = self._content_range(resp.getheader("Content-Range", ""), declared, shown)

            def read(n: int) -> bytes:
                try:
                    if sock is not None:
                        sock.settimeout(watch.timeout())
                    return resp.read1(n)
                except (OSError, http.client.HTTPException) as exc:
                    raise _failed("GET", shown, exc, watch) from None

            yield Opened(total, start, read)
        finally:
            if not resp.isclosed() and resp.length == 0:
                resp.read()  # read1 leaves a body read to its end open: this closes it, keeping the connection
            if not resp.isclosed():  # a body not read to its end (refused, an error, a failure): no reuse
                self._drop(origin)

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
            # A body object (not bytes): http.client sends it a block at a time, each send bounded
            # by the socket's timeout, so a stalled upload fails in its stall time.
            body = io.BytesIO(src) if isinstance(src, bytes) else open(src, "rb")
            try:
                resp, _, origin = self._send("PUT", url, watch, headers={"Content-Length": str(size)}, body=body,
                                             write=True)
            finally:
                body.close()
            self._finish(resp, origin)
            if resp.status not in (200, 201, 204):
                raise _status("PUT", url, resp, write=True)

        run(self.policy, f"PUT {url}", attempt)

    def size(self, name: str) -> int | None:
        url = self.where(object_name(name))

        def attempt(watch: Watch) -> int | None:
            resp, _, origin = self._send("HEAD", url, watch)
            self._finish(resp, origin)
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise _status("HEAD", url, resp)
            length = resp.getheader("Content-Length", "")
            return int(length) if length.isdigit() else 0

        return run(self.policy, f"HEAD {url}", attempt)

    def delete(self, name: str) -> None:
        url = self.where(object_name(name))

        def attempt(watch: Watch) -> None:
            resp, _, origin = self._send("DELETE", url, watch, write=True)
            self._finish(resp, origin)
            if resp.status not in (200, 202, 204, 404):
                raise _status("DELETE", url, resp, write=True)

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

