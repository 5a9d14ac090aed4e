"""The SQLite index of what the store holds: a cache of the manifests plus memos of slow facts.

Invariant: a row in `paths` exists only for a directory that is complete, read-only and renamed
into `store/`; the row is inserted after the rename, in the same transaction as its build-log row
and its references, which are foreign keys (a path's references go with it; a path a registered
path references cannot be forgotten). The index is in WAL mode, so readers (a cache-hit `build`,
`list`) never wait for a writer, and a busy timeout (30 s, or the caller's lock timeout when
shorter) covers writers queuing behind each other. The database and its -wal and -shm are 0600 in
the 0700 var/ (layout.ensure): SQLite locks them with fcntl, and a user who could open -shm could
hold those locks and stop every writer.

The schema is plain SQL in schema.sql, one section per version; `PRAGMA user_version` says which
the file has. Every write goes through `Index.transaction` (or `_sql` for one statement), which turns
SQLite's errors into the store's: a lock held past the timeout is LockTimeout (exit 75), a full disk
DiskFullError, a read-only file ReadOnlyError, a damaged file IndexError_ naming doctor. No SQL
lives outside this module.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw_store.base.errors import DiskFullError, IndexError_, LockTimeout, ReadOnlyError, StoreError, from_os_error
from llmgw_store.base.report import say
from llmgw_store.core.indexsql import (
    BUILDS_OF_KEY,
    BUSY_TIMEOUT_S,
    DB_MODE,
    PATH_BY,
    PATHS_IN_ORDER,
    RECORD_GENERATION,
    SCHEMA_VERSION,
    whoami,
)
from llmgw_store.core.keys import is_store_name
from llmgw_store.core.layout import malformed_name

if TYPE_CHECKING:
    from llmgw_store.core.pathinfo import StorePathInfo

# What doctor copies from an old, possibly hostile, index file (copy_history_from).
SALVAGE_MAX_ROWS = 200_000  # a table: far more history than a store keeps
SALVAGE_MAX_BYTES = 256 << 20
SALVAGE_DEADLINE_S = 60.0  # all tables together
SCHEMA_FILE = Path(__file__).with_name("schema.sql")
VERSION_LINE = re.compile(r"-- version (\d+):")


class ReferencedError(IndexError_):
    """A store path cannot be forgotten: a registered path still references it."""


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


# --- rows: what the tables hold, typed ----------------------------------------------------------

@dataclass(frozen=True)
class RegisteredPath:
    """A store path the index holds (`paths`): what its manifest said when it was registered."""

    name: str
    key: str
    engine: str
    version: str
    variant: str
    as_of: str | None
    uv_version: str | None
    python: str | None
    inputs: dict[str, Any]  # the key's inputs (the column holds them as sorted JSON: `_inputs`, `_values`)
    content_hash: str
    size: int
    files: int
    build_seconds: float
    created: str
    last_used: str

    @classmethod
    def of(cls, info: StorePathInfo, created: str | None = None, last_used: str | None = None) -> RegisteredPath:
        """The row of what is known of a store path (core/pathinfo); created and last used when it
        was installed, unless said. ValueError when `info` lacks a field the row needs."""
        w = info.whole()
        return cls(
            name=info.name, key=info.key, engine=w.engine, version=w.version, variant=w.variant,
            as_of=info.as_of, uv_version=info.uv_version, python=info.python, inputs=info.inputs,
            content_hash=info.content_hash, size=w.size, files=w.files, build_seconds=info.build_seconds,
            created=created or w.installed, last_used=last_used or w.installed,
        )


@dataclass(frozen=True)
class BuildLogEntry:
    """One build, pull or repair of a key (`builds`), from start to its outcome."""

    id: int
    key: str
    name: str
    pid: int
    host: str
    started: str
    finished: str | None
    outcome: str  # running, built, substituted, repaired, failed, abandoned
    seconds: float | None
    error: str | None


@dataclass(frozen=True)
class GenerationRow:
    """A profile's generation as last recorded (`generations`); the links on disk are the truth."""

    profile: str
    number: int
    name: str | None
    created: str | None
    created_by: str | None
    deleted: str | None


