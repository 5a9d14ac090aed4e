"""The one exception family of llmgw-store.

    StoreError                      exit 1: an operation failed
    ├── UsageError                  exit 2: bad input from the user
    │   ├── RecipeError             a recipe file is malformed (names the file and the field)
    │   ├── NotFoundError           a store path, key or profile that does not exist
    │   │   └── NoStoreError        the root holds no store yet (a looking command has nothing to do)
    │   ├── AccessDeniedError       a root or file this user may not use (EACCES, EPERM)
    │   └── UnsafePathError         a directory to write into outside the root is a link or another user's
    ├── DiskFullError               no space left on the store's filesystem (ENOSPC, EDQUOT, SQLite's full)
    ├── ReadOnlyError               the filesystem or the index is read-only (EROFS)
    ├── NotPermittedError           the kernel refused root (EPERM: an immutable or append-only file)
    ├── LockTimeout                 exit 75 (EX_TEMPFAIL): a lock could not be had in time
    ├── NetworkError                an index or download could not be reached or answered badly
    │   └── OfflineError            something needed the network under --offline
    ├── NotSubstituted              --substitute-only: the key came from no cache (nothing built); by cause:
    │   ├── CacheMiss               exit 66: no cache asked has the key
    │   ├── CacheUnreachable        exit 69: a cache that might have it could not be reached (after retries)
    │   ├── CacheUntrusted          exit 77: a cache has it, signed by no key this node trusts
    │   └── CacheDamaged            exit 65: a cache has it, refused (bad signature, digest or size)
    ├── IntegrityError              bytes did not match their published digest
    │   └── UntrustedSignature      signed metadata, but by no key this node trusts
    ├── CommandError                a subprocess (uv, a verify command) failed; carries its output's tail
    └── IndexError_                 the SQLite index could not be read or written

Callers catch `StoreError`; the CLI prints `str(err)` on one line and exits with `err.exit_code`.
An OSError that says why the disk refused (full, read-only, not ours) is translated once, at the
CLI's boundary (`translated()`), into the typed error naming the file and the next step; any other
OSError stays a bug (an internal error).
"""

from __future__ import annotations

import _thread
import errno
import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a hot path loads this module)

if TYPE_CHECKING:
    from pathlib import Path

EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2
EX_TEMPFAIL = 75
# sysexits.h codes for why a --substitute-only command got nothing from its caches.
EX_DATAERR = 65  # damaged
EX_NOINPUT = 66  # miss
EX_UNAVAILABLE = 69  # unreachable
EX_NOPERM = 77  # untrusted


class StoreError(Exception):
    """Root of every error the library raises on purpose."""

    exit_code = EX_FAILED


class UsageError(StoreError):
    """The user's input (arguments, recipe, path) is wrong; nothing was changed."""

    exit_code = EX_USAGE


class NotFoundError(UsageError):
    """A store path, key, profile or generation named by the user does not exist."""


class UnsafePathError(UsageError):
    """A file the store was asked to write outside its root lies in a directory another user could
    swap it in (a link, another user's, writable by others): nothing was written."""


class NoStoreError(NotFoundError):
    """The root holds no store (nothing was ever built there, or --root has a typo). Commands that
    only look or collect (list, stats, verify, gc) answer "nothing to do" instead: a timer
    installed before the first build must not fail every night."""

    def __init__(self, message: str, root: str | Path = ""):
        self.root = str(root)
        super().__init__(message)

    def nothing_to(self, what: str) -> str:
        """The line a command that has nothing to do says instead of failing."""
        return f"no store at {self.root} yet: nothing to {what}"


class AccessDeniedError(UsageError):
    """The running user may not open or write a file or directory of the store (another user's root)."""


def _last_reason(output: str) -> str:
    """The line of a tool's output that best says why it failed: uv's `error:` line (with the
    `cause:`/hint lines it prints after it), else the last non-empty line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error:") or lines[i].startswith("×"):
            return cut_at_word(" ".join(lines[i : i + 4]), 600)
    return cut_at_word(lines[-1], 600) if lines else ""


def cut_at_word(text: str, limit: int) -> str:
    """`text` at most `limit` characters, cut at a word boundary with an ellipsis (never mid-word)."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip() + "…"


# The classes below are raised only when something fails, and each class statement costs (about
# 0.2 M instructions): they are made on first use (PEP 562: `from llmgw_store.core.errors import
# CacheMiss`, `errors.CacheMiss`), once, under a lock, and are then ordinary names of this module
# (the same class objects for every importer, `__qualname__` their name). A switch or a read that
# succeeds makes none of them (tests/test_hot_paths.py).
_RARE = ("RecipeError", "DiskFullError", "ReadOnlyError", "NotPermittedError", "LockTimeout", "NetworkError", "OfflineError", "NotSubstituted", "CacheMiss", "CacheUnreachable", "CacheUntrusted", "CacheDamaged", "IntegrityError", "UntrustedSignature", "CommandError", "IndexError_")
_making = _thread.allocate_lock()


def __getattr__(name: str) -> type:
    if name in _RARE:
        return _class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _class(name: str) -> type:
    """The rare error class `name`, made (with every other rare one) on first use."""
    made = globals().get(name)
    if made is not None:
        return made
    with _making:
        if name not in globals():
            globals().update(_make())
    return globals()[name]


