"""The store's one HTTP stack: httpx, for every request the store makes itself — the package index's
and release API's (build/pypi.py, build/fetch.py) and a binary cache's (cache/backends/http.py).
One rule for each of:

    TLS          verified against the system's CA store (`ssl.create_default_context()`:
                 SSL_CERT_FILE or SSL_CERT_DIR override it), made once per process and only when
                 a request may need it (a plain-http cache never loads it).
    proxies      the environment's, as httpx reads them (`trust_env`): http_proxy, https_proxy,
                 all_proxy, no_proxy, upper-case too; an http:// or https:// proxy (socks5://
                 with httpx's socks extra); one it cannot use is a UsageError.
    credentials  never httpx's own: the caller's (a URL's userinfo), else the host's netrc entry
                 (`credentials.netrc_login`, the one netrc reader, which refuses a netrc others can
                 read), sent as HTTP Basic to that origin only (docs/operations.md, "Credentials").
    clocks       `clock(watch)`: each connect, upload, answer and body of an attempt waits at most
                 what its `Watch` (app/retry.py) has left when httpx asks (once per phase, not per
                 read): a body that stops is abandoned within the stall time of its last bytes,
                 one that drips within twice the stall time of its last progress.
    failures     `failed`: which transport errors another attempt may get past (app/retry.py runs
                 the attempts); a certificate that does not verify or a host that does not exist
                 is final.

httpx is imported inside functions only, through `load()`: a command that makes no request (the
hot paths, cli/fast.py) never loads it (about 60 ms of CPU and 12 MiB), and one that does loads
it without httpx's own command-line tool (`httpx._main`: click, pygments, rich).
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from llmgw_store.base.errors import NetworkError

USER_AGENT = "llmgw-store"
_contexts: dict[bool, object] = {}
_contexts_lock = threading.Lock()
_load_lock = threading.Lock()


def load():
    """The httpx module, imported without `httpx._main`, httpx's command-line tool: its package
    imports it and falls back to a stub `main` when that raises ImportError (httpx without its
    `cli` extra). The tool imports click (a dependency here, so the import succeeds) and pygments
    before failing on rich: 17 modules, 4–6 ms of the nginx follow's 110 ms of CPU (bench/README.md),
    and click on the fast follow's path (tests/roots/test_release_follow_fast.py). The store never
    runs `httpx.main`."""

    if "httpx" not in sys.modules:
        with _load_lock:  # one thread blocks and unblocks httpx._main
            if "httpx" not in sys.modules:
                blocked = sys.modules.setdefault("httpx._main", None) is None  # type: ignore[arg-type]  # None: its import fails
                try:
                    import httpx
                finally:
                    if blocked and sys.modules.get("httpx._main", 0) is None:
                        del sys.modules["httpx._main"]
    # Always the import statement: another thread's import still under way is waited for (its
    # module lock), never handed out half made from sys.modules.
    import httpx

    return httpx


def tls_context(needed: bool = True):
    """The process's SSL context: the system's CA store; or, when no TLS is expected (`needed`
    False: a plain-http cache that may redirect nowhere else), a context that trusts nothing, so that
    loading the CA store is not paid for and a TLS connection nobody expected fails closed."""
    import ssl

    with _contexts_lock:
        ctx = _contexts.get(needed)
        if ctx is None:
            if needed:
                ctx = ssl.create_default_context()
            else:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, with no CA: refuses every peer
            _contexts[needed] = ctx
        return ctx


def client(*, auth=None, follow_redirects: bool = False, timeout=None, tls: bool = True, max_connections: int = 32):
    """An httpx client under the rules above. `auth`: an httpx auth (else none is sent); `timeout`:
    httpx's, for requests that do not carry a `clock`."""
    httpx = load()

    from llmgw_store.base.errors import UsageError

    try:
        return httpx.Client(
            verify=tls_context(tls), trust_env=True, follow_redirects=follow_redirects, auth=auth,
            headers={"User-Agent": USER_AGENT}, timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
    except ImportError:
        raise UsageError("the environment names a SOCKS proxy (all_proxy, https_proxy or http_proxy): that "
                         "needs httpx's socks extra (pip install 'httpx[socks]')") from None
    except ValueError:  # its text would show the proxy's URL, and its user name
        raise UsageError("the environment's proxy (all_proxy, https_proxy or http_proxy) is not an http://, "
                         "https:// or socks5:// URL") from None


def basic(user: str, password: str) -> str:
    """An HTTP Basic Authorization value."""
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def netrc_auth(request):
    """httpx auth (a callable): the netrc entry of the request's host, if any, as HTTP Basic. Applied
    to a request as it is sent, not to a redirect's (httpx strips Authorization across origins)."""
    from llmgw_store.app.credentials import netrc_login

    login = netrc_login(request.url.host)
    if login is not None:
        request.headers["Authorization"] = basic(*login)
    return request


class clock(dict):
    """A request's `timeout` extension whose every value is what `watch` has left when httpx asks
    (before the connect, before the body is sent, before the answer's headers and again before its
    body): a mapping httpcore reads with `.get`."""

    def __init__(self, watch) -> None:
        super().__init__()
        self.watch = watch

    def get(self, key, default=None):  # every key is a clock
        return max(0.001, self.watch.cutoff - time.monotonic())

    def __getitem__(self, key):
        return self.get(key)


def failed(what: str, exc: BaseException, watch=None) -> NetworkError:
    """What an httpx error of an attempt means: Transient (another attempt may get past it), the
    watch's stall when its clock ran out, or a final NetworkError (a certificate that does not
    verify, a host name that does not exist)."""
    import ssl

    httpx = load()

    from llmgw_store.app.retry import Transient

    if isinstance(exc, httpx.TimeoutException) and watch is not None and watch.cutoff <= time.monotonic():
        return watch.stalled()
    cause: BaseException | None = exc
    for _ in range(8):  # httpx's error from httpcore's from the OSError
        if cause is None:
            break
        if isinstance(cause, ssl.SSLCertVerificationError):
            return NetworkError(f"{what}: {cause.verify_message or cause}")
        if isinstance(cause, socket.gaierror) and cause.errno == socket.EAI_NONAME:
            return NetworkError(f"{what}: unknown host ({cause.strerror})")
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
        return NetworkError(f"{what}: {exc}")
    return Transient(f"{what}: {exc or type(exc).__name__}")
