"""A client for a package index's simple API (PEP 691 JSON), for the facts a key needs.

Only the cold path talks to an index: what it learns (a release's publication time, the latest
version) is memoised in the store's SQLite index by the caller, so a cache hit asks nothing.

`index_url` is always the public URL (app/credentials.py: no userinfo), which is what messages
name; credentials come as `auth` (from the URL the user gave) or from netrc, and are sent to the
index's origin only (httpx drops them on a redirect to another origin). Requests go through the
store's one HTTP stack (app/httpclient.py: its TLS, proxy and netrc rules).

Every request runs under the store's one retry policy (app/retry.py, the command's `cache.*`
settings): a connect error, a reset, a read that stalls, HTTP 408, 429 or 5xx is tried again until
the policy gives up, and the error then names the index. A download that fails is started again
from its first byte (an index file is not resumed: wheels are fetched by uv, this is the uv wheel
and source archives).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from llmgw_store.app import credentials, httpclient, network, retry
from llmgw_store.app.credentials import IndexAuth
from llmgw_store.app.retry import Transient
from llmgw_store.base.errors import IntegrityError, NetworkError, UsageError
from llmgw_store.base.report import progress
from llmgw_store.build.recipe import parse_time

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
CONNECT_TIMEOUT_S = 30.0


def normalize(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    upload_time: datetime | None
    yanked: bool
    version: str | None


def client(auth: IndexAuth | None = None, *, netrc: bool = True):
    """A client of the store's one HTTP stack (app/httpclient.py) sending `auth` (else, with
    `netrc`, the netrc entry of the request's host, if any: credentials.netrc_login), whose reads
    wait at most the command's stall time (app/retry.py). It follows redirects; httpx drops the
    credentials on one to another origin."""
    httpx = httpclient.load()

    policy = retry.current()
    how: object = None  # httpx.BasicAuth, or a function that signs a request
    if auth is not None:
        how = httpx.BasicAuth(auth.username, auth.password)
    elif netrc:
        how = httpclient.netrc_auth
    timeout = httpx.Timeout(policy.stall, connect=min(policy.stall, CONNECT_TIMEOUT_S))
    return httpclient.client(auth=how, follow_redirects=True, timeout=timeout, max_connections=8)


def attempted(what: str, op):
    """op(watch) under the command's retry policy: a transport error another attempt may get past
    (connect, reset, a timeout, a body cut short: httpclient.failed) is retried, as
    `check_transient` says of an answer; NetworkError once the policy gives up."""
    httpx = httpclient.load()

    def attempt(watch):
        try:
            return op(watch)
        except httpx.TransportError as exc:
            raise httpclient.failed(what, exc) from None

    return retry.run(retry.current(), what, attempt)


def check_transient(what: str, resp) -> None:
    """Raise Transient for an answer another attempt may get past (408, 429, 5xx)."""
    if retry.transient_status(resp.status_code):
        raise Transient(f"{what}: HTTP {resp.status_code}", retry_after=retry.retry_after(resp.headers.get("retry-after")))


def project_files(index_url: str, project: str, auth: IndexAuth | None = None) -> list[IndexFile]:
    """Every file the index lists for `project`, with its version parsed from the file name."""
    httpx = httpclient.load()
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    base = credentials.public_url(index_url).rstrip("/")
    url = f"{base}/{normalize(project)}/"
    network.require(f"asking the index {base} about {project}",
                    "pin version and as_of in the recipe (or pass --version and --as-of), or drop --offline")

    def get(watch):
        resp = http.get(url, headers={"Accept": JSON_ACCEPT})
        check_transient(f"the index {base} (GET {url})", resp)
        return resp

    try:
        with client(auth) as http:
            resp = attempted(f"the index {base} (GET {url})", get)
    except (NetworkError, httpx.HTTPError) as exc:
        raise NetworkError(f"cannot get an answer from the index: {exc}; check the network or pass --index-url") \
            from None
    if resp.status_code in (401, 403):
        raise NetworkError(f"the index {base} refused the request (HTTP {resp.status_code}): give its credentials "
                           "in the index URL (LLMGW_STORE_INDEX_URL or the config's index_url) or in netrc")
    if resp.status_code == 404:
        raise UsageError(f"the index {base} has no project {project!r} (check engine.pypi in the recipe)")
    if resp.status_code != 200:
        raise NetworkError(f"the index answered HTTP {resp.status_code} for {url}")
    if not resp.headers.get("content-type", "").startswith(JSON_ACCEPT):
        raise NetworkError(f"the index at {base} does not speak PEP 691 JSON (got {resp.headers.get('content-type')!r})")
    try:
        data = resp.json()
        entries = data["files"]
    except (ValueError, KeyError) as exc:
        raise NetworkError(f"malformed PEP 691 answer from {url}: {exc}") from exc
    files = []
    for f in entries:
        name = f.get("filename", "")
        try:
            if name.endswith(".whl"):
                version = str(parse_wheel_filename(name)[1])
            elif name.endswith((".tar.gz", ".zip")):
                version = str(parse_sdist_filename(name)[1])
            else:
                version = None
        except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
            version = None
        uploaded = f.get("upload-time")
        files.append(
            IndexFile(
                filename=name,
                url=str(resp.url.join(f.get("url", ""))),
                sha256=(f.get("hashes") or {}).get("sha256"),
                upload_time=_upload_time(uploaded, url) if uploaded else None,
                yanked=bool(f.get("yanked")),
                version=version,
            )
        )
    return files


def _upload_time(value: object, url: str) -> datetime:
    """A file's PEP 691 `upload-time`: the index is not trusted to send a string, nor a sane date."""
    if not isinstance(value, str):
        raise NetworkError(f"malformed PEP 691 answer from {url}: an upload-time that is not a string")
    return parse_time(value, lambda msg: NetworkError(f"malformed PEP 691 answer from {url}: upload-time {msg}"))


