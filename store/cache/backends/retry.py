"""The retry policy of every request a cache backend makes: store/app/retry.py, the one module
the package index's client (build/pypi.py, build/fetch.py) runs under too. What is the backends'
own: a transfer's stall and its resumption where it stopped (backends/base.py), and which objects
are documents."""

from __future__ import annotations

from llmgw_store.app.retry import ENV, PROGRESS_BYTES, Request, RetryPolicy, Transient, Watch, run

__all__ = ["ENV", "PROGRESS_BYTES", "Request", "RetryPolicy", "Transient", "Watch", "is_document", "run"]


def is_document(name: str) -> bool:
    """Whether a cache object is a document (metadata, roots, markers: `.json`, at most 1 MiB) or data."""
    return name.endswith(".json")
