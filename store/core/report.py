"""Progress: one reporter for the whole process, set once by whoever drives the library (the CLI),
and called wherever a step starts or moves on. No callback is threaded through signatures.

The sink is a module global rather than a context variable on purpose: hashing and downloads run
in worker threads, which must report to the same place as the thread that started them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


def _nowhere(_: str) -> None:
    pass


_sink: Callable[[str], None] = _nowhere


def say(message: str) -> None:
    """Report one line of progress (`$ cmd` lines are the commands run: shown with -v)."""
    _sink(message)


@contextmanager
def reporting_to(sink: Callable[[str], None]) -> Iterator[None]:
    """Send progress to `sink` while the block runs (the CLI wraps each command in this)."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = previous
