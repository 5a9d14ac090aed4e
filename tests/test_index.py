"""The SQLite index on a real file: schema, migrations, concurrent creation, one-transaction registration."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from llmgw_store.core.errors import IndexError_
from llmgw_store.core.index import SCHEMA_VERSION, Index


def _open_and_write(path: str, n: int) -> None:
    idx = Index(__import__("pathlib").Path(path))
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


def _row(name: str, key: str) -> dict:
    return {"name": name, "key": key, "engine": "e", "version": "1", "variant": "cpu", "as_of": "x",
            "uv_version": "0.13.9", "python": "3.11.7", "inputs": "{}", "content_hash": "h", "size": 1,
            "files": 1, "build_seconds": 0.1, "created": "t", "last_used": "t"}


K1 = "1" * 32  # rows carry well-formed store path names (the index hands out no other)


def test_register_writes_path_and_log_in_one_transaction(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    b1 = idx.start_build(K1, f"{K1}-e")
    idx.register(_row(f"{K1}-e", K1), b1, 0.1)
    assert idx.path_by_key(K1)["name"] == f"{K1}-e"
    assert idx.builds(K1)[0]["outcome"] == "built"
    # A second path with the same key violates the unique index: neither the row nor the log changes.
    b2 = idx.start_build(K1, f"{K1}-other")
    with pytest.raises(IndexError_):
        idx.register({**_row(f"{K1}-other", K1)}, b2, 0.1)
    assert idx.path_by_name(f"{K1}-other") is None
    assert [b["outcome"] for b in idx.builds(K1)] == ["built", "running"]


def test_latest_memo_expires(tmp_path):
    idx = Index(tmp_path / "db.sqlite")
    idx.remember_latest("http://i", "p", "2.0")
    assert idx.latest("http://i", "p", max_age_s=60) == "2.0"
    assert idx.latest("http://i", "p", max_age_s=-1) is None


def _schema(conn) -> list[tuple]:
    return sorted(tuple(r) for r in conn.execute("SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_master"))


def test_new_index_has_the_schema_sqlite_utils_makes(tmp_path):
    # A new index is made without sqlite-utils (plain SQL: its import was a fifth of a small cold
    # build); the file must be the one sqlite-utils makes from the same MIGRATIONS, statement for statement.
    import sqlite_utils

    from llmgw_store.core.index import MIGRATIONS

    ours = Index(tmp_path / "db.sqlite")
    ref = sqlite3.connect(tmp_path / "ref.sqlite", isolation_level=None)
    db = sqlite_utils.Database(ref)
    for step in MIGRATIONS:
        step(db)
    assert _schema(ours.conn) == _schema(ref)
    assert len(_schema(ref)) >= 10
    # The builds table's id is a rowid alias (INTEGER PRIMARY KEY): start_build's ids count up.
    assert ours.start_build("k" * 32, "k" * 32 + "-x-1-cpu") < ours.start_build("j" * 32, "j" * 32 + "-x-1-cpu")


def test_a_migration_using_more_of_sqlite_utils_falls_back_to_it(tmp_path, monkeypatch):
    from llmgw_store.core import index as index_mod

    def _v_extra(db) -> None:
        db["paths"].add_column("extra_note", str)  # not in the plain-SQL subset: sqlite-utils runs it

    monkeypatch.setattr(index_mod, "MIGRATIONS", [*index_mod.MIGRATIONS, _v_extra])
    monkeypatch.setattr(index_mod, "SCHEMA_VERSION", len(index_mod.MIGRATIONS))
    idx = index_mod.Index(tmp_path / "db.sqlite")
    cols = [r[1] for r in idx.conn.execute("PRAGMA table_info(paths)")]
    assert "extra_note" in cols and "name" in cols
    assert idx.conn.execute("PRAGMA user_version").fetchone()[0] == len(index_mod.MIGRATIONS)