def _make() -> dict[str, type]:
    class RecipeError(UsageError):
        """A recipe is malformed; the message names the file and the field."""

        def __init__(self, file: str | Path, field: str, problem: str):
            self.file, self.field, self.problem = str(file), field, problem
            where = f"{self.file}: {field}: " if field else f"{self.file}: "
            super().__init__(where + problem)

    class DiskFullError(StoreError):
        """No space is left where the store writes (ENOSPC, EDQUOT, or SQLite's SQLITE_FULL on the index);
        the message names the path, and the command changed nothing it had not finished. `gc` still runs
        on a full disk (its reserve, core/reserve.py): run it to make room."""

    class ReadOnlyError(StoreError):
        """The store's filesystem or its index file cannot be written (EROFS, SQLITE_READONLY); the
        message names the path. Commands that only look (list, info, verify, env, run) still work."""

    class NotPermittedError(StoreError):
        """The kernel refused root an operation on a file (EPERM): not an ownership problem, but an
        immutable or append-only attribute (chattr +i/+a), a security module, or a mount's flags."""

    class LockTimeout(StoreError):
        """A lock was held by another process for longer than the allowed wait."""

        exit_code = EX_TEMPFAIL

    class NetworkError(StoreError):
        """An index or a download failed (unreachable, HTTP error, malformed answer)."""

    class OfflineError(NetworkError):
        """The command needed the network (an index, a download, an HTTP cache) under --offline."""

    class NotSubstituted(StoreError):
        """--substitute-only: the key came from no binary cache, and building is not allowed. Raised
        as one of its subclasses, which say why (`cause`: the metrics' label and the JSON's `cause`);
        `details` is what the JSON error document carries besides (the key's inputs, what the caches
        hold of the same engine, version and variant)."""

        cause = "failed"

        def __init__(self, message: str, *, details: dict | None = None):
            self.details = details or {}
            super().__init__(message)

    class CacheMiss(NotSubstituted):
        """No cache asked has the key (each answered that it lacks it)."""

        exit_code = EX_NOINPUT
        cause = "miss"

    class CacheUnreachable(NotSubstituted):
        """A cache that might have the key could not be reached or answered badly, after its retries."""

        exit_code = EX_UNAVAILABLE
        cause = "unreachable"

    class CacheUntrusted(NotSubstituted):
        """A cache has the key, signed by no key this node trusts."""

        exit_code = EX_NOPERM
        cause = "untrusted"

    class CacheDamaged(NotSubstituted):
        """A cache has the key, but what it served failed a check (signature, digest, size, shape)."""

        exit_code = EX_DATAERR
        cause = "damaged"

    class IntegrityError(StoreError):
        """Downloaded bytes did not match the digest published for them; nothing was installed."""

    class UntrustedSignature(IntegrityError):
        """Cache metadata that no trusted key signed: no signature names a trusted key (one that names
        a trusted key and does not verify is a plain IntegrityError: damaged, or forged)."""

    class CommandError(StoreError):
        """A subprocess failed. The message is one line: what failed, the last line of its output that
        says why, and the log holding all of it; `output_tail` keeps the last lines for `-v`."""

        def __init__(self, message: str, *, output_tail: str = "", log: Path | None = None):
            self.output_tail, self.log = output_tail, log
            reason = _last_reason(output_tail)
            text = message + (f": {reason}" if reason else "")
            if log is not None:
                text += f" (full output: {log})"
            super().__init__(text)

    class IndexError_(StoreError):
        """The SQLite index could not be opened, migrated, read or written."""

    made = {c.__name__: c for c in (RecipeError, DiskFullError, ReadOnlyError, NotPermittedError, LockTimeout, NetworkError, OfflineError, NotSubstituted, CacheMiss, CacheUnreachable, CacheUntrusted, CacheDamaged, IntegrityError, UntrustedSignature, CommandError, IndexError_)}
    for c in made.values():
        c.__qualname__ = c.__name__
    return made


# errno values that say the disk refused, not that the program is wrong.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM)


def _where(exc: OSError) -> str:
    name = exc.filename if exc.filename is not None else None
    return f" {os.fsdecode(name)}" if isinstance(name, (str, bytes)) else ""


def from_os_error(exc: BaseException) -> StoreError | None:
    """The typed error for an OSError that says the disk is full, read-only or not this user's,
    naming the file and the next step; None for anything else (a bug: let it be one)."""
    if not isinstance(exc, OSError):
        return None
    where = _where(exc)
    if exc.errno in _FULL:
        return _class("DiskFullError")(f"no space left on the filesystem of{where or ' the store'} ({exc.strerror}): "
                             "free some space and try again (`llmgw-store gc --min-free SIZE` runs on a full disk)")
    if exc.errno == errno.EROFS:
        return _class("ReadOnlyError")(f"the filesystem of{where or ' the store'} is read-only: remount it read-write, or "
                             "use only commands that look (list, info, stats, verify, env, run)")
    if exc.errno == errno.EPERM and os.geteuid() == 0:
        # Root owns everything it may change: EPERM here is an attribute or a policy, never the owner.
        return _class("NotPermittedError")(f"operation not permitted:{where or ' a file of the store'}, even to root: most likely "
                                 "an immutable or append-only attribute (`lsattr -d` it; `chattr -i -a` clears it) "
                                 "or a security module")
    if exc.errno in _DENIED:
        return AccessDeniedError(f"permission denied:{where or ' a file of the store'}: run llmgw-store as the "
                                 f"user that owns the store (this is uid {os.geteuid()}), or pass another --root")
    return None


class translated:
    """Turn an OSError that says the disk is full, read-only or not ours into its typed StoreError
    (from_os_error): the one place the CLI (and the fast path) calls, around each command
    (`with translated(): ...`). A class, not contextlib's decorator: contextlib would bring
    functools and collections onto the cache hit's path (about 3 ms of a 17 ms hit)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, OSError):
            err = from_os_error(exc)
            if err is not None:
                raise err from exc
        return False
