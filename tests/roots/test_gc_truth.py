"""gc that tells the truth (issue 16): bytes freed on disk checked against the filesystem's own
count on a small real filesystem, --min-free that reads the filesystem, cache pruning by live use,
and attacks on the walk and the cache records."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from llmgw_store.system.trees import free_bytes
from tests.conftest import RELEASE_DATES, build_json, real_uv, run_cli, write_recipe
from tests.support.index_server import PackageIndex
from tests.support.tmpfs import tmpfs
from tests.support.wheels import build_wheel

MiB = 1 << 20
A_DATE, B_DATE, C_DATE = "2024-02-02", "2024-03-01", "2024-08-01"  # A and B resolve alike; C gets tinydep 2.0


def _payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def fat_wheels(d: Path) -> dict[str, Path]:
    """The test wheels with megabytes of incompressible data each, so that what gc frees dwarfs
    what the index and the logs write meanwhile."""
    script = {"tinyengine": "tinyengine:main"}
    return {
        "tinydep-1.0": build_wheel(d, "tinydep", "1.0", extra_files={"tinydep/data.bin": _payload(1, 2 * MiB)}),
        "tinydep-2.0": build_wheel(d, "tinydep", "2.0", extra_files={"tinydep/data.bin": _payload(2, 8 * MiB),
                                                                    "tinydep/cached.bin": _payload(4, 2 * MiB)}),
        "tinyengine-1.0": build_wheel(d, "tinyengine", "1.0", requires=("tinydep",), scripts=script,
                                      extra_files={"tinyengine/data.bin": _payload(3, 3 * MiB)}),
        "tinyengine-1.1": build_wheel(d, "tinyengine", "1.1", requires=("tinydep",), scripts=script),
    }


@pytest.fixture(scope="module")
def fat_wheel_files(tmp_path_factory) -> dict[str, Path]:
    return fat_wheels(tmp_path_factory.mktemp("fatwheels"))


@pytest.fixture
def fat_index(fat_wheel_files):
    idx = PackageIndex()
    for key, wheel in fat_wheel_files.items():
        idx.add(key.split("-")[0], wheel, RELEASE_DATES[key])
    idx.start()
    yield idx
    idx.stop()


@pytest.fixture
def small_fs(tmp_path):
    """A fresh 128 MiB tmpfs: nothing else writes to it, so its statvfs counts only what the test
    does. Skipped where mounting is not permitted."""
    with tmpfs(tmp_path / "mnt", "128m") as mnt:
        yield mnt


def _build(root: Path, index: PackageIndex, as_of: str, tmp: Path) -> str:
    recipe = write_recipe(tmp, 'version = "1.0"')
    return Path(build_json(root, recipe, index, real_uv(), "--as-of", as_of)["path"]).name


def _gc(root: Path, *args: str) -> dict:
    return json.loads(run_cli(root, "--json", "gc", *args, check=True).stdout)


def _set_last_used(root: Path, when: dict[str, str]) -> None:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    for name, at in when.items():
        con.execute("UPDATE paths SET last_used = ? WHERE name = ?", (at, name))
    con.commit()
    con.close()


def _on_disk_total(r: dict) -> int:
    return sum(v for k, v in r["freed"].items() if k != "stale_files")


def test_freed_matches_the_filesystem_with_hardlinks(small_fs, fat_index, tmp_path):
    root = small_fs / "root"
    a, b, c = (_build(root, fat_index, d, tmp_path) for d in (A_DATE, B_DATE, C_DATE))
    # Identical files across a, b and c become one inode each (the pool holds a link too).
    # (registration shares them already: core/dedupe.py; optimise finds what is left, if anything)
    json.loads(run_cli(root, "--json", "optimise", check=True).stdout)
    assert any(p.is_file() and not p.is_symlink() and p.stat().st_nlink > 2 for p in (root / "store" / b).rglob("*"))
    # An environment made before issue 12 shares a file with the uv cache: deleting it frees nothing.
    archive = next((root / "cache" / "uv" / "archive-v0").rglob("cached.bin"))
    site = next((root / "store" / c / "lib").glob("python3*/site-packages"))
    os.chmod(site / "tinydep", 0o755)
    os.unlink(site / "tinydep" / "cached.bin")
    os.link(archive, site / "tinydep" / "cached.bin")
    os.chmod(site / "tinydep", 0o555)
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    st = json.loads(run_cli(root, "--json", "stats", check=True).stdout)
    # a, b and c hold 23 MiB of data; b's 5 MiB and c's engine (3 MiB) are a's inodes after optimise (less
    # the 2 MiB pool copy of c's cached.bin, which the link to the uv cache left unlinked)
    assert st["bytes_apparent"] > 23 * MiB and st["bytes_on_disk"] < st["bytes_apparent"] - 5 * MiB
    assert st["cache_bytes_on_disk"] == st["uv_cache_bytes_unshared"] + st["pyc_cache_bytes"] > 0

    plan = _gc(root, "--dry-run")
    assert {d["name"] for d in plan["deleted"]} == {b, c}
    os.sync()
    before = free_bytes(root)
    r = _gc(root)
    os.sync()
    delta = free_bytes(root) - before
    assert {d["name"] for d in r["deleted"]} == {b, c}
    reported = _on_disk_total(r)
    assert delta > 0 and abs(reported - delta) <= 0.05 * delta, (reported, delta, r["freed"])
    # Apparent sizes would have claimed b's 5 MiB and c's 13 MiB of data; but b shares all of its
    # data with a, and c its engine with a and cached.bin with the uv cache: c's 8 MiB of its
    # own, and the pool's copy of its cached.bin, are what comes back.
    assert sum(d["size"] for d in r["deleted"]) > reported + 7 * MiB and reported > 9 * MiB
    # The dry run predicted the store paths' part from the same rules.
    assert abs(plan["freed"]["store_paths"] - r["freed"]["store_paths"]) <= 0.05 * r["freed"]["store_paths"] + 65536


def test_min_free_reads_the_filesystem(small_fs, fat_index, tmp_path):
    root = small_fs / "root"
    a, b, c = (_build(root, fat_index, d, tmp_path) for d in (A_DATE, B_DATE, C_DATE))
    run_cli(root, "optimise", check=True)
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    # b, least recently used, shares all its data with a: deleting it frees next to nothing. Its
    # apparent size (5 MiB) would have looked like enough; c's own 10 MiB are what frees the space.
    _set_last_used(root, {b: "2025-01-01T00:00:00Z", c: "2025-01-02T00:00:00Z"})
    os.sync()
    want = free_bytes(root) + 2 * MiB
    r = _gc(root, "--min-free", str(want))
    assert [d["name"] for d in r["deleted"]] == [b, c]
    assert free_bytes(root) >= want and r["free_after"] >= want


def test_max_cache_keeps_what_live_paths_use(fat_index, tmp_path):
    root = tmp_path / "root"
    a, c = (_build(root, fat_index, d, tmp_path) for d in (A_DATE, C_DATE))
    con = sqlite3.connect(root / "var" / "db.sqlite")
    uses = {(p, e) for p, e in con.execute("SELECT path_name, entry FROM cache_uses WHERE cache = 'uv'")}
    con.close()
    by_path = {n: {e for p, e in uses if p == n} for n in (a, c)}
    assert len(by_path[a]) == len(by_path[c]) == 2 and len(by_path[a] & by_path[c]) == 1  # tinyengine 1.0 shared
    archives = root / "cache" / "uv" / "archive-v0"
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    pycs = {n: {p.read_bytes() for p in (root / "store" / n / "lib").rglob("*.pyc")} for n in (a, c)}
    assert pycs[c] - pycs[a]  # tinydep 2.0's module

    r = _gc(root, "--max-cache", "0")
    assert {d["name"] for d in r["deleted"]} == {c}
    left = {p.name for p in archives.iterdir()}
    assert by_path[a] <= left and not (by_path[c] - by_path[a]) & left  # c's tinydep 2.0 is gone
    assert r["cache_pruned"]["kept_live"] >= 2
    # c's tinydep 2.0 (10 MiB unpacked) was in the wheel home, linked by c alone: it went with c
    # (every gc prunes what no path links), and so did c's own bytecode (the cache's entries were
    # links to c's pycs: bytecode.link_cache), so --max-cache found nothing of c's left.
    assert r["freed"]["store_paths"] > 10 * MiB
    assert r["freed"]["cache_entries"] == r["cache_pruned"]["bytes"]
    # the bytecode cache: entries with a live path's bytes stay, c's own went
    cached = {p.read_bytes() for p in (root / "cache" / "pyc").rglob("*.pyc")}
    assert pycs[a] <= cached and not (pycs[c] - pycs[a]) & cached
    text = run_cli(root, "gc", "--max-cache", "0", check=True).stdout
    assert "kept for live paths" in text

    # What a repair or a cold rollback of a needs is there: its recorded lock installs offline,
    # with the index stopped, from the store's uv cache (the same uv, --offline, --require-hashes).
    fat_index.stop()
    env = root / "store" / a
    target = tmp_path / "reinstall"
    subprocess.run([str(real_uv()), "venv", "-q", str(target)], check=True)
    lock = tmp_path / "a.lock"
    lock.write_text(json.loads((env / ".llmgw" / "manifest.json").read_text())["lock"])
    done = subprocess.run([str(real_uv()), "pip", "install", "--offline", "--require-hashes", "--no-deps", "-r",
                           str(lock), "--python", str(target / "bin" / "python"), "--link-mode", "copy",
                           "--index-url", json.loads((env / ".llmgw" / "manifest.json").read_text())["index_url"]],
                          env={**os.environ, "UV_CACHE_DIR": str(root / "cache" / "uv"), "UV_NO_CONFIG": "1"},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    out = subprocess.run([str(target / "bin" / "tinyengine")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tinyengine 1.0 tinydep 1.0"

    # --prune-live takes those too.
    r = _gc(root, "--max-cache", "0", "--prune-live")
    assert r["cache_pruned"]["live_entries"] >= 2 and not any(archives.iterdir())


def test_hostile_records_and_links_never_reach_outside(fat_index, tmp_path):
    root = tmp_path / "root"
    a, c = (_build(root, fat_index, d, tmp_path) for d in (A_DATE, C_DATE))
    outside = tmp_path / "outside"
    (outside / "archive-v0" / "x").mkdir(parents=True)
    (outside / "keep.bin").write_bytes(b"k" * 100_000)
    (outside / "archive-v0" / "x" / "keep.bin").write_bytes(b"k" * 100_000)
    # a cache record naming `..` paths, as a tampered index would
    con = sqlite3.connect(root / "var" / "db.sqlite")
    for entry in ("../../../outside", f"../../{'..' * 3}/{outside}", "/" + str(outside)):
        con.execute("INSERT INTO cache_uses VALUES (?, 'uv', ?, '2030-01-01T00:00:00Z')", (a, entry))
    con.commit()
    con.close()
    # a link in the uv cache's archive bucket, and one in a dead path, both pointing outside
    os.symlink(outside, root / "cache" / "uv" / "archive-v0" / "evil")
    env = root / "store" / c
    os.chmod(env, 0o755)
    os.symlink(outside, env / "escape")
    os.symlink(outside / "keep.bin", env / "escape-file")
    os.chmod(env, 0o555)

    r = _gc(root, "--max-cache", "0", "--prune-live")
    assert {d["name"] for d in r["deleted"]} == {a, c}
    assert (outside / "keep.bin").read_bytes() == b"k" * 100_000
    assert (outside / "archive-v0" / "x" / "keep.bin").exists()
    # the escape links were removed as links: nothing outside was counted as freed
    assert r["freed"]["store_paths"] < sum(d["size"] for d in r["deleted"]) + 1 * MiB
    con = sqlite3.connect(root / "var" / "db.sqlite")
    assert con.execute("SELECT count(*) FROM cache_uses WHERE entry LIKE '%..%' OR entry LIKE '/%'").fetchone()[0] == 0
    con.close()


def test_remove_tree_empties_frozen_directories_as_a_plain_user(request):
    """Root needs no chmod to empty a frozen (0555) directory; another user does, and gets it from
    remove_tree (only on the directories it walks: a link to a directory outside is unlinked)."""
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        pytest.skip("needs root to hand the tree to another user, and setpriv")
    base = Path(tempfile.mkdtemp(prefix="llmgw-plain-"))  # tmp_path's parents are closed to others
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", str(base)], check=False))
    os.chmod(base, 0o755)
    tree = base / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_bytes(b"x" * 10_000)
    (tree / "a" / "g").write_bytes(b"y" * 5_000)
    os.link(tree / "a" / "g", tree / "g2")  # two links inside: freed once, at the second
    outside = base / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    os.symlink(outside, tree / "a" / "escape")
    subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
    for d in (tree / "a" / "b", tree / "a", tree):
        os.chmod(d, 0o555)
    expected = sum(os.lstat(p).st_blocks * 512 for p in (tree / "a" / "b" / "f", tree / "a" / "g",
                                                          tree / "a" / "b", tree / "a", tree))
    repo = str(Path(__file__).resolve().parents[2])
    script = (f"import sys; sys.path.insert(0, {repo!r}); from llmgw_store.roots.accounting import remove_tree; "
              f"print(remove_tree({str(tree)!r}))")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert not tree.exists() and (outside / "keep").read_bytes() == b"k"
    assert int(done.stdout) == expected


def _footprints(root: Path) -> dict[str, dict]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    try:
        return {n: json.loads(i) for n, i in con.execute("SELECT ident, info FROM tools WHERE kind = 'footprint'")}
    finally:
        con.close()


def _add_behind_the_stores_back(tree: Path, size: int) -> None:
    os.chmod(tree, 0o755)
    (tree / "added.bin").write_bytes(_payload(9, size))
    os.chmod(tree, 0o555)


def test_a_dry_run_reads_what_a_path_costs_from_its_record(fat_index, tmp_path):
    """A registered path's footprint (blocks of its own inodes, the inodes it shares) is recorded
    when it is registered; a dry run predicts from it without walking the tree (issue 33: gc flat
    at scale), and gc's deletion counts what it really frees."""
    root = tmp_path / "root"
    a, c = (_build(root, fat_index, d, tmp_path) for d in (A_DATE, C_DATE))
    records = _footprints(root)
    assert {a, c} <= set(records)
    assert all(records[n]["ino"] == os.lstat(root / "store" / n).st_ino for n in (a, c))
    plan = _gc(root, "--dry-run")
    predicted = {d["name"]: d["freed"] for d in plan["deleted"]}
    assert set(predicted) == {a, c} and all(v > 0 for v in predicted.values())

    # 4 MiB written into c behind the store's back: a prediction from the record does not see it
    # (no walk); the deletion counts it
    _add_behind_the_stores_back(root / "store" / c, 4 * MiB)
    again = {d["name"]: d["freed"] for d in _gc(root, "--dry-run")["deleted"]}
    assert again == predicted
    # a tree replaced since its record (another directory inode): the record is not used
    tree = root / "store" / a
    subprocess.run(["cp", "-a", str(tree), str(tree) + ".new"], check=True)
    os.chmod(root / "store", 0o755)
    subprocess.run(["chmod", "-R", "u+w", str(tree)], check=True)
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    os.rename(str(tree) + ".new", tree)
    _add_behind_the_stores_back(tree, 2 * MiB)
    replaced = {d["name"]: d["freed"] for d in _gc(root, "--dry-run")["deleted"]}
    assert replaced[a] >= predicted[a] + 2 * MiB and replaced[c] == predicted[c]

    r = _gc(root)
    freed = {d["name"]: d["freed"] for d in r["deleted"]}
    assert freed[c] >= 4 * MiB and freed[a] >= 2 * MiB
    # (a path's own `freed` leaves out the wheel home's links it shared: pruned after it, in the total)
    assert r["freed"]["store_paths"] >= plan["freed"]["store_paths"] + 6 * MiB - 65536
    assert not ({a, c} & set(_footprints(root)))  # forgotten with the paths


def test_a_malformed_footprint_record_means_a_walk(fat_index, tmp_path):
    root = tmp_path / "root"
    a = _build(root, fat_index, A_DATE, tmp_path)
    honest = _gc(root, "--dry-run")["deleted"][0]["freed"]
    con = sqlite3.connect(root / "var" / "db.sqlite")
    for bad in ({"dev": 1}, {**_footprints(root)[a], "own": -5}, {**_footprints(root)[a], "shared": [["x", 1, 1]]}):
        con.execute("UPDATE tools SET info = ? WHERE kind = 'footprint' AND ident = ?", (json.dumps(bad), a))
        con.commit()
        assert _gc(root, "--dry-run")["deleted"][0]["freed"] == honest
    con.close()
