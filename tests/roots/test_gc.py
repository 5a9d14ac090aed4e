"""gc on real stores: which paths go and which stay, each option, crashes mid-sweep, concurrency."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llmgw_store.core.manifest import read as read_manifest
from llmgw_store.core.manifest import tree_hash
from tests.conftest import build_store, cli_cmd, copy_store, real_uv, run_cli
from tests.support.barrier import Barrier

DATES = ("2024-02-02", "2024-06-02", "2024-08-01")


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    """A store holding three unrooted environments A, B, C (tinyengine 1.0 as of three dates)."""
    t = build_store(tmp_path_factory.mktemp("gc"), wheels, *DATES)
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    return copy_store(template["root"], tmp_path / "root"), template["names"]


def on_disk(root: Path) -> set[str]:
    # .links: the pool; .wheels: the wheel home
    return {p.name for p in (root / "store").iterdir() if "-uv-" not in p.name and p.name not in (".links", ".wheels")}


def indexed(root: Path) -> set[str]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    return {r[0] for r in con.execute("SELECT name FROM paths WHERE engine != 'uv'")}


def gc(root: Path, *args: str, **kw) -> dict:
    return json.loads(run_cli(root, "--json", "gc", *args, check=True, **kw).stdout)


def test_unrooted_paths_go_and_rooted_stay(store):
    root, (a, b, c) = store
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    run_cli(root, "pin", "keepme", str(root / "store" / b), check=True)
    r = gc(root)
    assert [d["name"] for d in r["deleted"]] == [c] and r["freed"]["store_paths"] > 0
    assert on_disk(root) == indexed(root) == {a, b}
    assert list((root / "var" / "trash").iterdir()) == []
    assert {"kind": "generation", "profile": "p", "generation": 1, "paths": [a]} in r["kept"]
    assert {"kind": "pin", "pin": "keepme", "paths": [b]} in r["kept"]
    assert gc(root)["deleted"] == []


def test_dry_run_deletes_nothing(store):
    root, names = store
    r = gc(root, "--dry-run")
    assert sorted(d["name"] for d in r["deleted"]) == sorted(names) and r["dry_run"]
    assert on_disk(root) == indexed(root) == set(names)
    text = run_cli(root, "gc", "--dry-run", check=True)
    assert text.stdout.startswith("3 store path(s) to delete, would free")


def test_keep_and_delete_older_than(store):
    root, (a, b, c) = store
    for n in (a, b, c):
        run_cli(root, "activate", "p", str(root / "store" / n), check=True)
    r = gc(root, "--keep", "2")
    assert r["generations_deleted"] == {"p": [1]} and [d["name"] for d in r["deleted"]] == [a]
    old = time.time() - 40 * 86400
    os.utime(root / "profiles" / "p-2-link", (old, old), follow_symlinks=False)
    os.utime(root / "profiles" / "p-3-link", (old, old), follow_symlinks=False)  # current: kept anyway
    r = gc(root, "--delete-older-than", "30d")
    assert r["generations_deleted"] == {"p": [2]} and [d["name"] for d in r["deleted"]] == [b]
    assert on_disk(root) == {c} and os.readlink(root / "profiles" / "p") == "p-3-link"


def _set_last_used(root: Path, order: list[str]) -> None:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    for i, name in enumerate(order):
        con.execute("UPDATE paths SET last_used = ? WHERE name = ?", (f"2025-01-0{i + 1}T00:00:00Z", name))
    con.commit()


def test_max_freed_takes_least_recently_used_first(store):
    root, (a, b, c) = store
    _set_last_used(root, [b, c, a])
    r = gc(root, "--max-freed", "1")
    assert [d["name"] for d in r["deleted"]] == [b]
    r = gc(root, "--max-freed", "1")
    assert [d["name"] for d in r["deleted"]] == [c]
    assert on_disk(root) == {a}


def test_min_free(store):
    root, (a, b, c) = store
    assert gc(root, "--min-free", "1K")["deleted"] == []  # already that much free: nothing to do
    _set_last_used(root, [c, a, b])
    # More than the disk can ever have free: everything dead goes, least recently used first.
    # (How far a budget goes is the same code as --max-freed, tested exactly above; a budget of a
    # few bytes over the free space would race with anything else writing to this disk.)
    r = gc(root, "--min-free", "1000T")
    assert [d["name"] for d in r["deleted"]] == [c, a, b]


def test_running_process_keeps_its_environment(store):
    root, (a, b, c) = store
    env = root / "store" / a
    proc = subprocess.Popen([str(env / "bin" / "python"), "-c", "import time; print('up', flush=True); time.sleep(120)"],
                            cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"  # running from the environment now
        r = gc(root)
        assert {d["name"] for d in r["deleted"]} == {b, c}
        assert on_disk(root) == {a}
        assert {"kind": "process", "pid": proc.pid, "paths": [a]} in r["kept"]
    finally:
        proc.kill()
        proc.wait()
    assert [d["name"] for d in gc(root)["deleted"]] == [a]


def test_open_file_keeps_its_environment(store):
    root, (a, b, c) = store
    holder = subprocess.Popen(["sh", "-c", f"exec 3<'{root / 'store' / b / 'pyvenv.cfg'}'; cd /; echo up; exec sleep 120"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "up\n"  # the file is open now
        gc(root)
        assert on_disk(root) == {b}
    finally:
        holder.kill()
        holder.wait()


def test_crash_leftovers_are_garbage_but_builds_in_flight_are_not(store, template, tmp_path):
    root, names = store
    (root / "store" / "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-junk-1-cpu").mkdir()
    (root / "store" / "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy-junk-1-cpu.partial").mkdir()
    gate = Barrier(tmp_path)
    builder = subprocess.Popen(cli_cmd(root, "build", str(template["recipe"]), "--index-url", template["index"].url,
                                       "--uv", str(real_uv()), "--as-of", "2024-09-09"),
                               env={**os.environ, **gate.env("BUILD_PAUSE")},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        gate.reached("BUILD_PAUSE", builder)  # its .partial holds a venv, its temp root is up
        r = gc(root)
        deleted = {d["name"] for d in r["deleted"]}
        assert "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-junk-1-cpu" in deleted
        assert "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy-junk-1-cpu.partial" in deleted
        in_flight = [p.name for p in (root / "store").iterdir() if p.name.endswith(".partial")]
        assert len(in_flight) == 1 and in_flight[0] not in deleted
        assert (root / "var" / "locks" / f"{in_flight[0][:32]}.lock").exists()  # its lock is left alone
    finally:
        builder.kill()
        builder.wait()


@pytest.mark.parametrize("point", ["GC_AFTER_FORGET", "GC_BEFORE_EMPTY_TRASH"])
def test_sigkill_mid_sweep_leaves_a_consistent_store(store, point, tmp_path):
    root, (a, b, c) = store
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    gate = Barrier(tmp_path)
    victim = subprocess.Popen(cli_cmd(root, "gc"), env={**os.environ, **gate.env(point)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gate.reached(point, victim)
    if point == "GC_AFTER_FORGET":
        assert len(indexed(root)) == 2  # one path forgotten, still in store/
    else:
        assert list((root / "var" / "trash").iterdir())  # renamed to the trash, not yet emptied
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    # Every registered path is complete on disk; what is not registered is garbage for the next gc.
    assert indexed(root) <= on_disk(root) and a in indexed(root)
    for name in indexed(root):
        assert tree_hash(root / "store" / name)[0] == read_manifest(root / "store" / name)["content_hash"]
    gc(root)
    assert on_disk(root) == indexed(root) == {a}
    assert list((root / "var" / "trash").iterdir()) == []


def test_second_gc_gives_up_with_75(store, tmp_path):
    root, _ = store
    gate = Barrier(tmp_path)
    first = subprocess.Popen(cli_cmd(root, "gc"), env={**os.environ, **gate.env("GC_AFTER_FORGET")},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        gate.reached("GC_AFTER_FORGET", first)  # it holds the gc lock
        second = run_cli(root, "gc", "--lock-timeout", "1")
        assert second.returncode == 75
        error = second.stderr.splitlines()[-1]
        assert error.startswith(f"llmgw-store: error: collecting garbage: gave up after 1s waiting for pid {first.pid} ")
        assert error.endswith(f"which holds {root / 'var' / 'locks' / 'gc.lock'}; try again later or raise --lock-timeout")
    finally:
        first.kill()
        first.wait()


def test_gc_loop_never_takes_what_builds_and_activations_make(store, template):
    root, _ = store
    stop = root.parent / "stop-gc"
    loop = subprocess.Popen(["sh", "-c", f"while [ ! -e '{stop}' ]; do {' '.join(cli_cmd(root, 'gc'))} >/dev/null 2>&1 || exit 9; done"])
    dates = [f"2024-{m:02d}-{d:02d}" for m in (3, 7) for d in range(1, 11)]  # 20 new keys

    def activate(i: int) -> str:
        proc = run_cli(root, "--json", "activate", f"w{i}", str(template["recipe"]), "--index-url",
                       template["index"].url, "--uv", str(real_uv()), "--as-of", dates[i])
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["path"]

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            paths = list(pool.map(activate, range(20)))
    finally:
        stop.touch()
        assert loop.wait(timeout=120) == 0
    assert len(set(paths)) == 20
    for p in map(Path, paths):
        assert tree_hash(p)[0] == read_manifest(p)["content_hash"]
    gc(root)
    assert {Path(p).name for p in paths} <= on_disk(root)


def test_caches_and_stale_files(store):
    root, (a, b, c) = store
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    (root / "var" / "temproots" / "999999").write_text(f"{b}\n")  # no live process holds it
    (root / "var" / "locks" / f"{'q' * 32}.lock").write_text("")
    old, new = root / "cache" / "downloads" / "old.whl", root / "cache" / "downloads" / "new.whl"
    old.write_bytes(b"x" * 1000)
    new.write_bytes(b"y" * 10)
    t = time.time() - 7200
    os.utime(old, (t, t))
    old_blocks = os.lstat(old).st_blocks * 512  # what deleting it really frees (a 1000-byte file costs a block)
    r = gc(root, "--max-cache", "1")
    assert {d["name"] for d in r["deleted"]} == {b, c}  # the stale temp root did not keep b
    assert not (root / "var" / "temproots" / "999999").exists()
    assert not (root / "var" / "locks" / f"{'q' * 32}.lock").exists()
    assert r["freed"]["downloads"] == old_blocks and not old.exists() and new.exists()
    # a is live: what it was built from stays (--max-cache without --prune-live); the rest went,
    # b's and c's bytecode with them (the cache's entries were links to their pycs: bytecode.link_cache)
    assert r["freed"]["cache_entries"] == r["cache_pruned"]["bytes"] and r["freed"]["stale_files"] >= 2
    a_pycs = {os.lstat(p).st_ino for p in (root / "store" / a).rglob("*.pyc")}
    assert {os.lstat(p).st_ino for p in (root / "cache" / "pyc").rglob("*.pyc")} <= a_pycs
    assert r["cache_pruned"]["kept_live"] > 0
    # the environment shared files with the cache through hardlinks: it is intact after the clean
    env = root / "store" / a
    assert tree_hash(env)[0] == read_manifest(env)["content_hash"]
    out = subprocess.run([str(env / "bin" / "tinyengine")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "tinyengine 1.0 tinydep 1.0"
