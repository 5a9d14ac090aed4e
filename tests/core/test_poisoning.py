"""Store paths are immutable and independent: an edit to one environment's file (as root would:
chmod u+w, write in place) reaches no other environment (the bytecode cache's entries are links to
store pycs, so such an edit reaches the entry, which then fails its check), a damaged cache entry is
never used, and `verify --repair` restores the recorded bytes or refuses — it never records a hash
it did not get from a verified source."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys
import time
from pathlib import Path

from llmgw_store.core import manifest
from tests.conftest import PYTHON, build_json, run_cli, run_in_env

TAG = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
MODULE = f"lib/python{PYTHON}/site-packages/tinyengine/__init__.py"
PYC = f"lib/python{PYTHON}/site-packages/tinyengine/__pycache__/__init__.{TAG}.pyc"
REPAIR_ENV = {"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"}


def edit_in_place(path: Path, data: bytes) -> None:
    """What root (or a tool writing in place) can do to a frozen file: same inode, new bytes."""
    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IWUSR)
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()


def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def recorded_hash(root: Path, name: str) -> str:
    return json.loads(run_cli(root, "--json", "info", name, check=True).stdout)["content_hash"]


def regular_files(tree: Path) -> list[Path]:
    return [Path(d) / f for d, _, fs in os.walk(tree) for f in fs if stat.S_ISREG(os.lstat(Path(d) / f).st_mode)]


def test_an_edit_to_one_environment_reaches_no_later_build(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    # A shares no inode with uv's cache; with the bytecode cache only its pycs, which the cache's
    # entries link (bytecode.link_cache: store inodes linked into the cache, never the other way).
    caches = {(st.st_dev, st.st_ino) for st in map(os.lstat, regular_files(root / "cache"))}
    shared = [str(p.relative_to(a)) for p in regular_files(a) if (os.lstat(p).st_dev, os.lstat(p).st_ino) in caches]
    pyc_cache = {(st.st_dev, st.st_ino) for st in map(os.lstat, regular_files(root / "cache" / "pyc"))}
    assert caches and PYC in shared and all(p.endswith(".pyc") for p in shared)
    assert {(os.lstat(a / p).st_dev, os.lstat(a / p).st_ino) for p in shared} <= pyc_cache
    genuine_src, genuine_pyc = (a / MODULE).read_bytes(), (a / PYC).read_bytes()
    edit_in_place(a / MODULE, genuine_src.replace(b"def main", b"def evil_main_"))
    edit_in_place(a / PYC, flip_last_byte(genuine_pyc))

    # B has another key (a later as-of: tinydep 2.0) but the same tinyengine wheel and module.
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])
    assert (b / MODULE).read_bytes() == genuine_src and (b / PYC).read_bytes() == genuine_pyc
    assert os.stat(b / MODULE).st_ino != os.stat(a / MODULE).st_ino
    assert run_in_env(b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert run_cli(root, "verify", str(b)).returncode == 0
    assert run_cli(root, "verify", str(a)).returncode == 1  # A alone is damaged


def test_repair_restores_a_tampered_pyc_and_keeps_the_recorded_hash(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    before = recorded_hash(root, a.name)
    genuine = (a / PYC).read_bytes()
    edit_in_place(a / PYC, flip_last_byte(genuine))
    os.chmod(a / PYC, 0o444)

    proc = run_cli(root, "--json", "verify", "--repair", "--uv", str(uv_bin), env=REPAIR_ENV)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)["paths"][0]
    assert p["modified"] == [PYC] and p["ok_after_repair"] and p["repair"]["identical"] is True
    assert (a / PYC).read_bytes() == genuine
    assert recorded_hash(root, a.name) == before == p["repair"]["content_hash"]
    assert manifest.read(a)["content_hash"] == before
    assert run_cli(root, "verify").returncode == 0


def test_a_corrupt_bytecode_cache_entry_is_not_used(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    genuine = (a / PYC).read_bytes()
    entries = [p for p in regular_files(root / "cache" / "pyc") if p.read_bytes() == genuine]
    assert len(entries) == 1
    edit_in_place(entries[0], flip_last_byte(genuine))

    proc = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   "--as-of", "2024-06-02", check=True)
    b = Path(json.loads(proc.stdout)["path"])
    assert (b / PYC).read_bytes() == genuine  # checked against its name, refused, compiled again
    assert os.stat(b / PYC).st_ino != os.stat(a / PYC).st_ino
    # the entry was A's pyc (a store inode the cache links): that edit was an edit to A, named by verify
    assert run_cli(root, "verify", str(b)).returncode == 0
    assert run_cli(root, "verify", str(a)).returncode == 1


def test_repair_refuses_a_rebuild_that_differs_from_the_recorded_hash(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    # The index records a hash no rebuild can give (and the manifest no longer agrees with it, so
    # its lock is not trusted either): the repair must not record what the rebuild hashes to.
    bogus = "0" * 64
    with sqlite3.connect(root / "var" / "db.sqlite") as con:
        con.execute("UPDATE paths SET content_hash = ? WHERE name = ?", (bogus, a.name))
    tree_before = manifest.scan(a)

    proc = run_cli(root, "verify", "--repair", "--uv", str(uv_bin), env=REPAIR_ENV)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("llmgw-store: error: the rebuild of") and "the recorded hash is kept" in last
    assert "Traceback" not in proc.stderr
    assert recorded_hash(root, a.name) == bogus
    assert manifest.scan(a) == tree_before  # the store path is left as it was
    assert not list((root / "store").glob("*.partial")) and list((root / "var" / "trash").iterdir()) == []


def test_optimise_never_spreads_a_tampered_file(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])  # built first: its files are the pool's
    genuine = (a / MODULE).read_bytes()
    edit_in_place(a / MODULE, genuine.replace(b"def main", b"def mian"))  # same size, listed digest wrong
    os.chmod(a / MODULE, 0o444)
    # B, built after the edit, does not take the damaged inode at registration (core/dedupe.py)
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])

    proc = run_cli(root, "--json", "optimise")
    # optimise never hides the tampering: A's module is named damaged (exit 1) and left as it is,
    # the evidence for verify --repair, not replaced by the pool's good copy
    assert proc.returncode == 1 and json.loads(proc.stdout)["damaged"] == [f"{a.name}/{MODULE}"], proc.stderr
    assert b"def mian" in (a / MODULE).read_bytes() and run_cli(root, "verify", str(a)).returncode == 1
    assert (b / MODULE).read_bytes() == genuine
    assert os.stat(a / PYC).st_ino == os.stat(b / PYC).st_ino  # positive: identical files now one inode
    assert run_cli(root, "verify", str(b)).returncode == 0
    # No pool entry holds bytes other than those its name promises.
    for entry in (root / "store" / ".links").iterdir():
        assert manifest.file_digest(str(entry)) == entry.name.rsplit("-", 1)[0]


def test_a_tampered_pool_entry_is_not_linked_into_another_path(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    run_cli(root, "optimise", check=True)  # A's files become the pool's
    genuine = (a / PYC).read_bytes()
    edit_in_place(a / PYC, flip_last_byte(genuine))  # the pool entry is the same inode: damaged too
    damaged = os.stat(a / PYC).st_ino
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])

    assert run_cli(root, "optimise").returncode == 1  # A's pyc is named damaged, and left
    assert os.stat(a / PYC).st_ino == damaged
    assert (b / PYC).read_bytes() == genuine and os.stat(b / PYC).st_ino != damaged
    assert run_cli(root, "verify", str(b)).returncode == 0


def test_gc_keeps_bytecode_cache_entries_in_use(root, recipe, index, uv_bin):
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    run_cli(root, "pin", "keep", str(a), check=True)
    entries = sorted(p for p in regular_files(root / "cache" / "pyc") if p.name.endswith(".pyc"))
    assert len(entries) == 2  # tinyengine and tinydep
    linked, stale = entries
    old = time.time() - 90 * 86400
    # an entry that is its own copy (as one made by a build whose path is gone), unused for 90 days
    copy = stale.with_name(".copy")
    copy.write_bytes(stale.read_bytes())
    os.utime(copy, (old, old))
    os.rename(copy, stale)
    foreign = linked.with_name("0" * 64 + ".pyc")  # the old format (a hardlink into environments)
    foreign.write_bytes(b"x")
    linked_time = os.stat(linked).st_mtime  # the store's time (the build's as-of), long ago

    json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    # a pinned path links `linked`: kept whatever its time, and its time not changed
    assert linked.exists() and not stale.exists() and not foreign.exists()
    assert os.stat(linked).st_mtime == linked_time < old


def test_a_forged_bytecode_cache_entry_is_not_used(root, recipe, index, uv_bin, tmp_path):
    """Someone who can write the bytecode cache plants a pyc of their own under the right key with
    a name that hashes right (sha256 of its bytes): without the store's secret (var/, 0600) the
    entry cannot carry a valid tag, so a later build compiles the module itself."""
    import hashlib
    import py_compile

    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    genuine = (a / PYC).read_bytes()
    entries = [Path(d) / f for d, _, fs in os.walk(root / "cache" / "pyc") for f in fs
               if (Path(d) / f).read_bytes() == genuine]
    assert len(entries) == 1
    k = entries[0].name.split(".")[0]
    sentinel = tmp_path / "PWNED"
    evil_src = tmp_path / "evil.py"
    evil_src.write_text(f"open({str(sentinel)!r}, 'w').write('x')\ndef main():\n    print('tinyengine')\n")
    evil_pyc = tmp_path / "evil.pyc"
    py_compile.compile(str(evil_src), cfile=str(evil_pyc), dfile="x",
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    evil = evil_pyc.read_bytes()
    entries[0].unlink()
    (entries[0].parent / f"{k}.{hashlib.sha256(evil).hexdigest()}.pyc").write_bytes(evil)
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])
    assert (b / PYC).read_bytes() == genuine and not sentinel.exists()
    # the positive case: a genuine entry is still reused (B's build wrote one with a valid tag)
    c = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-03")
    assert (Path(c["path"]) / PYC).read_bytes() == genuine
