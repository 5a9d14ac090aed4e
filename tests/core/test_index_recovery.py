"""A lost or damaged index (var/db.sqlite) never loses live data, and doctor rebuilds it whatever
state the file is in: real SQLite files damaged on disk, the real CLI, real builds."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from llmgw_store.core import manifest
from llmgw_store.system.trees import force_rmtree
from tests.conftest import build_json, build_store, copy_store, real_uv, run_cli

DATES = ("2024-02-02", "2024-06-02")


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    """Two environments A and B; profile p has generations 1 (A) and 2 (B); pin `good` holds A.
    The build log is folded into the main file, so the WAL is empty."""
    t = build_store(tmp_path_factory.mktemp("recovery"), wheels, *DATES)
    a, b = (t["root"] / "store" / n for n in t["names"])
    run_cli(t["root"], "activate", "p", str(a), check=True)
    run_cli(t["root"], "activate", "p", str(b), check=True)
    run_cli(t["root"], "pin", "good", str(a), check=True)
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    return root, [root / "store" / n for n in template["names"]]


def db_of(root: Path) -> Path:
    return root / "var" / "db.sqlite"


def remove_db(root: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_of(root)}{suffix}").unlink(missing_ok=True)


def damage(root: Path, how: str) -> dict[str, bytes]:
    """Damage the index as a crash, a full disk or a bad disk would; returns the damaged files'
    bytes by name (what must be found, unchanged, among the files moved aside)."""
    db = db_of(root)
    if how == "missing":
        remove_db(root)
        return {}
    if how == "empty":
        remove_db(root)
        db.write_bytes(b"")
    elif how == "truncated":
        os.truncate(db, db.stat().st_size // 2)
    elif how == "zeroed_first_page":
        with open(db, "r+b") as f:
            f.write(bytes(4096))
    elif how == "random_bytes":
        db.write_bytes(os.urandom(db.stat().st_size))
    elif how == "not_a_database":
        db.write_text("this is not a database\n" * 200)
    elif how == "garbage_wal":
        Path(f"{db}-wal").write_bytes(os.urandom(40000))
    return {p.name: p.read_bytes() for p in db.parent.iterdir() if p.name.startswith(db.name)}


def list_names(root: Path) -> set[str]:
    return {x["name"] for x in json.loads(run_cli(root, "--json", "list", check=True).stdout)["paths"]}


KINDS = ["missing", "empty", "truncated", "zeroed_first_page", "random_bytes", "not_a_database", "garbage_wal"]


@pytest.mark.parametrize("how", KINDS)
def test_rebuild_index_whatever_state_the_file_is_in(store, how):
    root, (a, b) = store
    damaged = damage(root, how)

    proc = run_cli(root, "--json", "doctor", "--rebuild-index")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert set(r["registered"]) >= {a.name, b.name} and r["skipped"] == []
    assert r["generations"] == 2 and r["pins"] == 1
    # The damaged files were moved aside, byte for byte, never deleted; the report names them.
    moved = {Path(p).name: Path(p).read_bytes() for p in r["moved_aside"]}
    assert moved == damaged
    assert all(Path(p).parent == Path(r["backup"]) for p in r["moved_aside"])

    con = sqlite3.connect(db_of(root))
    assert con.execute("SELECT profile, number, name FROM generations WHERE deleted IS NULL ORDER BY number").fetchall() \
        == [("p", 1, a.name), ("p", 2, b.name)]
    assert con.execute("SELECT name, path_name FROM pins").fetchall() == [("good", a.name)]
    con.close()
    assert run_cli(root, "doctor").returncode == 0
    assert list_names(root) >= {a.name, b.name}
    if how == "garbage_wal":  # the main file is intact: its history is all still there
        assert r["history_copied"]["builds"] >= 2 and r["history_copied"]["generations"] >= 2


def test_history_is_salvaged_from_a_file_sqlite_can_still_partly_read(store, tmp_path):
    root, _ = store
    db = db_of(root)
    con = sqlite3.connect(db)
    with con:
        con.executemany("INSERT INTO releases VALUES (?, ?, ?, ?)",
                        [("https://x.invalid", f"p{i}", "1.0", "2024-01-01T00:00:00Z") for i in range(3000)])
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    size = db.stat().st_size
    os.truncate(db, size - size // 4)  # the last pages are lost; the first ones still read

    r = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert r["history_copied"]["builds"] >= 2  # small tables, on early pages
    assert 0 < r["history_copied"]["releases"] < 3000  # rows read up to the first lost page


def test_other_commands_on_a_damaged_index_say_run_doctor(store):
    root, (a, _) = store
    damage(root, "random_bytes")
    for args in (("list",), ("doctor",), ("gc", "--dry-run"), ("activate", "q", str(a))):
        proc = run_cli(root, *args)
        assert proc.returncode == 1, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: "), proc.stderr
        assert str(db_of(root)) in lines[0] and "llmgw-store doctor --rebuild-index" in lines[0]


def test_two_rebuilds_keep_both_backups(store):
    root, _ = store
    first = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    second = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert first["backup"] != second["backup"]
    assert all(Path(p).exists() for p in first["moved_aside"] + second["moved_aside"])


def rebuild_json(template, root: Path, as_of: str) -> dict:
    return build_json(root, template["recipe"], template["index"], real_uv(), "--as-of", as_of)


def test_build_with_the_index_deleted_keeps_a_rooted_path(store, template):
    root, (a, b) = store
    marker = os.stat(a).st_ino
    remove_db(root)

    r = rebuild_json(template, root, DATES[0])
    # The complete path a profile points at is registered again from its manifest, not deleted.
    assert r["how"] == "recovered" and r["path"] == str(a) and r["cache_hit"]
    assert os.stat(a).st_ino == marker
    assert a.name in list_names(root)
    assert run_cli(root, "verify", str(a)).returncode == 0
    # The profile still works: roll back to A, and switch to B (which the build above re-found
    # through its own build).
    run_cli(root, "rollback", "p", check=True)
    gens = json.loads(run_cli(root, "--json", "generations", "p", check=True).stdout)
    assert gens["current"] == 1
    assert rebuild_json(template, root, DATES[1])["how"] == "recovered"
    run_cli(root, "activate", "p", str(b), check=True)
    assert os.readlink(root / "profiles" / "p").endswith("-link")
    assert Path(os.path.realpath(root / "profiles" / "p")) == b
    # A second build of A is now an ordinary hit.
    assert rebuild_json(template, root, DATES[0])["how"] == "hit"


def _writable(path: Path) -> None:
    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IWUSR)


@pytest.mark.parametrize("tamper", ["file", "listing", "manifest_name", "no_manifest", "manifest_is_link",
                                    "contents_is_fifo", "path_is_link"])
def test_a_build_never_deletes_a_tampered_unregistered_path(store, template, tamper, tmp_path):
    root, (a, _) = store
    remove_db(root)
    victim = next(p for p in (a / "bin").iterdir() if p.is_file() and not p.is_symlink())
    meta = a / manifest.MANIFEST_DIR
    _writable(meta)
    elsewhere = tmp_path / "elsewhere"
    if tamper == "file":
        _writable(victim.parent)
        _writable(victim)
        victim.write_text("#!/bin/sh\necho tampered\n")
    elif tamper == "listing":  # the listing no longer hashes to the manifest's content hash
        _writable(meta / "contents")
        with open(meta / "contents", "a") as f:
            f.write("f\t1\tdeadbeef\tbin/extra\n")
    elif tamper == "manifest_name":  # a manifest copied from another path
        _writable(meta / "manifest.json")
        doc = manifest.read(a)
        doc["name"] = doc["key"] + "-other-1.0-cpu"
        (a / manifest.MANIFEST).write_text(json.dumps(doc))  # as a forger would: not through StorePathInfo
    elif tamper == "no_manifest":
        os.unlink(meta / "manifest.json")
    elif tamper == "manifest_is_link":  # the genuine manifest, but reached through a planted link
        elsewhere.mkdir()
        os.rename(meta / "manifest.json", elsewhere / "manifest.json")
        os.symlink(elsewhere / "manifest.json", meta / "manifest.json")
    elif tamper == "contents_is_fifo":  # reading it must neither hang nor be trusted
        os.unlink(meta / "contents")
        os.mkfifo(meta / "contents")
    else:  # the store path itself is a link to a complete copy somewhere else
        os.chmod(meta, 0o555)
        subprocess.run(["cp", "-a", str(a), str(elsewhere)], check=True)
        force_rmtree(a)
        os.symlink(elsewhere, a)

    # A final directory was complete when renamed into place: one that no longer matches its
    # manifest was damaged since and may be in use, so the build refuses and leaves it as it is.
    proc = run_cli(root, "--progress=none", "build", str(template["recipe"]), "--index-url", template["index"].url,
                   "--uv", str(real_uv()), "--as-of", DATES[0])  # progress off: stderr is the error alone
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert a.name in lines[0] and "does not match its manifest" in lines[0] and "it is kept" in lines[0]
    assert os.path.lexists(a)
    if tamper == "file":
        assert "tampered" in victim.read_text()
    if tamper in ("manifest_is_link", "path_is_link"):  # what the link pointed at is left alone
        assert elsewhere.exists()


def test_gc_with_the_index_deleted_keeps_rooted_paths(store):
    root, (a, b) = store
    run_cli(root, "unpin", "good", check=True)  # A is held by generation 1 only
    run_cli(root, "rollback", "p", check=True)
    run_cli(root, "generations", "p", "--delete", "2", check=True)  # B by nothing any more
    stray = root / "store" / "00000000000000000000000000000000-stray-1-cpu"
    stray.mkdir()
    remove_db(root)

    r = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    deleted = {d["name"]: d["reason"] for d in r["deleted"]}
    assert a.exists() and a.name not in deleted
    assert run_cli(root, "verify", str(a)).returncode == 0
    assert a.name in list_names(root)  # registered again, from its manifest
    assert not stray.exists() and "incomplete" in deleted[stray.name]
    # B is complete but no root holds it: registered again, then collected like any unrooted path.
    assert deleted[b.name] == "no root holds it" and not b.exists()


def test_a_path_and_its_reference_are_registered_again_in_order_and_forgotten_in_order(store):
    """The index's references are foreign keys: doctor registers a reference before its referrer
    (whichever name it meets first), and gc, once nothing roots them, forgets the referrer first."""
    root, (a, b) = store
    referrer, reference = sorted((a, b), key=lambda p: p.name)  # the referrer is met first
    doc = json.loads((referrer / ".llmgw" / "manifest.json").read_text())
    doc["references"] = [reference.name]
    os.chmod(referrer / ".llmgw", 0o755)
    os.chmod(referrer / ".llmgw" / "manifest.json", 0o644)
    (referrer / ".llmgw" / "manifest.json").write_text(json.dumps(doc))
    os.chmod(referrer / ".llmgw" / "manifest.json", 0o444)
    os.chmod(referrer / ".llmgw", 0o555)
    remove_db(root)

    r = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert set(r["registered"]) == {a.name, b.name} and r["skipped"] == []
    con = sqlite3.connect(db_of(root))
    assert con.execute("SELECT referrer, reference FROM refs").fetchall() == [(referrer.name, reference.name)]
    con.close()
    # Unrooted (no profile, no pin), both go; the referrer is forgotten before what it references.
    for link in (root / "profiles").glob("p*"):
        link.unlink()
    (root / "gcroots" / "good").unlink()
    gone = json.loads(run_cli(root, "--json", "gc", check=True).stdout)["deleted"]
    assert [d["name"] for d in gone] == [referrer.name, reference.name]
