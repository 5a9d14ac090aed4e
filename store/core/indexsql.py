"""What the index's readers and writers share, import-light: the fast paths (roots/switch.py,
integrity/reads.py) and core/index.py take the schema version, the file's facts, the statements
they run alike and the SQLite module from here, so none of them keeps a copy. Only os and sys are
imported, and SQLite itself when a connection is opened (`sqlite_module`).

Every statement a fast path runs is here, those the full index (core/index.py) runs too among
them; what only the full index runs stays there (the schema is schema.sql). No other module holds
SQL (tests/repo/test_architecture.py)."""

from __future__ import annotations

import os

SCHEMA_VERSION = 6  # the last `-- version N` of schema.sql (tests/core/test_index.py checks they agree)
BUSY_TIMEOUT_S = 30.0
DB_MODE = 0o600

PATH_BY = {"key": "SELECT * FROM paths WHERE key = ?", "name": "SELECT * FROM paths WHERE name = ?"}
PATHS_IN_ORDER = "SELECT * FROM paths ORDER BY engine, version, variant, created"
BUILDS_OF_KEY = "SELECT * FROM builds WHERE key = ? ORDER BY id"
PATH_KINDS = "SELECT name, engine, version, variant FROM paths"  # what `generations` says of each path
GENERATIONS_OF = "SELECT number, name, deleted FROM generations WHERE profile = ?"  # a switch's look
RECORD_GENERATION = ("INSERT OR REPLACE INTO generations (profile, number, name, created, created_by, deleted) "
                     "VALUES (?, ?, ?, ?, ?, NULL)")


def rows(conn, sql: str, params: tuple = ()) -> list[dict]:
    """The rows of `sql` as dicts of column -> value, in the statement's order."""
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def user() -> str:
    """getpass.getuser, without getpass."""
    name = next((os.environ[v] for v in ("LOGNAME", "USER", "LNAME", "USERNAME") if os.environ.get(v)), None)
    if name is None:
        try:
            import pwd

            name = pwd.getpwuid(os.getuid()).pw_name
        except (KeyError, OSError):
            name = str(os.getuid())
    return name


def whoami() -> str:
    """Who changes the index (a generation's `created_by`): user@host pid N, without socket."""
    return f"{user()}@{os.uname().nodename} pid {os.getpid()}"


def sqlite_module():
    """SQLite's own module (`_sqlite3`: the classes and functions `sqlite3` re-exports), loaded as
    a fast path needs it. Not the `sqlite3` package, whose dbapi2.py adds only date and time
    adapters and loads datetime for them (the index stores text). And without functools, which
    _sqlite3's initialisation imports only to take `lru_cache` for its statement cache: functools
    and what it brings (collections, operator, reprlib, keyword) cost a quarter of the interpreter's
    start, for the handful of statements a switch runs once each. While _sqlite3 initialises,
    `functools` is a stand-in whose `lru_cache` caches nothing (every statement is prepared when it
    runs), and is gone again afterwards: the real functools is what anything else imports, now or
    later; only the connections of this process go without the statement cache."""
    import sys

    if "_sqlite3" in sys.modules or "functools" in sys.modules:
        import _sqlite3

        return _sqlite3
    stand_in = type(sys)("functools")
    stand_in.lru_cache = _no_cache  # type: ignore[attr-defined]
    sys.modules["functools"] = stand_in
    try:
        import _sqlite3
    finally:
        if sys.modules.get("functools") is stand_in:
            del sys.modules["functools"]
    return _sqlite3


def _no_cache(maxsize: int = 128, typed: bool = False):
    """functools.lru_cache(maxsize) as _sqlite3 calls it, caching nothing."""
    return lambda function: function
