"""Retries, deadlines and stalls: the one policy for every request the store makes over a network —
a binary cache's (cache/backends/) and the package index's and release assets' (build/pypi.py,
build/fetch.py).

    a request    is retried until it has gone `retry_for` seconds without progress (since its
                 start, or since the last bytes it received): a cache or an index restarting, or
                 a network gone for less than that, is waited out at any point of a transfer. No
                 attempt starts after `deadline` seconds from the request's start, and none after
                 the `attempts`-th (0: no count, the clocks decide). Between two attempts, a wait
                 drawn uniformly from [b/2, b] with b = backoff * 2^(n-1), at most backoff_max, or
                 longer when the server's Retry-After asks for it: a lower bound, so that the
                 attempts spread over the window instead of all falling inside a short outage.
    an attempt   is worth another after a connect error, a reset, a timeout, a stall, a body cut
                 short, HTTP 408, 429 or 5xx (`Transient`); any other answer is final (404 is
                 "absent", a refusal of the bytes is an IntegrityError, never retried).
    a stall      a data transfer (a blob, an archive, a listing, an upload) that receives fewer than
                 PROGRESS_BYTES in `stall` seconds, the wait for its answer included, is abandoned
                 and retried. A document (a cache's `.json`: an object's metadata, a roots
                 document, a marker; at most 1 MiB) must arrive whole within `metadata_timeout` of
                 its attempt's start; one that does not is not tried again: a cache that drips one
                 byte at a time is passed over within that time (a restarting one refuses or
                 resets, which is retried).

A cache's read that delivered bytes before its attempt failed is resumed where it stopped
(cache/backends/base.py): the consumer sees one stream, and what was fetched is not fetched again.

Why not tenacity, stamina or urllib3's Retry: they retry a call; the unit here is a streaming
transfer whose consumer has already taken part of the bytes, resumed at an offset, with a clock
that each read (not the call) must beat. That loop is the code below and backends/base.py, about
a hundred lines, shared by the HTTP and S3 backends and the index's client; a library would wrap
only the easy half and add an import to every pull.
"""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from llmgw_store.base.errors import NetworkError, UsageError
from llmgw_store.base.report import say

PROGRESS_BYTES = 64 << 10  # what a data transfer must receive per stall period to count as moving


class Transient(NetworkError):
    """A failed attempt that another attempt may get past (see the module docstring)."""

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


# field -> environment variable; the config keys are `cache.<field>` (cli/config.py; docs/fleet.md,
# "Retries and stalls").
ENV = {
    "attempts": "LLMGW_STORE_CACHE_ATTEMPTS",
    "retry_for": "LLMGW_STORE_CACHE_RETRY_FOR",
    "stall": "LLMGW_STORE_CACHE_STALL",
    "metadata_timeout": "LLMGW_STORE_CACHE_METADATA_TIMEOUT",
    "deadline": "LLMGW_STORE_CACHE_DEADLINE",
    "redirects_to": "LLMGW_STORE_CACHE_REDIRECTS_TO",
}


@dataclass(frozen=True)
class RetryPolicy:
    """How a command talks to caches and indexes: its retries and clocks, and where a redirect may
    lead (the origins an HTTP cache may redirect reads to besides its own, space-separated; `*` for
    any)."""

    attempts: int = 0  # 0: no count; retry_for and deadline decide
    retry_for: float = 30.0  # seconds a failing request is retried after its last progress
    stall: float = 30.0  # seconds a data transfer may go without PROGRESS_BYTES
    metadata_timeout: float = 5.0  # seconds one attempt at a document may take
    deadline: float = 300.0  # seconds after a request's start when no new attempt begins
    backoff: float = 0.5  # the first wait's bound; doubled for each further attempt
    backoff_max: float = 10.0
    redirects_to: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.attempts, int) and 0 <= self.attempts <= 1000):
            raise UsageError(f"cache attempts {self.attempts!r}: give a whole number from 0 (no count) to 1000")
        for f in ("retry_for", "stall", "metadata_timeout", "deadline"):
            value = getattr(self, f)
            if not (isinstance(value, (int, float)) and 0 < value <= 86400):
                raise UsageError(f"cache {f.replace('_', ' ')} {value!r}: give seconds, more than 0, at most a day")

    @classmethod
    def from_env(cls, **given: float | int | str | None) -> RetryPolicy:
        """The policy for this process: each field from `given` (a command-line option, a library
        argument) when not None, else from its LLMGW_STORE_CACHE_* variable, else the default."""
        values: dict[str, Any] = {}  # per field: __post_init__ checks the numbers
        for f in fields(cls):
            if given.get(f.name) is not None:
                values[f.name] = given[f.name]
                continue
            var = ENV.get(f.name)
            text = os.environ.get(var, "").strip() if var else ""
            if not text:
                continue
            if f.name == "redirects_to":
                values[f.name] = text
                continue
            try:
                values[f.name] = int(text) if f.name == "attempts" else float(text)
            except ValueError:
                raise UsageError(f"{var}={text[:40]!r}: not a number") from None
        return cls(**values)


