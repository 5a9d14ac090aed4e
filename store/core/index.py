"""The SQLite index of what the store holds: a cache of the manifests plus memos of slow facts.

Invariant: a row in `paths` exists only for a directory that is complete, read-only and renamed
into `store/`; the row is inserted after the rename, in the same transaction as its build-log row.
The index is in WAL mode, so readers (a cache-hit `build`, `list`) never wait for a writer, and a
busy timeout (30 s, or the caller's lock timeout when shorter) covers writers queuing behind each
other. The database and its -wal and -shm are 0600 in the 0700 var/ (layout.ensure): SQLite locks
them with fcntl, and a user who could open -shm could hold those locks and stop every writer.

The schema version lives in `PRAGMA user_version`; `MIGRATIONS[i]` takes version i to i + 1.
Reads on the cache-hit path use plain sqlite3; sqlite-utils (slow to import) is loaded only to
create or migrate the schema and for inserts.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from llmgw_store.core.errors import IndexError_, LockTimeout, StoreError, from_os_error, from_sqlite_error
from llmgw_store.core.keys import is_store_name
from llmgw_store.core.layout import malformed_name
from llmgw_store.core.report import say

BUSY_TIMEOUT_S = 30.0
DB_MODE = 0o600


def _private_db_files(db: Path) -> None:
    """Create the database 0600 before SQLite opens it (SQLite gives -wal and -shm the database's
    mode), and close up the files of an index made by an older llmgw-store. Never follows a link."""
    for path, create in ((db, True), (Path(f"{db}-wal"), False), (Path(f"{db}-shm"), False)):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, DB_MODE)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise (from_os_error(exc) or IndexError_(f"cannot open the index {path}: {exc}; it must be a plain file")) from exc
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, DB_MODE)
        finally:
            os.close(fd)


def _frozen(db: Path) -> bool:
    """Whether `db` lies on a read-only filesystem with no WAL content beside it (what an
    immutable read would miss)."""
    try:
        if not os.statvfs(db.parent).f_flag & os.ST_RDONLY:
            return False
        return os.stat(f"{db}-wal").st_size == 0
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _well_formed(row: dict[str, Any]) -> dict[str, Any]:
    if not is_store_name(row["name"]):
        raise malformed_name(row["name"])
    return row


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _v1(db) -> None:
    db["paths"].create(
        {
            "name": str, "key": str, "engine": str, "version": str, "variant": str, "as_of": str,
            "uv_version": str, "python": str, "inputs": str, "content_hash": str, "size": int,
            "files": int, "build_seconds": float, "created": str, "last_used": str,
        },
        pk="name",
        if_not_exists=True,
    )
    db["paths"].create_index(["key"], unique=True, if_not_exists=True)
    db["builds"].create(
        {
            "id": int, "key": str, "name": str, "pid": int, "host": str, "started": str,
            "finished": str, "outcome": str, "seconds": float, "error": str,
        },
        pk="id",
        if_not_exists=True,
    )
    db["builds"].create_index(["key"], if_not_exists=True)
    db["releases"].create(
        {"index_url": str, "project": str, "version": str, "published": str},
        pk=("index_url", "project", "version"),
        if_not_exists=True,
    )
    db["latest"].create(
        {"index_url": str, "project": str, "version": str, "fetched": float},
        pk=("index_url", "project"),
        if_not_exists=True,
    )
    db["tools"].create({"kind": str, "ident": str, "stamp": str, "info": str}, pk=("kind", "ident"), if_not_exists=True)


def _v2(db) -> None:
    db["generations"].create(
        {"profile": str, "number": int, "name": str, "created": str, "created_by": str, "deleted": str},
        pk=("profile", "number"),
        if_not_exists=True,
    )
    db["switches"].create(
        {"id": int, "profile": str, "from_number": int, "to_number": int, "at": str, "by": str, "kind": str},
        pk="id",
        if_not_exists=True,
    )
    db["pins"].create({"name": str, "path_name": str, "created": str}, pk="name", if_not_exists=True)


def _v3(db) -> None:
    # References between store paths, recorded once at registration (Nix's Refs table): gc's
    # closure and push read them here instead of re-deriving them from the trees.
    db["refs"].create({"referrer": str, "reference": str}, pk=("referrer", "reference"), if_not_exists=True)
    db["refs"].create_index(["reference"], if_not_exists=True)


def _v_gc_records(db) -> None:
    # gc's own memory (roots/cachelog.py, roots/gc.py): which cache entries each store path was
    # built from (kept for repair and cold rollback), and when gc last saw each path rooted (the
    # grace period). New tables only, so this step is independent of every other migration.
    db["cache_uses"].create({"path_name": str, "cache": str, "entry": str, "used_at": str},
                            pk=("path_name", "cache", "entry"), if_not_exists=True)
    db["cache_uses"].create_index(["cache", "entry"], if_not_exists=True)
    db["gc_rooted"].create({"name": str, "last_rooted": str}, pk="name", if_not_exists=True)


class _NeedsSqliteUtils(Exception):
    """A migration step used more of sqlite-utils' API than _Schema offers."""


