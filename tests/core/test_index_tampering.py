"""A tampered index, a planted pool or cache link, a damaged path found after the index was lost:
none of them makes a command touch anything outside store/ or delete what a root holds."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, build_json, run_cli

ENV = {"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"}


def _plant_row(root: Path, name: str) -> None:
    """A copy of the first `paths` row, under another key, named `name`."""
    con = sqlite3.connect(root / "var" / "db.sqlite")
    cur = con.execute("SELECT * FROM paths")
    row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    row.update(name=name, key="x" * 32)
    con.execute(f"INSERT INTO paths ({','.join(row)}) VALUES ({','.join('?' * len(row))})", tuple(row.values()))
    con.commit()
    con.close()


def _victim(root: Path, suffix: str = "") -> Path:
    victim = root.parent / f"victim_dir{suffix}"
    victim.mkdir()
    (victim / "precious").write_text("data")
    return victim


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_gc_never_renames_a_malformed_row_outside_the_store(root, recipe, index, uv_bin, how):
    env = Path(build_json(root, recipe, index, uv_bin)["path"])
    victim = _victim(root)
    _plant_row(root, "../../victim_dir" if how == "relative" else str(victim))
    r = run_cli(root, "--json", "gc")
    assert r.returncode == 0, r.stderr
    assert (victim / "precious").read_text() == "data"
    assert "malformed" in r.stderr
    # the genuine, unrooted path is still collected
    assert not env.exists()
    assert env.name in [d["name"] for d in json.loads(r.stdout)["deleted"]]


def test_verify_repair_never_builds_at_a_malformed_row(root, recipe, index, uv_bin):
    env = Path(build_json(root, recipe, index, uv_bin)["path"])
    victim, partial = _victim(root), _victim(root, ".partial")
    _plant_row(root, str(victim))
    r = run_cli(root, "--json", "verify", "--repair", "--uv", str(uv_bin), env=ENV)
    assert (victim / "precious").exists() and (partial / "precious").exists()
    assert "malformed" in r.stderr
    # the genuine path is verified as usual
    assert r.returncode == 0, r.stderr
    assert [p["name"] for p in json.loads(r.stdout)["paths"]] == [env.name]


def test_a_malformed_name_never_becomes_a_path(tmp_path):
    from llmgw_store.base.errors import IndexError_
    from llmgw_store.core.layout import Layout

    layout = Layout.at(tmp_path)
    good = "0" * 32 + "-tiny-1.0-cpu"
    assert layout.path_of(good) == layout.store / good
    assert layout.partial_of(good) == layout.store / (good + ".partial")
    for bad in ("../../victim", "/abs/victim", "0" * 32 + "-x/../../y", "0" * 32 + "-x\n", "", "0" * 32 + "-" + "a" * 300):
        with pytest.raises(IndexError_, match="doctor --rebuild-index"):
            layout.path_of(bad)
        with pytest.raises(IndexError_):
            layout.partial_of(bad)


MODULE = f"lib/python{PYTHON}/site-packages/tinyengine/__init__.py"
# The module's bytecode: a file of each path's own (the module itself is linked from the wheel home,
# build/wheelhome.py), identical in every path, so what registration and optimise share by the pool.
PYC = f"lib/python{PYTHON}/site-packages/tinyengine/__pycache__/__init__.{sys.implementation.cache_tag}.pyc"
AS_OF = "2024-02-02T00:00:00Z"


def _rooted(root: Path, recipe: Path, index, uv_bin: Path) -> Path:
    env = Path(build_json(root, recipe, index, uv_bin, "--as-of", AS_OF)["path"])
    run_cli(root, "activate", "prod", str(env), check=True)
    run_cli(root, "pin", "keep", str(env), check=True)
    return env


def _lose_index(root: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (root / "var" / f"db.sqlite{suffix}").unlink(missing_ok=True)


def test_a_build_after_the_index_was_lost_keeps_a_damaged_rooted_path(root, recipe, index, uv_bin):
    env = _rooted(root, recipe, index, uv_bin)
    module = env / MODULE
    os.chmod(module, 0o644)
    with open(module, "ab") as f:
        f.write(b"\n# local hotfix\n")
    os.chmod(module, 0o444)
    _lose_index(root)
    proc = subprocess.Popen([str(env / "bin" / "python"), "-c", "import time; time.sleep(60)"], cwd=env)
    try:
        r = run_cli(root, "--progress=none", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                    "--as-of", AS_OF)  # progress off: stderr is the error alone
    finally:
        proc.kill()
        proc.wait()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"llmgw-store: error: {env.name} exists but does not match its manifest (damaged: ")
    assert lines[0].endswith("it is kept, since it may be in use: remove the profiles and pins that hold it and let "
                             "`llmgw-store gc` take it, then build again")
    assert b"# local hotfix" in module.read_bytes()
    assert (root / "profiles" / "prod").resolve() == env


def test_a_build_after_the_index_was_lost_registers_a_complete_path_again(root, recipe, index, uv_bin):
    env = _rooted(root, recipe, index, uv_bin)
    ino = os.stat(env / MODULE).st_ino
    _lose_index(root)
    r = build_json(root, recipe, index, uv_bin, "--as-of", AS_OF)
    assert r["how"] == "recovered" and r["path"] == str(env)
    assert os.stat(env / MODULE).st_ino == ino


@pytest.mark.parametrize("victim", ["store/.links", "cache/pyc", "var/trash", "cache/downloads"])
def test_gc_and_optimise_never_follow_a_linked_cache_dir(root, recipe, index, uv_bin, tmp_path, victim):
    build_json(root, recipe, index, uv_bin)
    outside = tmp_path / "other_disk"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "weights.bin").write_text("precious")
    (outside / "old.iso").write_text("precious")
    old = time.time() - 30 * 86400 * 2
    os.utime(outside / "old.iso", (old, old))
    target = root / victim
    if target.exists():
        shutil.rmtree(target)
    os.symlink(outside, target)
    for command in (("gc",), ("optimise",)):
        r = run_cli(root, *command)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and str(target) in lines[0], (command, r.stderr)
    assert sorted(p.name for p in outside.rglob("*")) == ["old.iso", "sub", "weights.bin"]
    assert os.path.islink(target)


def test_the_pool_is_a_real_public_directory_of_the_store(root, recipe, index, uv_bin):
    build_json(root, recipe, index, uv_bin)
    pool = root / "store" / ".links"
    # made by the build, which shares its files through it when it registers (core/dedupe.py)
    assert not pool.is_symlink() and stat.S_IMODE(os.lstat(pool).st_mode) == 0o755
    assert any(pool.iterdir())
    run_cli(root, "optimise", check=True)
    assert not pool.is_symlink() and stat.S_IMODE(os.lstat(pool).st_mode) == 0o755
    assert run_cli(root, "gc").returncode == 0


def _two_paths(root: Path, recipe: Path, index, uv_bin: Path) -> tuple[Path, Path]:
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])
    assert (a / PYC).read_bytes() == (b / PYC).read_bytes()
    return a, b


def _pool_entry(root: Path, env: Path) -> Path:
    from blake3 import blake3

    return root / "store" / ".links" / f"{blake3((env / PYC).read_bytes()).hexdigest()}-f"


@pytest.mark.parametrize("plant", ["setuid_world_writable", "cache_inode"])
def test_optimise_never_links_a_planted_pool_entry_into_store_paths(root, recipe, index, uv_bin, plant):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    entry = _pool_entry(root, a)
    entry.unlink()  # A's file was pooled when A registered: the plant takes its name
    if plant == "setuid_world_writable":
        entry.write_bytes((a / PYC).read_bytes())
        os.chmod(entry, 0o6777)
    else:  # the right bytes, but a cache's own inode, writable as a cache's files may be (the
        # bytecode cache's entries a build used are links to its frozen pycs: a store inode, so the
        # plant is a cache file of its own beside them)
        hits = [Path(d, f) for d, _, fs in os.walk(root / "cache" / "pyc") for f in fs
                if Path(d, f).read_bytes() == (a / PYC).read_bytes()]
        assert hits and os.stat(hits[0]).st_ino == os.stat(a / PYC).st_ino
        own = hits[0].with_name(hits[0].name + ".planted")
        own.write_bytes((a / PYC).read_bytes())
        os.chmod(own, 0o644)
        os.link(own, entry)
    planted = os.stat(entry).st_ino
    # B registers after the plant: sharing at registration must not link it either
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])
    assert (a / PYC).read_bytes() == (b / PYC).read_bytes()
    run_cli(root, "optimise", check=True)
    for env in (a, b):
        st = os.stat(env / PYC)
        assert st.st_ino != planted and not st.st_mode & 0o7222
    assert run_cli(root, "verify").returncode == 0
    # the planted inode left the pool; a store file took its place, and the two paths share it
    assert os.stat(entry).st_ino != planted
    assert os.stat(a / PYC).st_ino == os.stat(b / PYC).st_ino == os.stat(entry).st_ino


ODD_NAMES = ["a\rb", "c\r\nd", "e\x0bf", "g\x0ch", "i\x1cj", "k\x85l", "m\u2028n", "o\u2029p", "q\nr", "s\tt", "u\\v"]


def test_a_listing_of_files_with_line_break_like_names_reads_back_as_written(tmp_path):
    from llmgw_store.core import manifest

    tree = tmp_path / "tree"
    (tree / manifest.MANIFEST_DIR).mkdir(parents=True)
    for i, name in enumerate(ODD_NAMES):
        (tree / name).write_text(f"file {i}\n")
    (tree / "plain").write_text("plain\n")
    entries = manifest.scan(tree)
    assert {e.path for e in entries} >= set(ODD_NAMES) | {"plain"}
    manifest.write_contents(tree, entries)
    assert manifest.read_contents(tree) == entries
    assert manifest.compare(manifest.read_contents(tree), manifest.scan(tree)) == {"modified": [], "missing": [], "extra": []}


def test_optimise_skips_a_path_whose_listing_cannot_be_read(root, recipe, index, uv_bin):
    from llmgw_store.core import manifest

    a, b = _two_paths(root, recipe, index, uv_bin)
    contents = a / manifest.CONTENTS
    os.chmod(contents.parent, 0o755)
    os.chmod(contents, 0o644)
    with open(contents, "a") as f:
        f.write("not a listing line\n")
    r = run_cli(root, "optimise")
    assert r.returncode == 0, r.stderr
    assert f"{a.name}: skipped, its contents listing cannot be read" in r.stderr
    # the other path was still optimised: its files are in the pool
    assert os.stat(b / PYC).st_ino == os.stat(_pool_entry(root, b)).st_ino


def test_rebuild_index_leaves_out_a_path_tampered_while_the_index_was_lost(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    _lose_index(root)
    module = a / MODULE
    os.chmod(module, 0o644)
    module.write_bytes(module.read_bytes().replace(b"def main", b"EVIL = 1\ndef main"))
    os.chmod(module, 0o444)
    d = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert a.name not in d["registered"] and a.name in d["skipped"]
    # so a later build is no cache hit on the tampered tree: it refuses (the path is damaged)
    r = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    assert r.returncode == 1 and "does not match its manifest" in r.stderr


def test_rebuild_index_registers_an_intact_path(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    _lose_index(root)
    d = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert d["registered"] == [a.name] and d["skipped"] == []
    assert build_json(root, recipe, index, uv_bin)["how"] == "hit"


@pytest.mark.parametrize("args", [("list",), ("stats",), ("verify",)], ids=lambda a: a[0])
def test_a_missing_index_says_run_doctor_not_no_store(root, recipe, index, uv_bin, args):
    build_json(root, recipe, index, uv_bin)
    _lose_index(root)
    r = run_cli(root, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "index" in lines[0] and "missing" in lines[0] and "llmgw-store doctor --rebuild-index" in lines[0]
    assert "no store at" not in lines[0]
    assert not (root / "var" / "db.sqlite").exists()  # looking made nothing


def test_rebuild_index_passes_over_a_directory_not_named_like_a_store_path(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    stray = root / "store" / "not-a-store-path"
    stray.mkdir()
    d = json.loads(run_cli(root, "--json", "doctor", "--rebuild-index", check=True).stdout)
    assert d["registered"] == [a.name] and d["skipped"] == [stray.name]
    assert stray.is_dir()
