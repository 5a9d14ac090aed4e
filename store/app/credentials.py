"""A package index's credentials, kept out of everything the store records or shows.

A private mirror is named with its token in the URL (`https://__token__:SECRET@mirror/simple`,
from `--index-url`, `LLMGW_STORE_INDEX_URL` or the config's `index_url`) or by its plain URL with
the credential in a netrc file. Either way the credential reaches exactly two places:

- uv, through its child environment only (`UV_INDEX_URL` with the userinfo; or uv reads netrc
  itself): `/proc/<pid>/environ` is readable by the process's owner alone, while its argv
  (`/proc/<pid>/cmdline`) is readable by every local user;
- the store's own index queries (a release's date, the latest version, the uv wheel), as httpx
  basic auth sent to the index's origin only.

A credential in netrc is read by `netrc_login`, the one netrc reader of every request the store
makes (index and caches; docs/operations.md, "HTTP: one stack ...").

Everything else — the key's inputs, the manifest, generation records, cache metadata, the index's
memo tables, logs, progress and error lines, a child's argv — sees `public_url(url)`, the URL with
its userinfo removed. So a token rotation changes no key, and no store path depends on a secret.
"""

from __future__ import annotations

import os

# Imports nothing else at module level: the build memo (build/memo.py, on the hot path) strips
# userinfo with `public_url` too, so a memo key never holds a token either.


class IndexAuth:
    """A username and password for one index (its repr shows neither)."""

    __slots__ = ("username", "password")

    def __init__(self, username: str, password: str) -> None:
        self.username, self.password = username, password

    def __repr__(self) -> str:
        return "IndexAuth(<redacted>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IndexAuth) and (self.username, self.password) == (other.username, other.password)

    def __hash__(self) -> int:
        return hash((self.username, self.password))


def _netloc(url: str) -> tuple[str, str, str] | None:
    """(scheme://, netloc, rest) of an absolute URL, or None."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        return None
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    return scheme + sep, rest[:cut], rest[cut:]


def public_url(url: str) -> str:
    """`url` without its userinfo (`user:password@`); every other part as it was."""
    parts = _netloc(url)
    if parts is None or "@" not in parts[1]:
        return url
    return parts[0] + parts[1].rpartition("@")[2] + parts[2]


def auth_of(url: str) -> IndexAuth | None:
    """The credentials `url` carries in its userinfo (percent-decoded), or None."""
    from urllib.parse import unquote

    parts = _netloc(url)
    if parts is None or "@" not in parts[1]:
        return None
    user, _, password = parts[1].rpartition("@")[0].partition(":")
    return IndexAuth(unquote(user), unquote(password))


def for_index(public: str, given: str | None) -> IndexAuth | None:
    """The credentials of `given` (a URL the user configured, maybe with userinfo) when it names the
    index `public` (a recorded URL, userinfo removed); else None (netrc may still have them)."""
    if not given or public_url(given).rstrip("/") != public.rstrip("/"):
        return None
    return auth_of(given)


def with_auth(public: str, auth: IndexAuth | None) -> str:
    """The URL uv is given in its environment: `public` with `auth` as its userinfo."""
    parts = _netloc(public)
    if auth is None or parts is None:
        return public
    from urllib.parse import quote

    userinfo = quote(auth.username, safe="") + (":" + quote(auth.password, safe="") if auth.password else "")
    return f"{parts[0]}{userinfo}@{parts[1].rpartition('@')[2]}{parts[2]}"


def same_origin(url: str, index: str) -> bool:
    """Whether `url` is on the index's scheme, host and port (the only place its credentials go)."""
    from urllib.parse import urlsplit

    try:
        a, b = urlsplit(url), urlsplit(index)
        return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port) and bool(a.hostname)
    except ValueError:
        return False


def netrc_file() -> str | None:
    """The netrc file uv and the store read: `$NETRC`, else `~/.netrc`, if it exists."""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    return path if os.path.isfile(path) else None


def netrc_login(host: str) -> tuple[str, str] | None:
    """(login, password) of the netrc entry for `host` (`machine HOST`, else `default`), if any: the
    one netrc rule of every request the store makes (the package index, binary caches). A netrc
    others could read or write, or owned by someone else, is refused with UsageError (Python's
    netrc does so for ~/.netrc only): its passwords are not secrets any more, or not ours."""
    import stat

    from llmgw_store.base.errors import UsageError

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
    entry = _netrc_entry(text, host.lower())
    return entry if entry is not None and entry[0] else None


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
            current, fields = (next(tokens, "").lower() if tok == "machine" else "\0default"), {}
        elif tok in ("login", "password", "account") and current is not None:
            fields[tok] = next(tokens, "")
    if current is not None and current not in found:
        found[current] = (fields.get("login", ""), fields.get("password", ""))
    return found.get(host) or found.get("\0default")