class Request:
    """One request's clocks: which attempt it is on, when it last made progress, when it must give up."""

    def __init__(self, policy: RetryPolicy, what: str, *, document: bool):
        self.policy, self.what, self.document = policy, what, document
        self.started = self.progressed = time.monotonic()
        self.deadline = self.started + policy.deadline
        self.attempt = 0

    def begin(self) -> Watch:
        self.attempt += 1
        return Watch(self)

    def retry(self, exc: Transient) -> None:
        """After a failed attempt: wait for the next one, or raise NetworkError when none is left."""
        p = self.policy
        if p.attempts and self.attempt >= p.attempts:
            raise NetworkError(f"{exc} (gave up after {self.attempt} attempts)") from None
        bound = min(p.backoff_max, p.backoff * 2 ** min(self.attempt - 1, 30))
        wait = random.uniform(bound / 2, bound)
        if exc.retry_after is not None:
            wait = max(wait, exc.retry_after)
        now = time.monotonic()
        if now + wait >= self.progressed + p.retry_for:
            raise NetworkError(f"{exc} (gave up after {self.attempt} attempt(s) in {now - self.started:.0f}s: "
                               f"{p.retry_for:g}s without progress, its retry_for)") from None
        if now + wait >= self.deadline:
            raise NetworkError(f"{exc} (gave up after {self.attempt} attempt(s): its deadline of {p.deadline:g}s "
                               "passed)") from None
        of = f" of {p.attempts}" if p.attempts else ""
        say(f"{exc}; trying again in {wait:.1f}s (attempt {self.attempt + 1}{of})")
        time.sleep(wait)


class Watch:
    """The clock of one attempt: the time by which it must have moved (a data transfer: another
    PROGRESS_BYTES; a document: the whole of it). Backends block on a read at most `timeout()`."""

    def __init__(self, request: Request):
        self.request = request
        self.count = 0
        clock = request.policy.metadata_timeout if request.document else request.policy.stall
        self.cutoff = time.monotonic() + clock

    def timeout(self) -> float:
        """Seconds this attempt may still wait; `stalled()` once there are none."""
        left = self.cutoff - time.monotonic()
        if left <= 0:
            raise self.stalled()
        return left

    def got(self, n: int) -> None:
        """`n` bytes arrived (0: an answer's headers, which count as moving for data, not as progress)."""
        if n:
            self.request.progressed = time.monotonic()
        if not self.request.document:
            self.count += n
            if n == 0 or self.count >= PROGRESS_BYTES:
                self.count = 0
                self.cutoff = time.monotonic() + self.request.policy.stall
        self.timeout()

    def stalled(self) -> NetworkError:
        """Transient for a data transfer; final (NetworkError) for a document: a server that
        answers but drips is not waited for again."""
        p = self.request.policy
        if self.request.document:
            return NetworkError(f"{self.request.what}: not received whole within {p.metadata_timeout:g}s (the "
                                "metadata timeout)")
        return Transient(f"{self.request.what}: less than {PROGRESS_BYTES >> 10} KiB in {p.stall:g}s (stalled)")


def run(policy: RetryPolicy, what: str, op, *, document: bool = False):
    """op(watch) until it returns, retried as the policy says (op raises Transient to ask for that)."""
    request = Request(policy, what, document=document)
    while True:
        watch = request.begin()
        try:
            return op(watch)
        except Transient as exc:
            request.retry(exc)


_current: RetryPolicy | None = None


def current() -> RetryPolicy:
    """The policy of the command running (`using`), else the one the environment gives: what the
    package index's client runs under, as the command's binary caches do."""
    return _current or RetryPolicy.from_env()


@contextmanager
def using(policy: RetryPolicy) -> Iterator[None]:
    """Make `policy` the process's for the block (a build's threads see it too)."""
    global _current
    before = _current
    _current = policy
    try:
        yield
    finally:
        _current = before


def retry_after(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for (a number or an HTTP date), at most an hour; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), 3600.0)
    try:
        return min(max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0), 3600.0)
    except (TypeError, ValueError):
        return None


def transient_status(code: int) -> bool:
    """Whether an HTTP status is worth another attempt: 408, 429, 5xx."""
    return code in (408, 429) or 500 <= code <= 599
