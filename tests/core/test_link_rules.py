"""One rule decides which inode may be shared between store paths (core/dedupe.py `shareable` and
`store_inode`): a delta pull's reuse, registration-time sharing and `optimise` link a file only if
it is a plain file of the store's owner, with exactly the canonical mode, no xattr (no file
capability), one of the store's own inodes, whose bytes hash to the listing's digest. Anything else
is copied — and `verify` names it where it lies in a store path. Attacked with a real second user,
`setcap` and mode 0400 on real pulls and builds; `optimise` never hides a file modified in place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, build_json, copy_store, run_cli, run_in_env
from tests.support.users import as_user, second_user, shared_dir, shared_template

MODULE = f"lib/python{PYTHON}/site-packages/tinyengine/__init__.py"  # the same bytes in A and B


@pytest.fixture(scope="module")
def intruder():
    yield from second_user("llmgwlr")


@pytest.fixture(scope="module")
def template(wheels):
    """tinyengine 1.0 as of two dates (tinydep 1.0, then 2.0): neighbouring environments A and B."""
    yield from shared_template(wheels, "2024-02-02", "2024-06-02")


@pytest.fixture
def world(template, tmp_path):
    """A cache holding A and B (format 2), and a node (readable by other users) that pulled A."""
    d = shared_dir()
    builder = copy_store(template["root"], d / "builder")
    keys = d / "keys"
    run_cli(builder, "keygen", "b1", "--out", str(keys), check=True)
    cache = f"file://{d / 'cache'}"
    for name in template["names"]:
        run_cli(builder, "push", name, "--to", cache, "--secret-key", str(keys / "b1.secret"), check=True)
    node = d / "node"
    a, b = template["names"]
    w = {"dir": d, "cache": cache, "keys": keys, "node": node, "a": node / "store" / a, "b": node / "store" / b,
         "names": (a, b)}
    pull(w, a)
    yield w
    shutil.rmtree(d, ignore_errors=True)


def pull(w, name) -> dict:
    proc = run_cli(w["node"], "--json", "pull", name, "--from", w["cache"], "--trusted-key",
                   str(w["keys"] / "b1.public"), check=True)
    return json.loads(proc.stdout)


def verify(root: Path, path: Path) -> dict:
    proc = run_cli(root, "--json", "verify", str(path))
    return json.loads(proc.stdout)["paths"][0]


def unfrozen(path: Path):
    """Write access to a store file's directory for a moment (as root can)."""
    class _Ctx:
        def __enter__(self):
            self.mode = path.parent.stat().st_mode & 0o7777
            path.parent.chmod(self.mode | 0o200)

        def __exit__(self, *exc):
            path.parent.chmod(self.mode)
    return _Ctx()


# --- delta pulls ----------------------------------------------------------------------------------

def test_delta_pull_links_a_clean_file_of_the_node(world):
    """Positive: a file of A that passes the rule becomes B's by a link (one inode), through the pool."""
    got = pull(world, world["names"][1])
    a, b = world["a"] / MODULE, world["b"] / MODULE
    assert got["bytes_reused"] > 0 and a.stat().st_ino == b.stat().st_ino
    pooled = [p for p in (world["node"] / "store" / ".links").iterdir() if p.stat().st_ino == a.stat().st_ino]
    assert len(pooled) == 1  # the shared inode is the pool's entry: still one of the store's own
    assert verify(world["node"], world["b"])["ok"]