def latest_version(files: list[IndexFile], project: str, as_of: datetime | None = None) -> str:
    """The highest final release that has at least one file not yanked (with `as_of`: one uploaded
    by then, which is what a resolution bound by that date can see)."""
    from packaging.version import InvalidVersion, Version

    best = None
    for f in files:
        if f.version is None or f.yanked:
            continue
        if as_of is not None and (f.upload_time is None or f.upload_time > as_of):
            continue
        try:
            v = Version(f.version)
        except InvalidVersion:
            continue
        if not v.is_prerelease and (best is None or v > best):
            best = v
    if best is None:
        when = f" uploaded by {as_of.isoformat()}" if as_of is not None else ""
        raise UsageError(f"the index lists no final release of {project!r}{when}; give a version with --version")
    return str(best)


def publication_time(files: list[IndexFile], project: str, version: str) -> datetime:
    """When a release was published: the upload time of its last file (wheels for new platforms are
    often uploaded hours after the sdist, and the release is complete only then)."""
    from packaging.version import InvalidVersion, Version

    try:
        wanted = Version(version)
    except InvalidVersion:
        raise UsageError(f"{version!r} is not a valid version of {project}") from None
    mine = [f for f in files if f.version is not None and Version(f.version) == wanted]
    if not mine:
        raise UsageError(f"the index has no release {version} of {project!r}")
    times = [f.upload_time for f in mine if f.upload_time is not None]
    if not times:
        raise UsageError(
            f"the index publishes no upload-time for {project} {version}; set as_of in the recipe or pass --as-of"
        )
    return max(times)


def download(url: str, dest: Path, sha256: str, auth: IndexAuth | None = None, index_url: str = "") -> Path:
    """Stream `url` to `dest`, checking its sha256. The bytes land under a temporary name and are
    renamed to `dest` only after the digest matched, so `dest` is either absent or verified.
    `auth` is sent only when `url` is on the origin of `index_url` (the index it was listed by)."""
    httpx = httpclient.load()

    shown_url = credentials.public_url(url)
    network.require(f"downloading {shown_url}")
    if auth is not None and not credentials.same_origin(url, index_url):
        auth = None
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()

    def fetch(watch) -> None:
        nonlocal digest
        digest = hashlib.sha256()
        with http.stream("GET", url) as resp:
            check_transient(f"download of {shown_url}", resp)
            if resp.status_code != 200:
                raise NetworkError(f"download of {shown_url} failed: HTTP {resp.status_code}")
            total = int(resp.headers.get("content-length") or 0) or None
            done = 0
            with open(tmp, "wb") as out:
                for chunk in resp.iter_bytes(1 << 20):
                    watch.got(len(chunk))
                    digest.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    progress(f"downloading {dest.name}", done, total, "B")

    try:
        with client(auth) as http:
            attempted(f"download of {shown_url}", fetch)
    except httpx.HTTPError as exc:  # not a transport error: too many redirects, a body that does not decode
        tmp.unlink(missing_ok=True)
        raise NetworkError(f"download of {shown_url} failed: {exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != sha256.lower():
        tmp.unlink(missing_ok=True)
        raise IntegrityError(
            f"{shown_url}: sha256 is {digest.hexdigest()}, but the index publishes {sha256}; refusing it"
        )
    os.replace(tmp, dest)
    return dest
