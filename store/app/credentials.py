"""A package index's credentials, kept out of everything the store records or shows.

A private mirror is named with its token in the URL (`https://__token__:SECRET@mirror/simple`,
from `--index-url`, `LLMGW_STORE_INDEX_URL` or the config's `index_url`) or by its plain URL with
the credential in a netrc file. Either way the credential reaches exactly two places:

- uv, through its child environment only (`UV_INDEX_URL` with the userinfo; or uv reads netrc
  itself): `/proc/<pid>/environ` is readable by the process's owner alone, while its argv
  (`/proc/<pid>/cmdline`) is readable by every local user;
- the store's own index queries (a release's date, the latest version, the uv wheel), as httpx
  basic auth sent to the index's origin only.

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
