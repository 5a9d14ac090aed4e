"""Whether this command may use the network: all of it, or with `--offline` none but `file://`
binary caches.

The policy is process-wide for the length of a command (`offline(True)` around it): a build's
threads (the index prefetch, uv's version) see the same answer. Every place the store itself opens
a connection asks `require` first — the package index client (build/pypi.py), source and asset
downloads (build/fetch.py), an HTTP or S3 binary cache (cache/backends.py), a managed
interpreter's download (build/interpreters.py) — and uv, the one child that reaches the network,
runs with `UV_OFFLINE=1`. So a command that would need the network under `--offline` stops with
one line saying what needed it (exit 1), before it connects anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llmgw_store.base.errors import OfflineError

_offline = False


def is_offline() -> bool:
    return _offline


@contextmanager
def offline(on: bool = True) -> Iterator[None]:
    """Forbid the network for the block when `on` (nested blocks keep the strictest)."""
    global _offline
    before = _offline
    _offline = before or on
    try:
        yield
    finally:
        _offline = before


def require(what: str, hint: str = "") -> None:
    """Raise OfflineError naming `what` when the network is forbidden."""
    if _offline:
        raise OfflineError(f"{what} needs the network, and --offline forbids it" + (f"; {hint}" if hint else ""))
