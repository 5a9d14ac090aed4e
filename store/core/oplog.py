"""When each maintenance operation last succeeded and how often it failed: what `stats
--prometheus` turns into the metrics an alert needs (a node whose gc stopped running, a verify
that found damage).

    ROOT/var/ops/<op>.json     {"last_success": t, "last_failure": t, "successes": n, "failures": n,
                                "damaged": n, "causes": {cause: n}}
                               pull.json also: "last_cache_contact": t, "bytes_fetched": n
                               (t: seconds since the epoch; damaged: verify's last count)

`recorded(op)` wraps the library function of `gc`, `verify`, `build` and `pull`. A build whose
path came from a binary cache (how "substituted"), or that got nothing under --substitute-only (a
NotSubstituted), counts as a `pull`: a pull-only node's metrics are its pulls. Each failure counts
under its cause too (`cause_of`: miss, unreachable, untrusted, damaged, disk_full, command, ...).
While an operation runs, the cache layer says when a cache answered (`cache_answered`) and how
many bytes it fetched (`fetched`); pull.json keeps the last answer's time and the bytes' total
whatever the operation's outcome. A run that returns counts as a success (a verify that finds damage, or a gc dry run, does not: the first is
a failure, the second is not recorded); one that raises counts as a failure, except a usage error
(bad input: nothing was attempted), a lock timeout (cron tries again; a gc that never gets the lock
shows as a stale success time) and a root with no store yet. Each file is updated under its own
flock (read, change, write in place), so two processes finishing at once both count. Recording
is best effort: a full, read-only or foreign var/ never turns an operation's outcome into an error.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from llmgw_store.base.errors import (
    CommandError,
    DiskFullError,
    IntegrityError,
    LockTimeout,
    NetworkError,
    UntrustedSignature,
    UsageError,
)
from llmgw_store.core import locations
from llmgw_store.core.dirs import open_var, private_dir
from llmgw_store.core.layout import Layout

OPS = ("gc", "verify", "build", "pull")
FIELDS = ("last_success", "last_failure", "successes", "failures", "damaged", "last_cache_contact", "bytes_fetched")
CACHE_FIELDS = ("last_cache_contact", "bytes_fetched")  # pull.json's only
CAUSES = ("miss", "unreachable", "untrusted", "damaged", "disk_full", "command", "other")
MAX_BYTES = 4096
class _Session(TypedDict):
    contact: float  # when a cache last answered (time.time())
    fetched: int  # bytes


# What the running operation's cache layer reported (one operation at a time per process).
_session: _Session = {"contact": 0.0, "fetched": 0}


def cache_answered() -> None:
    """A binary cache answered (served, or said it lacks something) just now."""
    _session["contact"] = time.time()


def fetched(n: int) -> None:
    """A pull or substitution fetched `n` bytes from binary caches."""
    _session["fetched"] += max(0, int(n))


def cause_of(exc: BaseException) -> str:
    """The `cause` label of a failure."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, str) and cause in CAUSES:
        return cause
    if isinstance(exc, UntrustedSignature):
        return "untrusted"
    for kind, name in ((IntegrityError, "damaged"), (NetworkError, "unreachable"), (DiskFullError, "disk_full"),
                       (CommandError, "command")):
        if isinstance(exc, kind):
            return name
    return "other"
_QUIET = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ELOOP,
          errno.ENOTDIR)


def recorded(op: str) -> Callable:
    """Decorate the library function of `op` (it takes `root=` and maybe `dry_run=`)."""
    assert op in OPS

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kw: Any) -> Any:
            root = kw.get("root")
            _session.update({"contact": 0.0, "fetched": 0})
            try:
                result = fn(*args, **kw)
            except (UsageError, LockTimeout):
                _cache_facts(root)
                raise
            except Exception as exc:
                _cache_facts(root)
                note(root, "pull" if getattr(exc, "cause", None) in CAUSES else op, ok=False, cause=cause_of(exc))
                raise
            _cache_facts(root)
            if not kw.get("dry_run"):
                damaged = getattr(result, "damaged", None)
                note(root, "pull" if getattr(result, "how", None) == "substituted" else op, ok=not damaged,
                     damaged=None if damaged is None else len(damaged))
            return result

        return run

    return wrap


def _open_dir(layout: Layout) -> int | None:
    """var/ops/ (made 0700 in the 0700 var/ if missing), checked as the build memo's directory is
    (never through a link, the running user's, writable by no one else); None if it is not so."""
    var = open_var(str(layout.root))
    if var is None:
        return None
    try:
        return private_dir(locations.leaf(locations.OPS), var, True)
    except OSError:
        return None
    finally:
        os.close(var)


def _cache_facts(root: str | Path | None) -> None:
    if _session["contact"] or _session["fetched"]:
        note(root, "pull", ok=None, contact=_session["contact"], fetched=_session["fetched"])
        _session.update({"contact": 0.0, "fetched": 0})


def note(root: str | Path | None, op: str, *, ok: bool | None, damaged: int | None = None, at: float | None = None,
         cause: str | None = None, contact: float = 0.0, fetched: int = 0) -> None:
    """Count one outcome of `op` in the store at `root` (best effort); `ok` None: no outcome, only
    the cache facts (`contact`: when a cache last answered, `fetched`: bytes to add)."""
    layout = Layout.at(root)
    if not os.path.isdir(layout.store):
        return
    d = _open_dir(layout)
    if d is None:
        return
    try:
        fd = os.open(f"{op}.json", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=d)
    except OSError:
        os.close(d)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read and a write of a few bytes
        state = _parse(os.pread(fd, MAX_BYTES, 0))
        now = time.time() if at is None else at
        if ok is not None:
            key = "successes" if ok else "failures"
            state[key] = int(state.get(key, 0)) + 1
            state["last_success" if ok else "last_failure"] = now
        if not ok and cause is not None:
            state["causes"][cause] = int(state["causes"].get(cause, 0)) + 1
        if contact:
            state["last_cache_contact"] = max(contact, float(state.get("last_cache_contact", 0)))
        if fetched:
            state["bytes_fetched"] = int(state.get("bytes_fetched", 0)) + fetched
        if damaged is not None:
            state["damaged"] = damaged
        data = json.dumps(state, sort_keys=True).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as exc:
        if exc.errno not in _QUIET:
            raise
    finally:
        os.close(fd)
        os.close(d)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        return {"causes": {}}  # a write cut short: the counters start again (Prometheus sees a counter reset)
    if not isinstance(doc, dict):
        return {"causes": {}}
    out: dict[str, Any] = {k: v for k, v in doc.items() if k in FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)}
    causes = doc.get("causes")
    out["causes"] = {c: n for c, n in causes.items() if c in CAUSES and isinstance(n, int) and not isinstance(n, bool)
                     } if isinstance(causes, dict) else {}
    return out


def read_all(layout: Layout) -> dict[str, dict[str, Any]]:
    """op -> its record (every field present: timestamps 0 and counts 0 when it never ran; the
    cache's fields in pull's only; `causes`, cause -> failures, once one failed)."""
    out = {}
    for op in OPS:
        state: dict[str, Any] = {}
        try:
            fd = os.open(layout.ops / f"{op}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                state = _parse(os.read(fd, MAX_BYTES))
            finally:
                os.close(fd)
        except OSError:
            pass
        out[op] = {f: state.get(f, 0) for f in FIELDS if op == "pull" or f not in CACHE_FIELDS}
        if state.get("causes"):
            out[op]["causes"] = state["causes"]
    return out
