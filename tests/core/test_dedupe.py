"""Files shared between store paths at registration (core/dedupe.py), on real builds: what is shared,
what never is (a tampered or planted pool entry, another mode), and verify/repair of a linked group."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from llmgw_store.core import manifest
from tests.conftest import build_json, real_uv, run_cli, start_index, write_recipe

EARLY, LATE = "2024-02-02", "2024-06-02"  # tinyengine 1.0 with tinydep 1.0, then with tinydep 2.0


@pytest.fixture
def idx(wheels):
    i = start_index(wheels)
    yield i
    i.stop()


def build(root: Path, idx, as_of: str) -> Path:
    recipe = write_recipe(root.parent, 'version = "1.0"', name=f"tiny-{as_of}.toml")
    return Path(build_json(root, recipe, idx, real_uv(), "--as-of", as_of)["path"])


def files(path: Path) -> dict[str, manifest.Entry]:
    return {e.path: e for e in manifest.read_contents(path) if e.kind in "fx" and e.size}


def ino(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_dev, st.st_ino


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def engine_module(path: Path) -> Path:
    """The engine module's bytecode: compiled by each build (a file of its own, where the module's
    source is linked from the wheel home, tests/build/test_wheelhome.py), identical in every path."""
    return next(next(path.glob("lib/python3*/site-packages")).glob("tinyengine/__pycache__/__init__.*.pyc"))


def tamper_in_place(p: Path) -> None:
    """Change one byte of a store file where it lies (as root can): every name of its inode sees it."""
    mode = stat.S_IMODE(os.lstat(p).st_mode)
    os.chmod(p, mode | stat.S_IWUSR)
    with open(p, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))
    os.chmod(p, mode)


def verify(root: Path, *args: str) -> tuple[int, dict]:
    proc = run_cli(root, "--json", "verify", *args, timeout=600,
                   env={"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"})
    return proc.returncode, json.loads(proc.stdout)


def test_second_version_links_identical_files_and_costs_only_what_differs(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    before = du(root / "store")
    b = build(root, idx, LATE)
    fa, fb = files(a), files(b)
    same = [p for p in fa.keys() & fb.keys() if fa[p].digest == fb[p].digest and fa[p].kind == fb[p].kind]
    differ = [p for p in fa.keys() & fb.keys() if fa[p].digest != fb[p].digest]
    assert same and differ
    assert all(ino(a / p) == ino(b / p) for p in same)  # one inode, in both paths and the pool
    assert all(ino(a / p) != ino(b / p) for p in differ)
    assert all(os.lstat(b / p).st_nlink >= 3 for p in same)  # a, b and the pool entry (and identical files within one path)
    # What the second path added on disk is what differs from the first, not its size.
    in_a = {ino(a / p) for p in fa}
    own = {ino(b / p): os.lstat(b / p).st_blocks * 512 for p in fb if ino(b / p) not in in_a}
    own_bytes = sum(own.values())
    added = du(root / "store") - before
    assert added < sum(os.lstat(b / p).st_blocks * 512 for p in fb)
    assert added <= own_bytes + 256 * 1024  # + its directories, symlinks and manifest
    # Still read-only, byte for byte what was recorded, and it runs.
    code, r = verify(root)
    assert code == 0 and r["damaged"] == []
    ran = subprocess.run([str(b / "bin" / "tinyengine")], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "tinyengine 1.0 tinydep 2.0"
    assert json.loads(run_cli(root, "--json", "optimise", check=True).stdout)["files_linked"] == 0


def test_a_tampered_file_of_an_older_path_is_never_linked_into_a_new_one(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    victim = engine_module(a)
    entry = root / "store" / ".links" / f"{files(a)[str(victim.relative_to(a))].digest}-f"
    assert ino(entry) == ino(victim)  # the older path's file is the pool's copy
    tamper_in_place(victim)  # same size, same mode: only the bytes differ from the digest
    b = build(root, idx, LATE)
    mine = engine_module(b)
    assert ino(mine) != ino(victim)
    assert manifest.file_digest(mine) == files(b)[str(mine.relative_to(b))].digest
    assert ino(entry) == ino(mine)  # the damaged entry left the pool; the new good copy took its place
    code, r = verify(root)
    rel = str(victim.relative_to(a))
    assert code == 1 and r["damaged"] == [a.name]
    assert [p["modified"] for p in r["paths"] if p["name"] == a.name] == [[rel]]


@pytest.mark.parametrize("plant", ["symlink", "fifo", "writable", "other-mode"])
def test_planted_or_odd_pool_entries_are_not_linked(tmp_path, idx, plant):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    rel = str(engine_module(a).relative_to(a))
    entry = root / "store" / ".links" / f"{files(a)[rel].digest}-f"
    decoy = tmp_path / "decoy.py"
    decoy.write_bytes(engine_module(a).read_bytes())  # the right bytes, outside the store
    if plant in ("symlink", "fifo"):
        entry.unlink()
        if plant == "symlink":
            os.symlink(decoy, entry)
        else:
            os.mkfifo(entry, 0o444)
    elif plant == "writable":
        os.chmod(entry, 0o644)  # a pool entry with a write bit: someone meant to change it later
    else:
        os.chmod(entry, 0o440)  # the right bytes and owner, another mode than the new file's
    b = build(root, idx, LATE)  # must not block on the FIFO nor follow the link
    mine = engine_module(b)
    assert ino(mine) != ino(a / rel) and not os.path.samefile(mine, decoy)
    assert stat.S_IMODE(os.lstat(mine).st_mode) == 0o444
    if plant != "other-mode":
        assert ino(entry) == ino(mine)  # the odd entry was replaced by the new, checked copy
    code, r = verify(root, str(b))
    assert code == 0 and r["damaged"] == []


def test_verify_names_every_path_of_a_damaged_shared_inode_and_repair_breaks_the_link(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    b = build(root, idx, LATE)
    rel = str(engine_module(a).relative_to(a))
    shared = ino(a / rel)
    assert ino(b / rel) == shared
    good = (a / rel).read_bytes()
    tamper_in_place(a / rel)
    bad = (b / rel).read_bytes()
    assert bad != good

    code, r = verify(root)
    assert code == 1 and sorted(r["damaged"]) == sorted([a.name, b.name])
    assert all(p["modified"] == [rel] for p in r["paths"])

    # Repair one: it gets fresh, checked bytes in a new inode; the other path's inode is not edited.
    proc = run_cli(root, "--json", "verify", str(a), "--repair", "--uv", str(real_uv()), timeout=600,
                   env={"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"})
    assert proc.returncode == 0, proc.stderr
    assert ino(a / rel) != shared and (a / rel).read_bytes() == good
    assert ino(b / rel) == shared and (b / rel).read_bytes() == bad  # untouched: still damaged, still named
    code, r = verify(root, str(b))
    assert code == 1 and r["paths"][0]["modified"] == [rel]

    # Repair the rest: the other path is rebuilt in turn and shares the repaired, checked copy.
    proc = run_cli(root, "--json", "verify", "--repair", "--uv", str(real_uv()), timeout=600,
                   env={"LLMGW_STORE_PYTHON_PREFERENCE": "only-system"})
    assert proc.returncode == 0, proc.stderr
    assert (b / rel).read_bytes() == good and ino(b / rel) == ino(a / rel)
    code, r = verify(root)
    assert code == 0 and r["damaged"] == []


def test_a_planted_pool_directory_is_refused_before_anything_is_linked(tmp_path, idx):
    root = tmp_path / "root"
    a = build(root, idx, EARLY)
    pool = root / "store" / ".links"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for p in pool.iterdir():
        p.unlink()
    pool.rmdir()
    os.symlink(elsewhere, pool)  # another user's directory in the pool's place
    recipe = write_recipe(tmp_path, 'version = "1.0"', name="late.toml")
    proc = run_cli(root, "build", str(recipe), "--index-url", idx.url, "--uv", str(real_uv()), "--as-of", LATE)
    assert proc.returncode == 2 and "store/.links: it is a symlink" in proc.stderr
    assert list(elsewhere.iterdir()) == []  # nothing linked into it, nothing read from it
    assert [p.name for p in (root / "store").iterdir() if not p.name.startswith(".")] == [a.name]
