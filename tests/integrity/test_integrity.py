"""doctor, rebuild-index, optimise (dedup measured on disk) and stats, on real stores."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from llmgw_store.core import manifest
from tests.conftest import build_store, copy_store, run_cli


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("integrity"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    return root, [root / "store" / n for n in template["names"]]


def du(path: Path) -> int:
    """Bytes on disk under `path`, each inode once (what `du -s` counts)."""
    return int(subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def test_doctor_finds_nothing_on_a_healthy_store(store):
    root, _ = store
    proc = run_cli(root, "doctor")
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == "index and disk agree"
    assert proc.stdout.splitlines()[1].startswith("children contained by: ")  # docs/operations.md


def test_rebuild_index_after_deleting_the_database(store):
    root, (a, b) = store
    run_cli(root, "activate", "p", str(a), check=True)
    run_cli(root, "activate", "p", str(b), check=True)
    run_cli(root, "pin", "good", str(a), check=True)
    before = json.loads(run_cli(root, "--json", "list", check=True).stdout)["paths"]
    for suffix in ("", "-wal", "-shm"):
        Path(f"{root / 'var' / 'db.sqlite'}{suffix}").unlink(missing_ok=True)

    broken = run_cli(root, "--json", "doctor")
    assert broken.returncode == 1
    problems = json.loads(broken.stdout)["problems"]
    assert set(problems["present_but_unregistered"]) >= {a.name, b.name}
    assert problems["generations_not_in_index"] == ["p-1", "p-2"] and problems["pins_not_in_index"] == ["good"]

    r = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert {a.name, b.name} <= set(r["registered"]) and r["skipped"] == [] and r["generations"] == 2 and r["pins"] == 1
    assert run_cli(root, "doctor").returncode == 0
    after = json.loads(run_cli(root, "--json", "list", check=True).stdout)["paths"]
    def key(rows):
        return sorted((x["name"], x["key"], x["content_hash"], x["size"], x["files"], x["as_of"]) for x in rows)
    assert key(after) == key(before)
    gens = json.loads(run_cli(root, "--json", "generations", "p", check=True).stdout)
    assert [g["number"] for g in gens["generations"]] == [1, 2] and gens["current"] == 2 and gens["index_differs"] == []
    assert run_cli(root, "verify").returncode == 0


def test_rebuild_index_keeps_history_and_skips_inconsistent_dirs(store):
    root, (a, b) = store
    (root / "store" / "00000000000000000000000000000000-stray-1-cpu").mkdir()
    r = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert r["skipped"] == ["00000000000000000000000000000000-stray-1-cpu"]
    assert r["history_copied"]["builds"] >= 2 and Path(r["backup"]).exists()
    con = sqlite3.connect(root / "var" / "db.sqlite")
    assert {x[0] for x in con.execute("SELECT outcome FROM builds")} == {"built"}


def unshare(root: Path) -> None:
    """Make the store as one registered before builds shared their files: every store file its own
    inode again (a copy renamed over each link), the pool empty."""
    import shutil

    pool = root / "store" / ".links"
    for p in pool.iterdir():
        p.unlink()
    for dirpath, _, names in os.walk(root / "store"):
        if dirpath.startswith(str(pool)):
            continue
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                os.chmod(dirpath, 0o755)
                shutil.copy2(p, p + ".copy")
                os.rename(p + ".copy", p)
                os.chmod(dirpath, 0o555)
    assert run_cli(root, "verify").returncode == 0


def test_optimise_shares_identical_files_and_saves_disk(store):
    root, (a, b) = store
    unshare(root)
    store_dir = root / "store"
    before = du(store_dir)
    dry = json.loads(run_cli(root, "--json", "optimise", "--dry-run", check=True).stdout)
    assert du(store_dir) == before and [p for p in (store_dir / ".links").iterdir()] == []
    r = json.loads(run_cli(root, "--json", "optimise", check=True).stdout)
    after = du(store_dir)
    assert r["files_linked"] > 0
    assert after < before
    # Honest figures: the dry run foresaw what the run did, and the bytes are the blocks freed.
    assert (dry["files_linked"], dry["bytes_saved"]) == (r["files_linked"], r["bytes_saved"])
    assert r["bytes_saved"] == before - after
    # Every file whose content is the same in A and B is now one inode.
    ea = {e.path: e for e in manifest.read_contents(a) if e.kind in "fx"}
    eb = {e.path: e for e in manifest.read_contents(b) if e.kind in "fx"}
    same = [p for p in ea.keys() & eb.keys() if ea[p].digest == eb[p].digest and ea[p].kind == eb[p].kind and ea[p].size]
    assert same and all(os.stat(a / p).st_ino == os.stat(b / p).st_ino for p in same)
    assert run_cli(root, "verify").returncode == 0  # still read-only and intact
    again = json.loads(run_cli(root, "--json", "optimise", check=True).stdout)
    assert again["files_linked"] == 0

    # gc removes pool entries no store path links any more (once the uv cache, which may share
    # them at no cost, has let them go too).
    gc = json.loads(run_cli(root, "--json", "gc", "--max-cache", "1", check=True).stdout)
    assert {d["name"] for d in gc["deleted"]} == {a.name, b.name}
    assert [p for p in (store_dir / ".links").iterdir()] == []


def test_stats_and_prometheus_file(store, tmp_path):
    root, (a, b) = store
    run_cli(root, "activate", "p", str(a), check=True)
    prom = tmp_path / "llmgw_store.prom"
    s = json.loads(run_cli(root, "--json", "stats", "--prometheus", str(prom), check=True).stdout)
    assert s["paths"] == 2 and s["profiles"] == 1 and s["generations"] == 1
    assert s["bytes_apparent"] > 0 and s["bytes_on_disk"] > 0
    text = prom.read_text()
    assert f'llmgw_store_paths{{root="{root}"}} 2\n' in text
    assert f'llmgw_store_generations{{root="{root}"}} 1\n' in text
    assert "# TYPE llmgw_store_bytes gauge" in text and not list(tmp_path.glob(".*tmp"))
