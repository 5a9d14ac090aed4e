"""`doctor --rebuild-index` treats the old database as hostile: a 4 KiB file whose history tables
are views over an endless recursive query (before: out of memory after 20 s, generations and pins
never recorded), a real table with more rows than history ever holds, a virtual table — the rebuild
reads only real tables, in the columns the schema says, bounded in rows and time, and the disk
(manifests, profile links, pins) is recorded whatever the old file does. Run under a 2 GiB
address-space limit and a timeout: an unbounded read fails the test, not the machine."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_store, cli_cmd, copy_store, run_cli

ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT {cols} FROM r"


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("doctor"), wheels, "2024-02-02")
    a = t["root"] / "store" / t["names"][0]
    run_cli(t["root"], "activate", "p", str(a), check=True)
    run_cli(t["root"], "pin", "good", str(a), check=True)
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    return root, template["names"][0]


def hostile_db(db: Path, make) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    con = sqlite3.connect(db)
    con.execute("PRAGMA page_size=1024")
    make(con)
    con.commit()
    con.close()


def views(con) -> None:
    """Every history table a view that never ends (with the columns the store's schema has)."""
    for table, cols in {
        "builds": "n AS id, 'k' AS key, 'x' AS name, 1 AS pid, 'h' AS host, 's' AS started, 'f' AS finished, "
                  "'built' AS outcome, 1.0 AS seconds, NULL AS error",
        "switches": "n AS id, 'p' AS profile, 1 AS from_number, 2 AS to_number, 'a' AS at, 'b' AS by, 'k' AS kind",
        "generations": "'p' AS profile, n AS number, 'x' AS name, 'c' AS created, 'b' AS created_by, NULL AS deleted",
        "releases": "'u' AS index_url, 'p' || n AS project, '1' AS version, 'd' AS published",
    }.items():
        con.execute(f"CREATE VIEW {table} AS " + ENDLESS.format(cols=cols))


def many_rows(con) -> None:
    con.execute("CREATE TABLE releases (index_url TEXT, project TEXT, version TEXT, published TEXT, extra BLOB)")
    con.executemany("INSERT INTO releases VALUES ('u', ?, '1', 'd', zeroblob(10))", ((f"p{i}",) for i in range(300_000)))


def rebuild(root: Path) -> subprocess.CompletedProcess:
    argv = ["prlimit", f"--as={2 << 30}", "--", *cli_cmd(root, "--json", "doctor", "--rebuild-index")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240)


def assert_rebuilt_from_disk(root: Path, name: str, proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert name in r["registered"] and r["generations"] == 1 and r["pins"] == 1
    con = sqlite3.connect(root / "var" / "db.sqlite")
    assert con.execute("SELECT profile, number, name FROM generations WHERE deleted IS NULL").fetchall() == [("p", 1, name)]
    assert con.execute("SELECT name, path_name FROM pins").fetchall() == [("good", name)]
    con.close()
    assert run_cli(root, "doctor").returncode == 0
    return r


def test_views_over_an_endless_query_do_not_hang_the_rebuild(store):
    root, name = store
    db = root / "var" / "db.sqlite"
    hostile_db(db, views)
    assert db.stat().st_size <= 16384  # a few KiB
    r = assert_rebuilt_from_disk(root, name, rebuild(root))
    assert all(n == 0 for n in r["history_copied"].values())  # a view is not a table: nothing read from it


def test_a_table_larger_than_any_history_is_read_bounded(store):
    root, name = store
    hostile_db(root / "var" / "db.sqlite", many_rows)
    r = assert_rebuilt_from_disk(root, name, rebuild(root))
    from llmgw_store.core.index import SALVAGE_MAX_ROWS

    assert 0 < r["history_copied"]["releases"] <= SALVAGE_MAX_ROWS


def test_a_virtual_table_is_not_read(store):
    root, name = store

    def fts(con):
        try:
            con.execute("CREATE VIRTUAL TABLE builds USING fts5(key, name)")
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no fts5")
        con.execute("INSERT INTO builds VALUES ('k', 'n')")
    hostile_db(root / "var" / "db.sqlite", fts)
    r = assert_rebuilt_from_disk(root, name, rebuild(root))
    assert r["history_copied"]["builds"] == 0
