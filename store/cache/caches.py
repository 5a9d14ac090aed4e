"""Several binary caches asked as one: each object and each blob is asked of every configured cache,
in order, until one serves it and it passes its checks.

A cache that fails — down after its retries (NetworkError), or serving something that fails a
check (IntegrityError) — is passed over with one line and asked nothing more by this command (a
cache that is down would cost each of thousands of blobs its retries; one that served bytes that
fail their digest is not asked for more). A cache that lacks an item simply passes it on to the
next. When no cache serves an item, the last failure is raised (it carries the cache's URL as
`exc.cache`), or None is returned when every cache lacks it.

What each cache did is kept for the command's report: `failed` (URL -> the failure that passed it
over), `served` (URL -> items it served), `reached` (when a cache last answered, serving or lacking).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from llmgw_store.app.credentials import public_url as shown
from llmgw_store.base.errors import IntegrityError, NetworkError, UsageError
from llmgw_store.base.report import say
from llmgw_store.cache.backends import Backend, RetryPolicy, backend_for
from llmgw_store.core import oplog

T = TypeVar("T")


class Caches:
    def __init__(self, urls: Sequence[str], policy: RetryPolicy | None = None):
        if not urls:
            raise UsageError("no binary cache given: pass --from (pull) or --substituter (build) with a cache URL")
        self.urls = tuple(urls)
        self.policy = policy or RetryPolicy.from_env()
        self._backends: dict[str, Backend] = {}
        self._failed: dict[str, BaseException] = {}
        self.served: dict[str, int] = {}
        self.reached = 0.0  # seconds since the epoch a cache last answered (0: none did)
        self._lock = threading.Lock()

    @property
    def failed(self) -> dict[str, BaseException]:
        with self._lock:
            return dict(self._failed)

    def backend(self, url: str) -> Backend:
        with self._lock:
            b = self._backends.get(url)
            if b is None:
                b = self._backends[url] = backend_for(url, self.policy)
            return b

    def check(self) -> None:
        """Every URL names a backend (UsageError for one that does not), before anything is asked."""
        for url in self.urls:
            self.backend(url)

    def first(self, op: Callable[[Backend], T]) -> T | None:
        """op(backend) for each cache still asked, in order, until one returns something (not None)."""
        failure: BaseException | None = None
        asked = False
        for url in self.urls:
            with self._lock:
                if url in self._failed:
                    continue
            asked = True
            try:
                result = op(self.backend(url))
            except (NetworkError, IntegrityError) as exc:
                exc.cache = shown(url)
                failure = exc
                self._pass_over(url, exc)
                continue
            oplog.cache_answered()
            with self._lock:
                self.reached = time.time()
                if result is not None:
                    self.served[url] = self.served.get(url, 0) + 1
            if result is not None:
                return result
        if failure is not None:
            raise failure
        if not asked:  # every cache failed earlier in this command: its failure stands for this item too
            url, last = list(self._failed.items())[-1]
            raise (IntegrityError if isinstance(last, IntegrityError) else NetworkError)(str(last), cache=shown(url))
        return None

    def _pass_over(self, url: str, exc: BaseException) -> None:
        with self._lock:
            first = url not in self._failed
            self._failed[url] = exc
            others = [u for u in self.urls if u not in self._failed]
        if first and others:  # the last one's failure is raised instead: one line either way
            say(f"cache {shown(url)}: {exc}; passing it over")
