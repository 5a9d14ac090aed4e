"""The SQLite index on a real file: schema, migrations, concurrent creation, one-transaction registration."""

from __future__ import annotations

import multiprocessing
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw_store.base.errors import DiskFullError, IndexError_, LockTimeout, ReadOnlyError
from llmgw_store.core.index import SCHEMA_VERSION, Index, ReferencedError, RegisteredPath, schema_steps
from tests.support.tmpfs import fill, remount_readonly, tmpfs


def _open_and_write(path: str, n: int) -> None:
    idx = Index(Path(path))
    idx.remember_published("http://i", f"p{n}", "1.0", "2024-01-01T00:00:00Z")
    idx.close()


def test_new_index_is_wal_with_the_current_schema(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    assert idx.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert idx.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in idx.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"paths", "builds", "releases", "latest", "tools"} <= tables


def test_many_processes_creating_one_index_at_once(tmp_path):
    db = str(tmp_path / "db.sqlite")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_and_write, args=(db, n)) for n in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM releases").fetchone()[0] == 8
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path):
    Index(tmp_path / "db.sqlite").close()
    con = sqlite3.connect(tmp_path / "db.sqlite")
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    with pytest.raises(IndexError_, match="newer than this llmgw-store knows"):
        Index(tmp_path / "db.sqlite")


def _row(name: str, key: str) -> RegisteredPath:
    return RegisteredPath(name=name, key=key, engine="e", version="1", variant="cpu", as_of="x", uv_version="0.13.9",
                          python="3.11.7", inputs={}, content_hash="h", size=1, files=1, build_seconds=0.1,
                          created="t", last_used="t")


K1 = "1" * 32  # rows carry well-formed store path names (the index hands out no other)


