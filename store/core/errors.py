"""The one exception family of llmgw-store.

    StoreError                      exit 1: an operation failed
    ├── UsageError                  exit 2: bad input from the user
    │   ├── RecipeError             a recipe file is malformed (names the file and the field)
    │   ├── NotFoundError           a store path, key or profile that does not exist
    │   └── UnsafePathError         a directory to write into outside the root is a link or another user's
    ├── LockTimeout                 exit 75 (EX_TEMPFAIL): a lock could not be had in time
    ├── NetworkError                an index or download could not be reached or answered badly
    │   └── OfflineError            something needed the network under --offline
    ├── NotSubstituted              --substitute-only: no binary cache has the key (nothing built)
    ├── IntegrityError              bytes did not match their published digest
    ├── CommandError                a subprocess (uv, a verify command) failed; carries its output's tail
    ├── IndexError_                 the SQLite index could not be read or written
    ├── DiskFullError               the filesystem (or the index's) has no space left (ENOSPC, SQLITE_FULL)
    └── ReadOnlyError               the filesystem (or the index file) cannot be written (EROFS, SQLITE_READONLY)

Callers catch `StoreError`; the CLI prints `str(err)` on one line and exits with `err.exit_code`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported: this module is on the hot path
if TYPE_CHECKING:
    from pathlib import Path

EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2
EX_TEMPFAIL = 75


class StoreError(Exception):
    """Root of every error the library raises on purpose."""

    exit_code = EX_FAILED


class UsageError(StoreError):
    """The user's input (arguments, recipe, path) is wrong; nothing was changed."""

    exit_code = EX_USAGE


class RecipeError(UsageError):
    """A recipe is malformed; the message names the file and the field."""

    def __init__(self, file: str | Path, field: str, problem: str):
        self.file, self.field, self.problem = str(file), field, problem
        where = f"{self.file}: {field}: " if field else f"{self.file}: "
        super().__init__(where + problem)


class NotFoundError(UsageError):
    """A store path, key, profile or generation named by the user does not exist."""


class UnsafePathError(UsageError):
    """A file the store was asked to write outside its root lies in a directory another user could
    swap it in (a link, another user's, writable by others): nothing was written."""


class LockTimeout(StoreError):
    """A lock was held by another process for longer than the allowed wait."""

    exit_code = EX_TEMPFAIL


class NetworkError(StoreError):
    """An index or a download failed (unreachable, HTTP error, malformed answer)."""


class OfflineError(NetworkError):
    """The command needed the network (an index, a download, an HTTP cache) under --offline."""


class NotSubstituted(StoreError):
    """--substitute-only: no binary cache asked has the key, and building is not allowed."""


class IntegrityError(StoreError):
    """Downloaded bytes did not match the digest published for them; nothing was installed."""


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


def _last_reason(output: str) -> str:
    """The line of a tool's output that best says why it failed: uv's `error:` line (with the
    `cause:`/hint lines it prints after it), else the last non-empty line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error:") or lines[i].startswith("×"):
            return " ".join(lines[i : i + 4])[:600]
    return lines[-1][:600] if lines else ""


class IndexError_(StoreError):
    """The SQLite index could not be opened, migrated, read or written."""


class DiskFullError(StoreError):
    """No space is left where the store writes (ENOSPC, or SQLite's SQLITE_FULL on the index);
    the message names the path. `gc` needs no new space to delete: run it to make room."""


class ReadOnlyError(StoreError):
    """The store's filesystem or its index file cannot be written (EROFS, SQLITE_READONLY); the
    message names the path. Read-only commands (list, info, verify) still work."""