class _Schema:
    """The part of sqlite_utils.Database the migrations use — `db[t].create(columns, pk=,
    if_not_exists=)` and `db[t].create_index(columns, unique=, if_not_exists=)` — issuing the same
    SQL (same table text, same index names), so an index made either way is the same file
    (tests/test_index.py compares them). Anything else raises _NeedsSqliteUtils."""

    TYPES = {str: "TEXT", int: "INTEGER", float: "REAL", bytes: "BLOB"}

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __getitem__(self, table: str) -> "_Schema._Table":
        return _Schema._Table(self.conn, table)

    def __getattr__(self, name: str):
        raise _NeedsSqliteUtils(name)

    class _Table:
        def __init__(self, conn: sqlite3.Connection, name: str) -> None:
            self.conn, self.name = conn, name

        def __getattr__(self, name: str):
            raise _NeedsSqliteUtils(name)

        def create(self, columns: dict, pk=None, if_not_exists: bool = False, **more) -> None:
            if more or not isinstance(columns, dict) or any(t not in _Schema.TYPES for t in columns.values()):
                raise _NeedsSqliteUtils("create")
            pks = [pk] if isinstance(pk, str) else list(pk or ())
            cols = [f'   "{c}" {_Schema.TYPES[t]}' + (" PRIMARY KEY" if pks == [c] else "")
                    for c, t in columns.items()]
            if len(pks) > 1:
                cols.append("   PRIMARY KEY (" + ", ".join(f'"{c}"' for c in pks) + ")")
            exists = "IF NOT EXISTS " if if_not_exists else ""
            self.conn.execute(f'CREATE TABLE {exists}"{self.name}" (\n' + ",\n".join(cols) + "\n)")

        def create_index(self, columns, unique: bool = False, if_not_exists: bool = False, **more) -> None:
            if more or not all(isinstance(c, str) for c in columns):
                raise _NeedsSqliteUtils("create_index")
            index = f"idx_{self.name}_" + "_".join(columns)
            self.conn.execute(f'CREATE {"UNIQUE " if unique else ""}INDEX {"IF NOT EXISTS " if if_not_exists else ""}'
                              f'"{index}"\n    ON "{self.name}" (' + ", ".join(f'"{c}"' for c in columns) + ")")


MIGRATIONS: list[Callable] = [_v1, _v2, _v3, _v_gc_records]
SCHEMA_VERSION = len(MIGRATIONS)


def row_from_manifest(doc: dict[str, Any]) -> dict[str, Any]:
    """The `paths` row of a store path, from its manifest (a build's, a pull's or doctor's)."""
    inputs = doc.get("inputs") or {}
    python = inputs.get("python") or {}
    return {
        "name": doc["name"],
        "key": doc["key"],
        "engine": doc["engine"],
        "version": doc["version"],
        "variant": doc["variant"],
        "as_of": inputs.get("as_of"),
        "uv_version": inputs.get("uv", inputs.get("version")),
        "python": python.get("version"),
        "inputs": json.dumps(inputs, sort_keys=True),
        "content_hash": doc["content_hash"],
        "size": doc["size"],
        "files": doc["files"],
        "build_seconds": doc["build_seconds"],
        "created": doc["installed"],
        "last_used": doc["installed"],
    }