def test_register_writes_path_and_log_in_one_transaction(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    b1 = idx.start_build(K1, f"{K1}-e")
    idx.register(_row(f"{K1}-e", K1), b1, 0.1)
    assert idx.path_by_key(K1).name == f"{K1}-e"
    assert idx.builds(K1)[0].outcome == "built"
    # A second path with the same key violates the unique index: neither the row nor the log changes.
    b2 = idx.start_build(K1, f"{K1}-other")
    with pytest.raises(IndexError_):
        idx.register(_row(f"{K1}-other", K1), b2, 0.1)
    assert idx.path_by_name(f"{K1}-other") is None
    assert [b.outcome for b in idx.builds(K1)] == ["built", "running"]


def test_latest_memo_expires(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    idx.remember_latest("http://i", "p", "2.0")
    assert idx.latest("http://i", "p", max_age_s=60) == "2.0"
    assert idx.latest("http://i", "p", max_age_s=-1) is None


# --- the schema: one SQL file, migrated in one transaction from every version in the wild --------

OLD = Path(__file__).resolve().parents[1] / "support" / "old_indexes"
A = "a" * 32 + "-tinyengine-1.0-cpu"  # the rows of tests/support/old_indexes/*.sql
B = "b" * 32 + "-tinyengine-1.1-cpu"
GONE = "c" * 32 + "-tinyengine-0.9-cpu"


def _schema(conn) -> list[tuple]:
    return sorted(tuple(r) for r in conn.execute("SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_master"))


def _old_index(tmp_path: Path, version: int) -> Path:
    """A database file as an llmgw-store of schema `version` left it (0: an empty file)."""
    db = tmp_path / "db.sqlite"
    con = sqlite3.connect(db, isolation_level=None)
    if version:
        con.executescript((OLD / f"v{version}.sql").read_text())
    con.close()
    return db


def test_schema_version_is_the_last_step_of_schema_sql():
    steps = schema_steps()
    assert sorted(steps) == list(range(1, SCHEMA_VERSION + 1))
    assert all(steps[v] for v in steps)
    assert sorted(int(p.stem[1:]) for p in OLD.glob("v*.sql")) == list(range(1, SCHEMA_VERSION))  # one per old version


def test_schema_sql_is_checked_as_it_is_read():
    with pytest.raises(IndexError_, match="does not end with"):
        schema_steps("-- version 1: x\nCREATE TABLE t (a)\n")
    with pytest.raises(IndexError_, match="version 3 follows version 1"):
        schema_steps("-- version 1: x\nCREATE TABLE t (a);\n-- version 3: y\nCREATE TABLE u (a);\n")
    assert schema_steps("-- version 1: x\n-- a comment; with a semicolon\nCREATE TABLE t (a);\nDROP TABLE t;\n") \
        == {1: ["CREATE TABLE t (a);", "DROP TABLE t;"]}


@pytest.mark.parametrize("version", range(SCHEMA_VERSION))
def test_migration_from_every_schema_version_in_the_wild(tmp_path, version):
    fresh = Index(tmp_path / "fresh.sqlite")
    idx = Index(_old_index(tmp_path, version))
    assert idx.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert _schema(idx.conn) == _schema(fresh.conn)  # a migrated file is a new one, table text included
    assert idx.conn.execute("PRAGMA foreign_key_check").fetchall() == []
    if version == 0:
        return
    # Every row an old version held is still there, but the references version 5's foreign keys refuse.
    assert {r.name for r in idx.paths()} == {A, B}
    assert [b.outcome for b in idx.builds()] == ["built", "running"]
    assert idx.published("https://pypi.org/simple", "tinyengine", "1.0") == "2024-02-01T00:00:00Z"
    assert idx.tool_info("uv", "/usr/bin/uv") == {"stamp": "1:2:3", "version": "0.13.9"}
    if version >= 2:
        assert idx.live_generations() == {("p", 1)} and idx.pins()["good"].path_name == A
    assert idx.references(B) == ([A] if version >= 3 else [])
    assert idx.references(A) == []
    if version >= 4:
        assert {(u.path_name, u.entry) for u in idx.cache_uses("uv")} == {(A, "wheels-v5/tinydep")}
        assert idx.last_rooted()[A] == "2024-03-04T00:00:00Z"
    tables = {r[0] for r in idx.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "switches" not in tables  # written, never read: dropped


@pytest.mark.parametrize("version", [1, 2])
def test_references_of_paths_registered_before_version_3_are_read_from_their_trees(tmp_path, version):
    store_dir = tmp_path / "store"
    (store_dir / A / "bin").mkdir(parents=True)
    (store_dir / B).mkdir(parents=True)
    (store_dir / B / "pyvenv.cfg").write_text(f"home = {store_dir / A / 'bin'}\n")
    idx = Index(_old_index(tmp_path, version), store_dir)
    assert idx.references(B) == [A] and idx.references(A) == []


def test_a_failed_migration_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    from llmgw_store.core import index as index_mod

    db = _old_index(tmp_path, 4)
    broken = tmp_path / "schema.sql"
    broken.write_text(index_mod.SCHEMA_FILE.read_text() + "INSERT INTO no_such_table VALUES (1);\n")
    monkeypatch.setattr(index_mod, "SCHEMA_FILE", broken)
    before = _schema(sqlite3.connect(db))
    with pytest.raises(IndexError_, match="cannot migrate"):
        Index(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 4
    assert _schema(con) == before  # version 5's steps before the failing one were rolled back too
    assert con.execute("SELECT count(*) FROM refs").fetchone()[0] == 3


def test_opening_a_store_does_not_import_sqlite_utils(tmp_path):
    code = ("import sys; from pathlib import Path; from llmgw_store.core.index import Index; "
            f"Index(Path({str(tmp_path / 'db.sqlite')!r})).close(); "
            "print(sorted(m for m in sys.modules if m.startswith('sqlite_utils')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- references are foreign keys ---------------------------------------------------------------

def _registered(idx: Index, name: str, refs=()) -> None:
    idx.register(_row(name, name[:32]), idx.start_build(name[:32], name), 0.1, list(refs))


def test_a_referenced_path_cannot_be_forgotten_before_its_referrer(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    _registered(idx, A)
    _registered(idx, B, [A])
    with pytest.raises(ReferencedError):
        idx.forget(A)
    assert idx.path_by_name(A) is not None and idx.references(B) == [A]
    assert idx.referrers_first([A, B]) == [B, A]
    idx.forget(B)  # its references go with it
    assert idx.conn.execute("SELECT count(*) FROM refs").fetchone()[0] == 0
    idx.forget(A)
    assert idx.paths() == []


def test_a_path_is_registered_only_after_its_references(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    with pytest.raises(ReferencedError):
        _registered(idx, B, [A])
    assert idx.path_by_name(B) is None  # the row, its references and its log entry: none of them
    assert [b.outcome for b in idx.builds()] == ["running"]
    _registered(idx, A)
    _registered(idx, B, [A, B])  # a self-reference is not recorded: it would pin the row forever
    assert idx.references(B) == [A]


def test_registering_a_referenced_path_again_keeps_its_referrers(tmp_path):
    # Adoption (doctor, gc) registers a path the index may already hold: an update in place, where
    # INSERT OR REPLACE would delete the row its referrer's key points at.
    idx = Index(tmp_path / "db.sqlite")
    _registered(idx, A)
    _registered(idx, B, [A])
    idx.insert_path(replace(_row(A, A[:32]), size=7), [])
    assert idx.path_by_name(A).size == 7 and idx.references(B) == [A]


# --- every write maps SQLite's errors to the store's ---------------------------------------------

WRITES = {
    "register": lambda idx: idx.register(_row(B, B[:32]), 1, 0.1),
    "forget": lambda idx: idx.forget(A),
    "insert_path": lambda idx: idx.insert_path(_row(B, B[:32]), []),
    "start_build": lambda idx: idx.start_build(B[:32], B),
    "touch": lambda idx: idx.touch(A),
    "note_uses": lambda idx: idx.note_uses({A: 2e9}),
    "replace_content": lambda idx: idx.replace_content(A, "h2", 1, 1, 1, 0.1),
    "remember_published": lambda idx: idx.remember_published("u", "p", "1", "t"),
    "remember_tool": lambda idx: idx.remember_tool("uv", "x", {"stamp": "s"}),
    "record_generation": lambda idx: idx.record_generation("p", 1, A, "t"),
    "record_pin": lambda idx: idx.record_pin("good", A),
    "record_cache_uses": lambda idx: idx.record_cache_uses(A, "uv", ["e"]),
    "mark_rooted": lambda idx: idx.mark_rooted([A], "t"),
}


@pytest.mark.parametrize("write", WRITES)
def test_every_write_waits_at_most_the_lock_timeout_then_exits_75(tmp_path, write):
    idx = Index(tmp_path / "db.sqlite", busy_timeout=0.2)
    _registered(idx, A)
    holder = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
    try:
        with pytest.raises(LockTimeout, match="another process held the index") as err:
            WRITES[write](idx)
        assert err.value.exit_code == 75
    finally:
        holder.execute("ROLLBACK")
    WRITES[write](idx)  # the positive case: once the lock is free the same write goes through


def test_a_write_on_a_full_disk_is_disk_full_error(tmp_path):
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        idx = Index(mnt / "db.sqlite")
        _registered(idx, A)
        fill(mnt)
        with pytest.raises(DiskFullError, match="no space left") as err:
            for i in range(1000):  # the WAL grows until a page finds no block
                idx.remember_published("u", f"p{i}", "1", "x" * 1000)
        assert err.value.exit_code == 1
        idx.close()


def test_opening_the_index_on_a_full_disk_is_disk_full_error(tmp_path):
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        Index(mnt / "db.sqlite").close()  # the last connection folds the WAL in, deletes it and the -shm
        fill(mnt)
        with pytest.raises(DiskFullError, match="no space left"):  # a new one must make a -shm: no block for it
            Index(mnt / "db.sqlite")


def test_a_read_only_filesystem_is_read_only_error(tmp_path):
    with tmpfs(tmp_path / "mnt", "8m") as mnt:
        idx = Index(mnt / "db.sqlite")
        _registered(idx, A)
        idx.close()  # a filesystem with a file open for writing cannot be made read-only
        remount_readonly(mnt)
        with pytest.raises(ReadOnlyError, match="on a read-only filesystem") as err:
            Index(mnt / "db.sqlite")
        assert err.value.exit_code == 1
        # A reader cannot have the -shm a WAL file needs either; with no WAL content to replay and
        # nothing able to change the file, it reads it as immutable: looking still works.
        ro = Index(mnt / "db.sqlite", readonly=True)
        assert [r.name for r in ro.paths()] == [A]
        ro.close()


def test_a_write_refused_by_the_file_is_read_only_error(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    _registered(idx, A)
    idx.conn.execute("PRAGMA query_only=ON")  # SQLite refuses every write as it does a read-only file
    with pytest.raises(ReadOnlyError, match="cannot be written"):
        idx.touch(A)


def test_a_damaged_file_names_doctor(tmp_path):
    db = tmp_path / "db.sqlite"
    db.write_text("not a database\n" * 100)
    with pytest.raises(IndexError_, match="doctor --rebuild-index"):
        Index(db)
