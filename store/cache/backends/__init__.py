"""Where binary caches live, one backend per file behind the `Backend` protocol (base.py):

    file.py   file:///dir              a directory (local or NFS), through no-follow directory fds
    http.py   http(s)://host/prefix    GET/HEAD read, PUT writes, DELETE and nginx-style JSON
                                       listings of `prefix/<folder>/` for cache gc
    s3.py     s3://bucket/prefix       boto3 (optional)

Object names are flat (`<key>.json`) or one folder deep in the folders of FOLDERS
(`blobs/<digest>`, `roots/<node>.json`, ...); anything else is refused before it reaches a path or
URL. What a cache serves is hostile until checked: reads stream and stop as soon as an object passes
`max_bytes` (a declared length past it is refused before the body is read), and a `file://` object
that is a link or not a regular file is refused rather than followed.

Every request of the network backends runs under one retry policy (retry.py: attempts, jittered
backoff, deadlines, stalls), and an interrupted read resumes where it stopped (base.py). Choosing
among several caches is not a backend's job: cache/caches.py asks each in turn.
"""

from __future__ import annotations

from llmgw_store.base.errors import UsageError
from llmgw_store.cache.backends.base import CHUNK, FOLDERS, LISTED_NAME_RE, MAX_LISTED, OBJECT_NAME_RE, Backend, Listed
from llmgw_store.cache.backends.file import FileBackend
from llmgw_store.cache.backends.retry import RetryPolicy

__all__ = ["CHUNK", "FOLDERS", "LISTED_NAME_RE", "MAX_LISTED", "OBJECT_NAME_RE", "Backend", "FileBackend", "Listed",
           "RetryPolicy", "backend_for"]


def backend_for(url: str, policy: RetryPolicy | None = None) -> Backend:
    """The backend of a cache URL; `policy` (default: from the environment) governs its retries."""
    if url.startswith("file://"):
        from pathlib import Path

        return FileBackend(Path(url[len("file://"):]), policy)
    from llmgw_store.app import network
    from llmgw_store.app.credentials import public_url

    shown = public_url(url)  # messages never carry a cache's credentials
    network.require(f"the binary cache {shown}", "only file:// caches can be used offline")
    try:
        if url.startswith(("http://", "https://")):
            from llmgw_store.cache.backends.http import HttpBackend

            return HttpBackend(url, policy)
        if url.startswith("s3://"):
            from llmgw_store.cache.backends.s3 import S3Backend

            return S3Backend(url, policy)
    except ValueError as exc:  # urllib's: an unclosed [IPv6 literal, a port that is not a number
        raise UsageError(f"{shown!r}: not a cache URL ({exc})") from None
    raise UsageError(f"{shown!r}: a cache URL is file:///dir, http(s)://host/prefix or s3://bucket/prefix")