def index_error(path: Path, what: str, exc: sqlite3.Error) -> StoreError:
    """The error for `what` failing on the index at `path`. When SQLite says the file is damaged
    (corrupt pages, not a database at all), the message says how to recover: the index is a cache
    of the manifests and the links, and doctor rebuilds it from them. A full or read-only
    filesystem is DiskFullError or ReadOnlyError (errors.from_sqlite_error)."""
    typed = from_sqlite_error(path, exc)
    if typed is not None:
        return typed
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return IndexError_(f"the index {path} is damaged ({exc}); run `llmgw-store doctor --rebuild-index` to "
                           f"rebuild it from the store's manifests (the damaged file is kept)")
    return IndexError_(f"{what}: {exc}")


class Index:
    def __init__(self, path: Path, store_dir: Path | None = None, busy_timeout: float = BUSY_TIMEOUT_S, *,
                 readonly: bool = False, exclusive: bool = False):
        self.path, self.store_dir = path, store_dir
        self.busy_timeout = min(busy_timeout, BUSY_TIMEOUT_S)
        if not readonly:
            _private_db_files(path)
        try:
            if readonly:
                # mode=ro: SQLite opens the file without creating it or anything beside it but the
                # WAL index it needs to read; nothing this connection does can write the store.
                uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
                self.conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout, isolation_level=None)
                self.conn.row_factory = sqlite3.Row
                try:
                    version = self.conn.execute("PRAGMA user_version").fetchone()[0]
                except sqlite3.Error:
                    if not _frozen(path):
                        raise
                    # A read-only filesystem, no WAL to replay: SQLite cannot make the -shm a WAL
                    # reader needs, and nothing can change the file, so it is read as immutable.
                    self.conn.close()
                    self.conn = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None)
                    self.conn.row_factory = sqlite3.Row
                    version = self.conn.execute("PRAGMA user_version").fetchone()[0]
                if version != SCHEMA_VERSION:
                    raise IndexError_(f"{path} has schema version {version}, this llmgw-store reads {SCHEMA_VERSION}; "
                                      "run a command that writes (e.g. `llmgw-store gc --dry-run`) to migrate it")
                return
            self.conn = sqlite3.connect(str(path), timeout=self.busy_timeout, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            if exclusive:
                # Before the first access: SQLite then keeps the WAL index in heap memory, not in a
                # -shm file it would have to make and grow, so the index opens on a full disk (gc's
                # fallback, roots/gc.py). Other connections wait until this one closes.
                self.conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._enable_wal()
            self.conn.execute("PRAGMA synchronous=NORMAL")
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                self._migrate()
            elif version > SCHEMA_VERSION:
                raise IndexError_(
                    f"{path} has schema version {version}, newer than this llmgw-store knows "
                    f"({SCHEMA_VERSION}); upgrade llmgw-store"
                )
        except sqlite3.Error as exc:
            if getattr(self, "conn", None) is not None:
                self.conn.close()  # its locks would stop this process's next attempt (SQLite shares them per process)
            raise self._error(exc, f"cannot open the index {path}") from exc

    def _enable_wal(self) -> None:
        """WAL is a property of the file, set once by whoever creates it. Switching needs an exclusive
        lock, for which SQLite does not call the busy handler, so processes that open a new store at
        the same moment retry here until one of them has switched it."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                if self.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                self.conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _migrate(self) -> None:
        # The steps run against _Schema (plain SQL, the same statements sqlite-utils issues) and
        # only fall back to sqlite-utils, whose import was a fifth of a small cold build, when a
        # step uses more of its API; a failed attempt is rolled back whole before the retry.
        try:
            self._run_migrations(_Schema(self.conn))
        except _NeedsSqliteUtils:
            import sqlite_utils

            self._run_migrations(sqlite_utils.Database(self.conn))

    def _run_migrations(self, db) -> None:
        # BEGIN IMMEDIATE takes the write lock first, so two processes opening a new store at once
        # serialise here; each step is also idempotent (IF NOT EXISTS) in case a library call commits.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            for step in MIGRATIONS[version:]:
                step(db)
            if version < 3 and self.store_dir is not None:
                self._backfill_references()
            self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def _backfill_references(self) -> None:
        """Paths registered before references were recorded: read them from the trees, once."""
        from llmgw_store.core.manifest import references_of

        for (name,) in self.conn.execute("SELECT name FROM paths").fetchall():
            for ref in references_of(self.store_dir / name, self.store_dir):
                self.conn.execute("INSERT OR IGNORE INTO refs VALUES (?, ?)", (name, ref))

    def close(self) -> None:
        self.conn.close()

    def _error(self, exc: sqlite3.Error, what: str) -> Exception:
        """LockTimeout (exit 75) when another connection held the database past the busy timeout."""
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return LockTimeout(f"{what}: another process held the index for {self.busy_timeout:g}s; "
                               "try again later or raise --lock-timeout")
        return index_error(self.path, what, exc)

    def _sql(self, sql: str, params: tuple | dict = ()) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}") from exc

    # --- store paths -------------------------------------------------------------------------
    # Every row handed out names a well-formed store path (keys.is_store_name): the index is a file
    # on disk, and a planted `../x` or `/x` row must never become a path (Layout.path_of refuses it too).
    def path_by_key(self, key: str) -> dict[str, Any] | None:
        row = self._sql("SELECT * FROM paths WHERE key = ?", (key,)).fetchone()
        return _well_formed(dict(row)) if row else None

    def path_by_name(self, name: str) -> dict[str, Any] | None:
        row = self._sql("SELECT * FROM paths WHERE name = ?", (name,)).fetchone()
        return _well_formed(dict(row)) if row else None

    def paths(self) -> list[dict[str, Any]]:
        """Every row with a well-formed name; a malformed one is reported and left out (gc and
        verify never act on it; `doctor --rebuild-index` drops it)."""
        out = []
        for r in self._sql("SELECT * FROM paths ORDER BY engine, version, variant, created"):
            if is_store_name(r["name"]):
                out.append(dict(r))
            else:
                say(f"skipping a malformed row of the index ({str(r['name'])[:80]!r}): "
                    "run `llmgw-store doctor --rebuild-index`")
        return out

    def touch(self, name: str) -> None:
        self._sql("UPDATE paths SET last_used = ? WHERE name = ?", (now_iso(), name))

    def note_uses(self, used: dict[str, float]) -> int:
        """Move use times (name -> seconds since the epoch, from core/uses.py's stamps) into
        last_used, keeping the later of the two, in one transaction. Returns the rows changed."""
        changed = 0
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for name, when in used.items():
                    iso = datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    changed += self.conn.execute(
                        "UPDATE paths SET last_used = ? WHERE name = ? AND (last_used IS NULL OR last_used < ?)",
                        (iso, name, iso)).rowcount
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}") from exc
        return changed

    def register(self, row: dict[str, Any], build_id: int, seconds: float, references: list[str] = (),
                 outcome: str = "built") -> None:
        """Record a finished build: its path row, its references and its log entry, in one transaction."""
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                cols = ", ".join(row)
                marks = ", ".join("?" for _ in row)
                self.conn.execute(f"INSERT INTO paths ({cols}) VALUES ({marks})", tuple(row.values()))
                self.conn.execute("DELETE FROM refs WHERE referrer = ?", (row["name"],))
                self.conn.executemany("INSERT OR IGNORE INTO refs VALUES (?, ?)", [(row["name"], r) for r in references])
                self._finish_build(build_id, outcome, seconds, None)
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}: cannot register {row['name']}") from exc

    def forget(self, name: str) -> None:
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.execute("DELETE FROM paths WHERE name = ?", (name,))
                self.conn.execute("DELETE FROM refs WHERE referrer = ?", (name,))
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}: cannot forget {name}") from exc

    def insert_path(self, row: dict[str, Any], references: list[str]) -> None:
        """A path row and its references without a build-log entry (doctor rebuilding the index)."""
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.execute(f"INSERT OR REPLACE INTO paths ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                                  tuple(row.values()))
                self.conn.executemany("INSERT OR IGNORE INTO refs VALUES (?, ?)", [(row["name"], r) for r in references])
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}: cannot register {row['name']}") from exc

    def copy_history_from(self, other: Path, tables: tuple[str, ...] | list[str]) -> dict[str, int]:
        """Copy the rows of `tables` that a damaged or old index file still yields (doctor), row by
        row: a table is copied up to its first unreadable page, in the columns both files have.
        Give it a scratch copy: SQLite writes to a file it opens (it replays or drops its WAL)."""
        copied: dict[str, int] = {}
        # A damaged schema may define views or triggers: they may call no function with side effects.
        self.conn.execute("PRAGMA trusted_schema=OFF")
        try:
            self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        except sqlite3.Error:
            return copied
        try:
            for table in tables:
                copied[table] = self._salvage(table)
        finally:
            self.conn.execute("DETACH DATABASE old")
        return copied

    def _salvage(self, table: str) -> int:
        rows: list[tuple] = []
        try:
            mine = [r[1] for r in self.conn.execute(f"PRAGMA main.table_info({table})")]
            theirs = {r[1] for r in self.conn.execute(f"PRAGMA old.table_info({table})")}
            cols = ", ".join(c for c in mine if c in theirs)
            if not cols:
                return 0
            cur = self.conn.execute(f"SELECT {cols} FROM old.{table}")
            # Ends: the old file holds finitely many rows, and SQLite reports a damaged page (a
            # loop in a damaged b-tree included) as an error, which ends the read here.
            while batch := cur.fetchmany(1000):
                rows += [tuple(r) for r in batch]
        except sqlite3.Error:
            pass
        if not rows:
            return 0
        insert = f"INSERT OR IGNORE INTO main.{table} ({cols}) VALUES ({', '.join('?' for _ in rows[0])})"
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            return sum(self.conn.execute(insert, row).rowcount for row in rows)

    def live_generations(self) -> set[tuple[str, int]]:
        return {(r[0], r[1]) for r in self._sql("SELECT profile, number FROM generations WHERE deleted IS NULL")}

    def has_generation(self, profile: str, number: int, name: str) -> bool:
        return self._sql("SELECT 1 FROM generations WHERE profile = ? AND number = ? AND deleted IS NULL AND name = ?",
                         (profile, number, name)).fetchone() is not None

    def references(self, name: str) -> list[str]:
        """Store paths `name` needs, as recorded when it was registered."""
        return [r[0] for r in self._sql("SELECT reference FROM refs WHERE referrer = ? ORDER BY reference", (name,))]

    def closure(self, names: set[str] | list[str]) -> list[str]:
        """`names` and everything they reference, transitively; references before referrers."""
        order: list[str] = []
        seen: set[str] = set()
        # Iterative depth-first walk: a reference cycle (which a registration cannot make, but a
        # damaged index could) ends the walk instead of recursing forever.
        for start in sorted(names):
            stack = [(start, iter(self.references(start)))]
            if start in seen:
                continue
            seen.add(start)
            while stack:
                node, refs = stack[-1]
                nxt = next(refs, None)
                if nxt is None:
                    stack.pop()
                    order.append(node)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(self.references(nxt))))
        return order

    def replace_content(self, name: str, content_hash: str, size: int, files: int, build_id: int, seconds: float) -> None:
        """A repaired path's new content, and its build-log entry, in one transaction."""
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.execute(
                    "UPDATE paths SET content_hash = ?, size = ?, files = ?, last_used = ? WHERE name = ?",
                    (content_hash, size, files, now_iso(), name),
                )
                self._finish_build(build_id, "repaired", seconds, None)
        except sqlite3.Error as exc:
            raise index_error(self.path, f"index {self.path}: cannot record the repair of {name}", exc) from exc

    # --- build log ---------------------------------------------------------------------------
    def start_build(self, key: str, name: str) -> int:
        """Log a build as running. Called with the key's lock held, so a row of this key still marked
        running belongs to a process that died holding the lock: it is marked abandoned."""
        self._sql(
            "UPDATE builds SET outcome = 'abandoned', finished = ? WHERE key = ? AND outcome = 'running'",
            (now_iso(), key),
        )
        import socket

        cur = self._sql(
            "INSERT INTO builds (key, name, pid, host, started, outcome) VALUES (?, ?, ?, ?, ?, 'running')",
            (key, name, os.getpid(), socket.gethostname(), now_iso()),
        )
        return int(cur.lastrowid)

    def _finish_build(self, build_id: int, outcome: str, seconds: float, error: str | None) -> None:
        self.conn.execute(
            "UPDATE builds SET finished = ?, outcome = ?, seconds = ?, error = ? WHERE id = ?",
            (now_iso(), outcome, seconds, error, build_id),
        )

    def fail_build(self, build_id: int, seconds: float, error: str) -> None:
        self._sql(
            "UPDATE builds SET finished = ?, outcome = 'failed', seconds = ?, error = ? WHERE id = ?",
            (now_iso(), seconds, error[:4000], build_id),
        )

    def builds(self, key: str | None = None) -> list[dict[str, Any]]:
        if key is None:
            rows = self._sql("SELECT * FROM builds ORDER BY id")
        else:
            rows = self._sql("SELECT * FROM builds WHERE key = ? ORDER BY id", (key,))
        return [dict(r) for r in rows]

    # --- memos of slow facts -----------------------------------------------------------------
    def published(self, index_url: str, project: str, version: str) -> str | None:
        row = self._sql(
            "SELECT published FROM releases WHERE index_url = ? AND project = ? AND version = ?",
            (index_url, project, version),
        ).fetchone()
        return row[0] if row else None

    def remember_published(self, index_url: str, project: str, version: str, published: str) -> None:
        self._sql("INSERT OR REPLACE INTO releases VALUES (?, ?, ?, ?)", (index_url, project, version, published))

    def latest(self, index_url: str, project: str, max_age_s: float) -> str | None:
        row = self._sql(
            "SELECT version, fetched FROM latest WHERE index_url = ? AND project = ?", (index_url, project)
        ).fetchone()
        if row and time.time() - row[1] <= max_age_s:
            return row[0]
        return None

    def latest_fetched(self, index_url: str, project: str) -> float | None:
        """When the remembered latest version of `project` was asked (seconds since the epoch)."""
        row = self._sql("SELECT fetched FROM latest WHERE index_url = ? AND project = ?", (index_url, project)).fetchone()
        return float(row[0]) if row else None

    def remember_latest(self, index_url: str, project: str, version: str) -> None:
        self._sql("INSERT OR REPLACE INTO latest VALUES (?, ?, ?, ?)", (index_url, project, version, time.time()))

    def tool_info(self, kind: str, ident: str) -> dict[str, Any] | None:
        """A memo about a tool (a uv binary, an interpreter); the caller checks it is still valid."""
        row = self._sql("SELECT info FROM tools WHERE kind = ? AND ident = ?", (kind, ident)).fetchone()
        return json.loads(row[0]) if row else None

    def remember_tool(self, kind: str, ident: str, info: dict[str, Any]) -> None:
        self._sql(
            "INSERT OR REPLACE INTO tools VALUES (?, ?, ?, ?)", (kind, ident, info.get("stamp", ""), json.dumps(info))
        )


    # --- profiles (the links on disk are the truth; these rows follow them) -----------------
    def generation_rows(self, profile: str) -> dict[int, dict[str, Any]]:
        rows = self._sql("SELECT * FROM generations WHERE profile = ?", (profile,))
        return {r["number"]: dict(r) for r in rows}

    def max_generation(self, profile: str) -> int:
        row = self._sql("SELECT max(number) FROM generations WHERE profile = ?", (profile,)).fetchone()
        return row[0] or 0

    def record_generation(self, profile: str, number: int, name: str, created: str) -> None:
        self._sql(
            "INSERT OR REPLACE INTO generations (profile, number, name, created, created_by, deleted) "
            "VALUES (?, ?, ?, ?, ?, NULL)",
            (profile, number, name, created, _whoami()),
        )

    def mark_generation_deleted(self, profile: str, number: int) -> None:
        self._sql("UPDATE generations SET deleted = ? WHERE profile = ? AND number = ?", (now_iso(), profile, number))

    def record_switch(self, profile: str, from_number: int | None, to_number: int, kind: str) -> None:
        self._sql(
            "INSERT INTO switches (profile, from_number, to_number, at, by, kind) VALUES (?, ?, ?, ?, ?, ?)",
            (profile, from_number, to_number, now_iso(), _whoami(), kind),
        )

    def switches(self, profile: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._sql("SELECT * FROM switches WHERE profile = ? ORDER BY id", (profile,))]

    def pins(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: dict(r) for r in self._sql("SELECT * FROM pins")}

    def record_pin(self, name: str, path_name: str | None) -> None:
        if path_name is None:
            self._sql("DELETE FROM pins WHERE name = ?", (name,))
        else:
            self._sql("INSERT OR REPLACE INTO pins VALUES (?, ?, ?)", (name, path_name, now_iso()))


    # --- gc's records: cache entries each path was built from, when gc last saw it rooted --------
    def record_cache_uses(self, name: str, cache: str, entries: list[str] | set[str]) -> None:
        at = now_iso()
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.executemany("INSERT OR REPLACE INTO cache_uses VALUES (?, ?, ?, ?)",
                                      [(name, cache, e, at) for e in sorted(entries)])
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}: cannot record the cache entries of {name}") from exc

    def cache_uses(self, cache: str) -> list[dict[str, Any]]:
        """Every recorded use of an entry of `cache` (path_name, entry, used_at); the caller checks entries."""
        return [dict(r) for r in self._sql("SELECT path_name, entry, used_at FROM cache_uses WHERE cache = ?", (cache,))]

    def forget_cache_uses(self, name: str) -> None:
        self._sql("DELETE FROM cache_uses WHERE path_name = ?", (name,))

    def drop_cache_entry(self, cache: str, entry: str) -> None:
        self._sql("DELETE FROM cache_uses WHERE cache = ? AND entry = ?", (cache, entry))

    def mark_rooted(self, names: set[str] | list[str], at: str) -> None:
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                self.conn.executemany("INSERT OR REPLACE INTO gc_rooted VALUES (?, ?)", [(n, at) for n in sorted(names)])
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}: cannot record gc roots") from exc

    def last_rooted(self) -> dict[str, str]:
        """name -> when a gc last saw it rooted, or when a generation naming it was deleted, the later."""
        out = {r[0]: r[1] for r in self._sql("SELECT name, last_rooted FROM gc_rooted")}
        for name, deleted in self._sql("SELECT name, max(deleted) FROM generations WHERE deleted IS NOT NULL GROUP BY name"):
            if deleted and deleted > out.get(name, ""):
                out[name] = deleted
        return out

    def generation_path_names(self) -> set[str]:
        """Store path names any generation record names, deleted (cold) ones included."""
        return {r[0] for r in self._sql("SELECT DISTINCT name FROM generations WHERE name IS NOT NULL")}

    def forget_rooted(self, name: str) -> None:
        self._sql("DELETE FROM gc_rooted WHERE name = ?", (name,))


def _whoami() -> str:
    # getpass.getuser and socket.gethostname, without importing socket (an activation's hot path).
    user = next((os.environ[v] for v in ("LOGNAME", "USER", "LNAME", "USERNAME") if os.environ.get(v)), None)
    if user is None:
        try:
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (KeyError, OSError):
            user = str(os.getuid())
    return f"{user}@{os.uname().nodename} pid {os.getpid()}"


def file_stamp(path: Path) -> str | None:
    """What makes a memo about a file stale: its inode, size and modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