@dataclass(frozen=True)
class PinRow:
    """A pin as last recorded (`pins`); gcroots/ is the truth."""

    name: str
    path_name: str
    created: str


@dataclass(frozen=True)
class CacheUse:
    """A cache entry a store path was built from (`cache_uses` of one cache)."""

    path_name: str
    entry: str
    used_at: str


def _row(cls, row: sqlite3.Row):
    return cls(**{f.name: row[f.name] for f in fields(cls)})


def _inputs(text: Any) -> dict[str, Any]:
    """The `inputs` column as a dict: {} for one that is not a JSON object (a damaged or edited row;
    a rebuild checks the inputs hash to the key before using them)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _path_row(row: sqlite3.Row) -> RegisteredPath:
    values: dict[str, Any] = {f.name: _inputs(row["inputs"]) if f.name == "inputs" else row[f.name]
                              for f in fields(RegisteredPath)}
    return RegisteredPath(**values)


def _values(row: RegisteredPath) -> tuple:
    """`row` as the `paths` columns hold it: the inputs as sorted JSON."""
    return tuple(json.dumps(row.inputs, sort_keys=True) if f.name == "inputs" else getattr(row, f.name)
                 for f in fields(RegisteredPath))


def _well_formed(row: sqlite3.Row) -> RegisteredPath:
    if not is_store_name(row["name"]):
        raise malformed_name(row["name"])
    return _path_row(row)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def schema_steps(text: str | None = None) -> dict[int, list[str]]:
    """schema.sql as {version: its statements, in order}. The file is read only when a database
    is created or migrated, never on a cache hit."""
    text = SCHEMA_FILE.read_text() if text is None else text
    steps: dict[int, list[str]] = {}
    version, pending = 0, ""
    for line in text.splitlines(keepends=True):
        m = VERSION_LINE.match(line)
        if m:
            if pending.strip():
                raise IndexError_(f"{SCHEMA_FILE}: a statement of version {version} does not end with ';'")
            version, pending = int(m.group(1)), ""
            if version != len(steps) + 1:
                raise IndexError_(f"{SCHEMA_FILE}: version {version} follows version {len(steps)}")
            steps[version] = []
            continue
        if line.lstrip().startswith("--") or (not pending and not line.strip()):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            if not version:
                raise IndexError_(f"{SCHEMA_FILE}: a statement before the first `-- version 1:` line")
            steps[version].append(pending.strip())
            pending = ""
    if pending.strip():
        raise IndexError_(f"{SCHEMA_FILE}: the last statement does not end with ';'")
    return steps


def store_error(path: Path, what: str, exc: sqlite3.Error, busy_timeout: float = BUSY_TIMEOUT_S) -> StoreError:
    """The store's error for `what` failing on the index at `path` with SQLite's `exc`: each cause
    a person acts on differently gets its own class (and exit code)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "database is locked" in str(exc):
        return LockTimeout(f"{what}: another process held the index for {busy_timeout:g}s; "
                           "try again later or raise --lock-timeout")
    if code in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
        # SQLite keeps errno to itself: a file it cannot create or grow (the -shm, the -wal) is an
        # I/O error, so the filesystem is asked what it is.
        try:
            fs = os.statvfs(path.parent)
        except OSError:
            fs = None
        if fs is not None and fs.f_flag & os.ST_RDONLY:
            return ReadOnlyError(f"{what}: the index {path} is on a read-only filesystem ({exc}); "
                                 "remount it read-write")
        if fs is not None and code == sqlite3.SQLITE_IOERR and fs.f_bavail == 0:
            code = sqlite3.SQLITE_FULL
    if code == sqlite3.SQLITE_FULL:
        return DiskFullError(f"{what}: no space left for the index {path} ({exc}); free space on its "
                             "filesystem (`llmgw-store gc`)")
    if code == sqlite3.SQLITE_READONLY:
        return ReadOnlyError(f"{what}: the index {path} cannot be written ({exc}); is the file (or var/) "
                             "another user's, or read-only?")
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        # The index is a cache of the manifests and the links: doctor rebuilds it from them.
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
            # isolation_level=None: the module opens no transaction behind our back; every write
            # transaction is an explicit BEGIN IMMEDIATE in `transaction`.
            self.conn = sqlite3.connect(str(path), timeout=self.busy_timeout, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            if exclusive:
                # Before the first access: SQLite then keeps the WAL index in heap memory, not in a
                # -shm file it would have to make and grow, so the index opens on a full disk (gc's
                # fallback, roots/gc.py). Other connections wait until this one closes.
                self.conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._stamp_epoch()
            self._enable_wal()
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")  # per connection; refs' keys hold from here on
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version < SCHEMA_VERSION:
                self._migrate()
            elif version > SCHEMA_VERSION:
                raise IndexError_(
                    f"{path} has schema version {version}, newer than this llmgw-store knows "
                    f"({SCHEMA_VERSION}); upgrade llmgw-store"
                )
        except BaseException as exc:
            if getattr(self, "conn", None) is not None:
                self.conn.close()  # no descriptor of a failed open is left behind (a busy mount)
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, f"cannot open the index {path}") from exc
            raise

    def _stamp_epoch(self) -> None:
        """Give the index its epoch, once: a random number in the SQLite header's application id,
        which says which index file this is (build/memo.py binds each build memo entry to it).
        A new file is stamped here before it turns to WAL, so the number is in the file's first page
        at once and the fast path reads it there without SQLite; another index file copied in place
        (a backup, a rebuilt index) brings its own. An older index gets one on its next read-write
        open (it reaches the file's header at the next checkpoint; until then no entry is written)."""
        if self.conn.execute("PRAGMA application_id").fetchone()[0] == 0:
            epoch = int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF or 1
            self.conn.execute(f"PRAGMA application_id = {epoch}")

    def epoch(self) -> int:
        return self.conn.execute("PRAGMA application_id").fetchone()[0]

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

    @contextmanager
    def transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of the block's statements or none. BEGIN IMMEDIATE takes the
        write lock first (waiting at most the busy timeout), so nothing read inside the block can
        change before it commits. SQLite's errors leave as the store's (`store_error`), `what` saying
        what was being done."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    try:
                        self.conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # SQLite rolls back a failed transaction itself when the file allows
                raise
        except sqlite3.IntegrityError as exc:
            if "FOREIGN KEY" in str(exc):
                raise ReferencedError(f"{what}: a registered store path still references it ({exc})") from exc
            raise self._error(exc, what) from exc
        except sqlite3.Error as exc:
            raise self._error(exc, what) from exc

    def _migrate(self) -> None:
        # One transaction from the version found to the current one: two processes opening an old
        # store at once serialise on BEGIN IMMEDIATE, and the second finds nothing left to do.
        steps = schema_steps()
        with self.transaction(f"cannot migrate the index {self.path}") as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for statement in steps[v]:
                    conn.execute(statement)
                if v == 3 and self.store_dir is not None:
                    self._backfill_references(self.store_dir)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            # PRAGMA foreign_keys cannot change inside a transaction, so each step ran with the keys
            # enforced; this also catches a row an older file held that no step above cleaned.
            bad = conn.execute("PRAGMA foreign_key_check").fetchall()
            if bad:
                raise IndexError_(f"cannot migrate the index {self.path}: {len(bad)} row(s) break its foreign keys; "
                                  "run `llmgw-store doctor --rebuild-index`")

    def _backfill_references(self, store_dir: Path) -> None:
        """Paths registered before references were recorded: read them from the trees, once."""
        from llmgw_store.core.manifest import references_of

        for (name,) in self.conn.execute("SELECT name FROM paths").fetchall():
            for ref in references_of(store_dir / name, store_dir):
                self.conn.execute("INSERT OR IGNORE INTO refs VALUES (?, ?)", (name, ref))

    def close(self) -> None:
        self.conn.close()

    def _error(self, exc: sqlite3.Error, what: str) -> StoreError:
        return store_error(self.path, what, exc, self.busy_timeout)

    def _sql(self, sql: str, params: tuple | dict = ()) -> sqlite3.Cursor:
        """One statement (a read, or a write that is its own transaction), its errors the store's."""
        try:
            return self.conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc, f"index {self.path}") from exc

    # --- store paths -------------------------------------------------------------------------
    # Every row handed out names a well-formed store path (keys.is_store_name): the index is a file
    # on disk, and a planted `../x` or `/x` row must never become a path (Layout.path_of refuses it too).
    def path_by_key(self, key: str) -> RegisteredPath | None:
        row = self._sql(PATH_BY["key"], (key,)).fetchone()
        return _well_formed(row) if row else None

    def path_by_name(self, name: str) -> RegisteredPath | None:
        row = self._sql(PATH_BY["name"], (name,)).fetchone()
        return _well_formed(row) if row else None

    def paths(self) -> list[RegisteredPath]:
        """Every row with a well-formed name; a malformed one is reported and left out (gc and
        verify never act on it; `doctor --rebuild-index` drops it)."""
        out = []
        for r in self._sql(PATHS_IN_ORDER):
            if is_store_name(r["name"]):
                out.append(_path_row(r))
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
        with self.transaction(f"index {self.path}: cannot record uses") as conn:
            for name, when in used.items():
                iso = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                changed += conn.execute(
                    "UPDATE paths SET last_used = ? WHERE name = ? AND (last_used IS NULL OR last_used < ?)",
                    (iso, name, iso)).rowcount
        return changed

    def register(self, row: RegisteredPath, build_id: int, seconds: float, references: Sequence[str] = (),
                 outcome: str = "built") -> None:
        """Record a finished build: its path row, its references and its log entry, in one transaction.
        Each reference must be registered already (references are registered first)."""
        cols = [f.name for f in fields(row)]
        with self.transaction(f"index {self.path}: cannot register {row.name}") as conn:
            conn.execute(f"INSERT INTO paths ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", _values(row))
            self._set_references(row.name, references)
            self._finish_build(build_id, outcome, seconds, None)

    def _set_references(self, name: str, references) -> None:
        # A self-reference says nothing gc needs and would keep the row from ever being forgotten.
        self.conn.execute("DELETE FROM refs WHERE referrer = ?", (name,))
        self.conn.executemany("INSERT OR IGNORE INTO refs VALUES (?, ?)", [(name, r) for r in references if r != name])

    def forget(self, name: str) -> None:
        """Drop a path's row (its references go with it). ReferencedError while a registered path
        references it: forget referrers first (`referrers_first`)."""
        with self.transaction(f"index {self.path}: cannot forget {name}") as conn:
            conn.execute("DELETE FROM paths WHERE name = ?", (name,))

    def referrers_first(self, names) -> list[str]:
        """`names` ordered so that each comes before every path of `names` it references: the
        order in which they can be forgotten."""
        wanted = set(names)
        return [n for n in reversed(self.closure(wanted)) if n in wanted]

    def insert_path(self, row: RegisteredPath, references: Sequence[str]) -> None:
        """A path row and its references without a build-log entry (adoption, doctor rebuilding the
        index). An existing row of the name is updated in place: a delete and insert (INSERT OR
        REPLACE) would be refused while another path references it."""
        cols = [f.name for f in fields(row)]
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c != "name")
        with self.transaction(f"index {self.path}: cannot register {row.name}") as conn:
            conn.execute(f"INSERT INTO paths ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
                         f"ON CONFLICT (name) DO UPDATE SET {updates}", _values(row))
            self._set_references(row.name, references)

    def insert_paths(self, rows: Sequence[RegisteredPath]) -> None:
        """Many rows, without references or build-log entries, in one transaction (a bench's store
        of thousands of paths)."""
        cols = [f.name for f in fields(RegisteredPath)]
        with self.transaction(f"index {self.path}: cannot register {len(rows)} paths") as conn:
            conn.executemany(f"INSERT INTO paths ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                             [_values(r) for r in rows])

    def copy_history_from(self, other: Path, tables: tuple[str, ...] | list[str],
                          deadline_s: float = SALVAGE_DEADLINE_S) -> dict[str, int]:
        """Copy the rows of `tables` that a damaged or old index file still yields (doctor), row by
        row: a table is copied up to its first unreadable page, in the columns both files have.
        Give it a scratch copy: SQLite writes to a file it opens (it replays or drops its WAL).
        The old file is hostile (doctor runs because something is wrong with it): only a real
        table is read — a view (which may be an endless recursive query) or a virtual table is
        not —, only the columns this schema has, at most SALVAGE_MAX_ROWS rows and
        SALVAGE_MAX_BYTES bytes a table, and all of it within `deadline_s` seconds (SQLite's
        progress handler interrupts the statement past it); what was read by then is kept."""
        copied: dict[str, int] = {}
        # A damaged schema may define views or triggers: they may call no function with side effects.
        self.conn.execute("PRAGMA trusted_schema=OFF")
        try:
            self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        except sqlite3.Error:
            return copied
        deadline = time.monotonic() + deadline_s
        try:
            for table in tables:
                copied[table] = self._salvage(table, deadline)
        finally:
            self.conn.set_progress_handler(None, 0)
            self.conn.execute("DETACH DATABASE old")
        return copied

    def _salvage(self, table: str, deadline: float) -> int:
        rows: list[tuple] = []
        # Every statement reading the old file is interrupted past the deadline.
        self.conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
        try:
            kind = self.conn.execute("SELECT type, sql FROM old.sqlite_master WHERE name = ?", (table,)).fetchone()
            if kind is None or kind[0] != "table" or not isinstance(kind[1], str) \
                    or kind[1].lstrip().upper().startswith("CREATE VIRTUAL"):
                return 0  # not a real table: a view may never end, a virtual table runs a module's code
            mine = [r[1] for r in self.conn.execute(f"PRAGMA main.table_info({table})")]
            theirs = {r[1] for r in self.conn.execute(f"PRAGMA old.table_info({table})")}
            cols = ", ".join(f'"{c}"' for c in mine if c in theirs)
            if not cols:
                return 0
            cur = self.conn.execute(f"SELECT {cols} FROM old.{table} LIMIT ?", (SALVAGE_MAX_ROWS,))
            # Ends: a real table of the old file holds finitely many rows (and at most the LIMIT
            # are read), SQLite reports a damaged page (a loop in a damaged b-tree included) as an
            # error, and the progress handler interrupts past the deadline: each ends the read here.
            size = 0
            while batch := cur.fetchmany(1000):
                for r in batch:
                    size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in r)
                    if size > SALVAGE_MAX_BYTES:
                        raise sqlite3.DataError("the table holds more than SALVAGE_MAX_BYTES")
                    rows.append(tuple(r))
        except sqlite3.Error:
            pass
        if not rows:
            return 0
        self.conn.set_progress_handler(None, 0)  # writing into our own file is not bounded by the old one
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
        with self.transaction(f"index {self.path}: cannot record the repair of {name}") as conn:
            conn.execute("UPDATE paths SET content_hash = ?, size = ?, files = ?, last_used = ? WHERE name = ?",
                         (content_hash, size, files, now_iso(), name))
            self._finish_build(build_id, "repaired", seconds, None)

    # --- build log ---------------------------------------------------------------------------
    def start_build(self, key: str, name: str) -> int:
        """Log a build as running. Called with the key's lock held, so a row of this key still marked
        running belongs to a process that died holding the lock: it is marked abandoned."""
        import socket

        with self.transaction(f"index {self.path}: cannot log the build of {name}") as conn:
            conn.execute("UPDATE builds SET outcome = 'abandoned', finished = ? WHERE key = ? AND outcome = 'running'",
                         (now_iso(), key))
            cur = conn.execute(
                "INSERT INTO builds (key, name, pid, host, started, outcome) VALUES (?, ?, ?, ?, ?, 'running')",
                (key, name, os.getpid(), socket.gethostname(), now_iso()))
        assert cur.lastrowid is not None  # an INSERT into a rowid table
        return cur.lastrowid

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

    def builds(self, key: str | None = None) -> list[BuildLogEntry]:
        if key is None:
            rows = self._sql("SELECT * FROM builds ORDER BY id")
        else:
            rows = self._sql(BUILDS_OF_KEY, (key,))
        return [_row(BuildLogEntry, r) for r in rows]

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

    def forget_tool(self, kind: str, ident: str) -> None:
        self._sql("DELETE FROM tools WHERE kind = ? AND ident = ?", (kind, ident))

    # --- inode stamps (core/stamps.py) ----------------------------------------------------------
    def inode_stamps(self, digests: list[str]) -> set[tuple[int, int, str, int, int, int]]:
        """(dev, ino, digest, size, mtime_ns, ctime_ns) of every stamp of one of `digests`."""
        out: set[tuple[int, int, str, int, int, int]] = set()
        for i in range(0, len(digests), 500):
            chunk = digests[i:i + 500]
            out.update(tuple(r) for r in self._sql(
                "SELECT dev, ino, digest, size, mtime_ns, ctime_ns FROM inode_stamps WHERE digest IN "
                f"({','.join('?' * len(chunk))})", tuple(chunk)))
        return out

    def record_inode_stamps(self, rows: list[tuple[int, int, str, int, int, int]], max_rows: int) -> None:
        """Stamp these inodes (replacing what an inode's number held before); the table is emptied
        first when it would hold more than `max_rows` (stamps of inodes long gone: a cache)."""
        with self.transaction("recording inode stamps") as conn:
            if conn.execute("SELECT count(*) FROM inode_stamps").fetchone()[0] + len(rows) > max_rows:
                conn.execute("DELETE FROM inode_stamps")
            conn.executemany("INSERT OR REPLACE INTO inode_stamps VALUES (?, ?, ?, ?, ?, ?)", rows)


    # --- profiles (the links on disk are the truth; these rows follow them) -----------------
    def generation_rows(self, profile: str) -> dict[int, GenerationRow]:
        rows = self._sql("SELECT * FROM generations WHERE profile = ?", (profile,))
        return {r["number"]: _row(GenerationRow, r) for r in rows}

    def max_generation(self, profile: str) -> int:
        row = self._sql("SELECT max(number) FROM generations WHERE profile = ?", (profile,)).fetchone()
        return row[0] or 0

    def record_generation(self, profile: str, number: int, name: str, created: str) -> None:
        self._sql(RECORD_GENERATION, (profile, number, name, created, whoami()))

    def mark_generation_deleted(self, profile: str, number: int) -> None:
        self._sql("UPDATE generations SET deleted = ? WHERE profile = ? AND number = ?", (now_iso(), profile, number))

    def pins(self) -> dict[str, PinRow]:
        return {r["name"]: _row(PinRow, r) for r in self._sql("SELECT * FROM pins")}

    def record_pin(self, name: str, path_name: str | None) -> None:
        if path_name is None:
            self._sql("DELETE FROM pins WHERE name = ?", (name,))
        else:
            self._sql("INSERT OR REPLACE INTO pins VALUES (?, ?, ?)", (name, path_name, now_iso()))


    # --- gc's records: cache entries each path was built from, when gc last saw it rooted --------
    def record_cache_uses(self, name: str, cache: str, entries: list[str] | set[str]) -> None:
        at = now_iso()
        with self.transaction(f"index {self.path}: cannot record the cache entries of {name}") as conn:
            conn.executemany("INSERT OR REPLACE INTO cache_uses VALUES (?, ?, ?, ?)",
                             [(name, cache, e, at) for e in sorted(entries)])

    def cache_uses(self, cache: str) -> list[CacheUse]:
        """Every recorded use of an entry of `cache`; the caller checks entries."""
        return [_row(CacheUse, r) for r in self._sql("SELECT path_name, entry, used_at FROM cache_uses WHERE cache = ?",
                                                     (cache,))]

    def forget_cache_uses(self, name: str) -> None:
        self._sql("DELETE FROM cache_uses WHERE path_name = ?", (name,))

    def drop_cache_entry(self, cache: str, entry: str) -> None:
        self._sql("DELETE FROM cache_uses WHERE cache = ? AND entry = ?", (cache, entry))

    def mark_rooted(self, names: set[str] | list[str], at: str) -> None:
        with self.transaction(f"index {self.path}: cannot record gc roots") as conn:
            conn.executemany("INSERT OR REPLACE INTO gc_rooted VALUES (?, ?)", [(n, at) for n in sorted(names)])

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


def file_stamp(path: Path) -> str | None:
    """What makes a memo about a file stale: its inode, size and modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