def test_delta_pull_copies_a_file_owned_by_another_user(world, intruder):
    """Before: B's file was a link to the intruder's inode, who then rewrote B in place."""
    a = world["a"] / MODULE
    genuine = a.read_bytes()
    os.chown(a, intruder.pw_uid, intruder.pw_gid)
    os.chmod(a, 0o444)
    pull(world, world["names"][1])
    b = world["b"] / MODULE
    assert b.stat().st_ino != a.stat().st_ino and b.stat().st_uid == 0 and b.stat().st_mode & 0o777 == 0o444
    rewrite = """
    import os, sys
    for p in sys.argv[1:]:
        try:
            os.chmod(p, 0o644)
            with open(p, "w") as f:
                f.write("print('owned')\\n")
            print(p, "rewritten")
        except OSError as exc:
            print(p, type(exc).__name__)
    """
    out = as_user(intruder, rewrite, str(a), str(b)).stdout
    assert f"{a} rewritten" in out and f"{b} PermissionError" in out  # their own file only
    assert b.read_bytes() == genuine and run_in_env(world["b"], "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert verify(world["node"], world["b"])["ok"]
    report = verify(world["node"], world["a"])  # the foreign file is named where it is
    assert not report["ok"] and report["foreign"][0]["path"] == MODULE and report["foreign"][0]["uid"] == intruder.pw_uid


def test_delta_pull_copies_a_file_with_a_capability(world):
    a = world["a"] / MODULE
    subprocess.run(["setcap", "cap_net_raw+ep", str(a)], check=True)
    pull(world, world["names"][1])
    b = world["b"] / MODULE
    assert b.stat().st_ino != a.stat().st_ino and os.listxattr(b) == []
    assert verify(world["node"], world["b"])["ok"]
    report = verify(world["node"], world["a"])
    assert not report["ok"] and report["foreign"] == [{"path": MODULE, "uid": 0, "xattrs": ["security.capability"]}]


def test_delta_pull_copies_a_file_of_mode_0400_and_verify_names_it(world):
    """Before: B got the 0400 inode, unreadable to the service users that run it, and verify said ok."""
    a = world["a"] / MODULE
    os.chmod(a, 0o400)
    pull(world, world["names"][1])
    b = world["b"] / MODULE
    assert b.stat().st_ino != a.stat().st_ino and b.stat().st_mode & 0o777 == 0o444
    assert verify(world["node"], world["b"])["ok"]
    report = verify(world["node"], world["a"])
    assert not report["ok"] and report["modes"] == [{"path": MODULE, "mode": "0400"}]
    proc = run_cli(world["node"], "verify", str(world["a"]))
    assert proc.returncode == 1 and f"mode: {MODULE} is 0400" in proc.stdout


def test_delta_pull_copies_a_file_that_shares_its_inode_outside_the_store(world):
    """A store file with a second link outside the store (and no pool entry) is not the store's own
    inode: a link to it would share a mutable name's bytes with B."""
    a = world["a"] / MODULE
    outside = world["dir"] / "outside-link"
    os.link(a, outside)
    pull(world, world["names"][1])
    assert (world["b"] / MODULE).stat().st_ino != a.stat().st_ino


def test_delta_pull_never_follows_a_linked_directory_of_the_source_path(world, intruder):
    """A directory of A swapped for a link to another user's tree: the source is not read through it."""
    theirs = world["dir"] / "theirs"
    shutil.copytree(world["a"] / "lib", theirs)
    for p in [theirs, *theirs.rglob("*")]:
        os.chown(p, intruder.pw_uid, intruder.pw_gid, follow_symlinks=False)
    lib = world["a"] / "lib"
    with unfrozen(lib):
        subprocess.run(["chmod", "-R", "u+w", str(lib)], check=True)
        shutil.rmtree(lib)
        lib.symlink_to(theirs)
    pull(world, world["names"][1])
    b = world["b"] / MODULE
    assert b.stat().st_uid == 0 and b.stat().st_ino != (theirs / MODULE.split("/", 1)[1]).stat().st_ino


# --- registration-time sharing and optimise -------------------------------------------------------

def test_a_pool_inode_that_gained_a_capability_is_not_shared(root, recipe, index, uv_bin):
    """A's files are the pool's; one gains a capability; B, registered next, and optimise after it,
    must not link it (before: both did, and B's file carried the capability)."""
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    subprocess.run(["setcap", "cap_net_raw+ep", str(a / MODULE)], check=True)
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])
    assert (b / MODULE).stat().st_ino != (a / MODULE).stat().st_ino and os.listxattr(b / MODULE) == []
    proc = run_cli(root, "--json", "optimise")
    assert proc.returncode == 0, proc.stderr
    assert (b / MODULE).stat().st_ino != (a / MODULE).stat().st_ino and os.listxattr(b / MODULE) == []
    assert json.loads(proc.stdout)["not_shareable"] >= 1
    for entry in (root / "store" / ".links").iterdir():  # the capability left the pool
        assert os.listxattr(entry) == []
    assert run_cli(root, "verify", str(b)).returncode == 0
    assert run_cli(root, "verify", str(a)).returncode == 1  # named where it is


def test_optimise_never_replaces_a_tampered_file_with_the_pools_copy(root, recipe, index, uv_bin):
    """A file of B rewritten (same size, a new inode) while the pool holds the genuine bytes: before,
    optimise linked B's name to the pool's copy and verify then said all was well."""
    a = Path(build_json(root, recipe, index, uv_bin)["path"])
    b = Path(build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"])
    target = b / MODULE
    genuine = target.read_bytes()
    forged = genuine.replace(b"def main", b"def mian")
    assert len(forged) == len(genuine) and forged != genuine
    with unfrozen(target):
        tmp = target.with_name("forged")
        tmp.write_bytes(forged)
        tmp.chmod(0o444)
        os.rename(tmp, target)
    proc = run_cli(root, "--json", "optimise")
    assert proc.returncode == 1 and json.loads(proc.stdout)["damaged"] == [f"{b.name}/{MODULE}"], proc.stderr
    assert "verify --repair" in proc.stderr
    assert target.read_bytes() == forged and target.stat().st_ino != (a / MODULE).stat().st_ino  # evidence kept
    report = verify(root, b)
    assert not report["ok"] and report["modified"] == [MODULE]
    assert run_cli(root, "--json", "optimise", "--dry-run").returncode == 1  # a dry run says so too
