"""Local safety: another user on the node can neither block nor redirect the store, every name is
checked once, and every wait on a lock ends after --lock-timeout with exit 75 naming the holder.

The hostile second user is real: created here with useradd when the tests run as root (skipped
otherwise) and removed afterwards; its processes drop privileges with `subprocess(user=...)`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import build_json, build_store, copy_store, run_cli
from tests.support.users import as_user, second_user

HOLD_TIMEOUT_S = 30  # every child is bounded: a hang is a failure, not a stuck test run
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")  # one the second user may run


# --- a second, hostile user ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def intruder():
    yield from second_user("llmgwls")


def as_intruder(intruder, script: str, *args: str) -> subprocess.CompletedProcess:
    """Run a Python snippet as the second user (no store code: what any user could type)."""
    return as_user(intruder, script, *args, check=False)


@pytest.fixture(scope="module")
def shared():
    """A directory every user may traverse (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="llmgw-ls-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def template(shared, wheels):
    (shared / "template").mkdir()
    t = build_store(shared / "template", wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, shared, tmp_path):
    dest = shared / tmp_path.name
    copy_store(template["root"], dest)
    name = template["names"][0]
    yield {**template, "root": dest, "path": str(dest / "store" / name), "name": name}
    shutil.rmtree(dest, ignore_errors=True)


def one_error_line(proc, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("llmgw-store:")]
    assert errors == lines[-1:] and errors[0].startswith("llmgw-store: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    return errors[0]


# --- modes: nothing of the store's can be opened by another user --------------------------------

TRY_OPEN = """
import fcntl, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        out[p] = type(exc).__name__
        continue
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        out[p] = "held"
    except OSError as exc:
        out[p] = "opened"
    os.close(fd)
print(json.dumps(out))
"""


def test_other_user_cannot_open_locks_db_or_temp_roots(store, intruder):
    root = store["root"]
    run_cli(root, "activate", "p", store["path"], check=True)  # a profile lock and a temp-root file
    from llmgw_store.core.index import Index

    held = Index(root / "var" / "db.sqlite")  # keeps -wal and -shm in existence
    try:
        held.touch(store["name"])
        files = [p for d in ("var/locks", "var/temproots") for p in (root / d).iterdir()]
        files += [root / "var" / f"db.sqlite{s}" for s in ("", "-wal", "-shm")]
        files.append(root / "python" / ".lock")  # uv's, in a directory that stays 0755
        assert any(p.name.startswith("profile-p") for p in files) and any(p.name.split("-")[0].isdigit() for p in files)
        assert all(p.exists() for p in files)
        uv_cache = root / "cache" / "uv"
        proc = as_intruder(intruder, TRY_OPEN, *map(str, files), str(uv_cache))
        modes = {p: stat.S_IMODE(p.lstat().st_mode) for p in files}
    finally:
        held.close()
    result = json.loads(proc.stdout)
    assert result == {str(p): "PermissionError" for p in [*files, uv_cache]}
    assert {p: mode & 0o077 for p, mode in modes.items()} == {p: 0 for p in files}
    for d in ("var", "var/locks", "var/temproots", "cache/uv"):
        assert stat.S_IMODE((root / d).stat().st_mode) == 0o700, d


READ_ENV = """
import json, os, sys
env = sys.argv[1]
doc = json.load(open(os.path.join(env, ".llmgw", "manifest.json")))
script = open(os.path.join(env, "bin", "tinyengine")).read()
print(json.dumps({"name": doc["name"], "bin": sorted(os.listdir(os.path.join(env, "bin"))), "script": len(script)}))
"""


def test_environments_stay_readable_by_everyone(store, intruder):
    """The interpreter of the test environments lives under /root (private), so the second user
    reads the environment rather than running it."""
    run_cli(store["root"], "list", check=True)  # an open by the owner leaves store/ as it was
    env = Path(store["path"])
    assert stat.S_IMODE(env.stat().st_mode) == 0o555 and stat.S_IMODE((store["root"] / "store").stat().st_mode) == 0o755
    proc = as_intruder(intruder, READ_ENV, str(env))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["name"] == store["name"] and "tinyengine" in seen["bin"] and seen["script"] > 0


def test_old_lax_modes_are_tightened_on_open(store, intruder):
    """A store made by an older llmgw-store (0755 var/, 0644 db) is closed up on its next open."""
    root = store["root"]
    for d in ("var", "var/locks", "var/temproots", "cache/uv"):
        (root / d).chmod(0o755)
    db = root / "var" / "db.sqlite"
    db.chmod(0o644)
    (root / "python" / ".lock").chmod(0o666)  # as uv makes it
    before = json.loads(as_intruder(intruder, TRY_OPEN, str(db)).stdout)
    assert before == {str(db): "held"}  # with the old modes another user could hold it
    run_cli(root, "gc", "--dry-run", check=True)  # the next open that may write closes them up
    after = json.loads(as_intruder(intruder, TRY_OPEN, str(db)).stdout)
    assert after == {str(db): "PermissionError"}
    for d in ("var", "var/locks", "var/temproots", "cache/uv"):
        assert stat.S_IMODE((root / d).stat().st_mode) == 0o700, d
    assert stat.S_IMODE((root / "var" / "db.sqlite").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "python" / ".lock").stat().st_mode) == 0o600


# --- a store root or directory planted by someone else is refused --------------------------------

@pytest.fixture
def outside(shared, tmp_path):
    """Where a planted link points: must stay exactly as it is."""
    d = shared / f"outside-{tmp_path.name}"
    d.mkdir()
    (d / "sentinel").write_text("untouched\n")
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


PLANT = """
import os, sys
root, outside, how = sys.argv[1:]
os.mkdir(root, 0o755)
if how == "link":
    os.symlink(outside, os.path.join(root, "var"))
elif how == "var":
    os.mkdir(os.path.join(root, "var"), 0o777)
"""


@pytest.mark.parametrize("how", ["link", "var", "root-only"])
def test_root_planted_by_another_user_is_refused(intruder, shared, outside, tmp_path, how):
    drop = shared / f"drop-{tmp_path.name}"  # like /tmp: anyone may make a directory here first
    drop.mkdir()
    drop.chmod(0o1777)
    root = drop / "store-root"
    proc = as_intruder(intruder, PLANT, str(root), str(outside), how)
    assert proc.returncode == 0, proc.stderr
    try:
        planted = sorted(os.listdir(root))
        line = one_error_line(run_cli(root, "list"), 2)
        assert str(root) in line
        assert sorted(os.listdir(root)) == planted  # refused before anything was made
        assert sorted(p.name for p in outside.iterdir()) == ["sentinel"]
        assert (outside / "sentinel").read_text() == "untouched\n"
    finally:
        shutil.rmtree(drop, ignore_errors=True)


@pytest.mark.parametrize("victim", ["var", "var/locks", "var/temproots", "profiles", "cache/uv", "store"])
def test_a_symlinked_or_open_directory_inside_the_store_is_refused(store, outside, victim):
    root = store["root"]
    target = root / victim
    if victim == "store":
        target.chmod(0o777)  # another user could then plant anything in it
    else:
        shutil.rmtree(target)
        os.symlink(outside, target)
    line = one_error_line(run_cli(root, "gc", "--dry-run"), 2)
    assert str(target) in line
    assert sorted(p.name for p in outside.iterdir()) == ["sentinel"]


def test_the_owner_still_builds_activates_and_collects(store, recipe, index, uv_bin):
    root = store["root"]
    out = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")
    assert out["how"] == "built"
    run_cli(root, "activate", "q", out["path"], check=True)
    gc = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert [d["name"] for d in gc["deleted"]] == [store["name"]]
    assert Path(out["path"]).is_dir() and not Path(store["path"]).exists()


# --- temp-root files are never followed --------------------------------------------------------

@pytest.mark.parametrize("command", ["activate", "build"])
def test_planted_temp_root_link_to_the_gc_lock_does_not_deadlock(store, command, recipe, index, uv_bin):
    """temproots/<pid> -> ../locks/gc.lock: followed, the process would take the gc lock exclusively
    while holding it shared, and wait for itself for ever."""
    root = store["root"]
    if command == "build":
        args = ["build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), "--as-of", "2024-06-02"]
    else:
        args = ["activate", "p", store["path"]]
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline(); from llmgw_store.cli.main import cli; "
                               "cli(sys.argv[1:], prog_name='llmgw-store')",
         "--root", str(root), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    link = root / "var" / "temproots" / str(child.pid)
    os.symlink("../locks/gc.lock", link)
    try:
        out, err = child.communicate("go\n", timeout=HOLD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"{command} deadlocked on a planted temp-root link")
    assert child.returncode == 0, err
    if command == "activate":
        assert os.path.realpath(root / "profiles" / "p") == store["path"]
    else:
        assert Path(out.strip()).is_dir() and Path(out.strip()).parent == root / "store"
    # the process made its own file, <pid>-<token>, and never opened (nor removed) the planted name
    assert link.is_symlink() and [f.name for f in link.parent.glob(f"{child.pid}-*") if f.is_file()]
    assert (root / "var" / "locks" / "gc.lock").stat().st_size == 0  # nothing written through the link


def test_gc_ignores_planted_temp_root_entries(store):
    root = store["root"]
    temproots = root / "var" / "temproots"
    os.symlink("../locks/gc.lock", temproots / "999999991")
    os.mkfifo(temproots / "999999992")
    gc = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert [d["name"] for d in gc["deleted"]] == [store["name"]]
    assert not os.path.lexists(temproots / "999999991") and not os.path.lexists(temproots / "999999992")


# --- names ------------------------------------------------------------------------------------

def test_unpin_cannot_reach_outside_gcroots(store):
    root = store["root"]
    run_cli(root, "activate", "p", store["path"], check=True)
    line = one_error_line(run_cli(root, "unpin", "../profiles/p"), 2)
    assert "pin name" in line
    assert os.path.realpath(root / "profiles" / "p") == store["path"]


BAD_NAMES = ["p\n", "x" * 10_000, "../p", ".hidden", "a/b", "", "P"]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["newline", "10000", "dotdot", "dot", "slash", "empty", "upper"])
def test_bad_names_are_refused_with_exit_2_and_nothing_changes(store, bad):
    root = store["root"]
    run_cli(root, "activate", "p", store["path"], check=True)
    run_cli(root, "pin", "keep", store["path"], check=True)
    before = sorted(os.listdir(root / "profiles")) + sorted(os.listdir(root / "gcroots"))
    for args in (["activate", bad, store["path"]], ["rollback", bad], ["generations", bad],
                 ["generations", bad, "--delete", "1"], ["pin", bad, store["path"]], ["unpin", bad],
                 ["env", bad], ["run", bad, "--", "true"]):
        one_error_line(run_cli(root, *args), 2)
    assert sorted(os.listdir(root / "profiles")) + sorted(os.listdir(root / "gcroots")) == before
    assert os.path.realpath(root / "profiles" / "p") == store["path"]


def test_trailing_newline_profile_cannot_make_gc_take_a_live_path(store):
    root = store["root"]
    one_error_line(run_cli(root, "activate", "p\n", store["path"]), 2)
    run_cli(root, "activate", "p", store["path"], check=True)
    gc = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert gc["deleted"] == [] and Path(store["path"]).is_dir()


@pytest.mark.parametrize("number", ["0", "-1", "99999999999999999999"])
def test_bad_generation_numbers_are_refused(store, number):
    root = store["root"]
    run_cli(root, "activate", "p", store["path"], check=True)
    one_error_line(run_cli(root, "rollback", "p", "--to", number), 2)
    one_error_line(run_cli(root, "generations", "p", "--delete", number), 2)


def test_names_module_is_the_one_check():
    from llmgw_store.base.errors import UsageError
    from llmgw_store.core import names

    assert names.check_profile("vllm-cu128") == "vllm-cu128"
    assert names.check_pin("known.good_1") == "known.good_1"
    assert names.check_generation(7) == 7
    assert names.check_key("0" * 32) == "0" * 32
    assert names.check_store_name("0" * 32 + "-tinyengine-1.0-cpu")
    assert names.check_signing_key_name("Builder-1") == "Builder-1"
    for call, bad in ((names.check_profile, "vllm-3-link"), (names.check_key, "0" * 32 + "\n"),
                      (names.check_store_name, "0" * 32 + "-a/../b"), (names.check_signing_key_name, "a:b"),
                      (names.check_engine, "x" * 101), (names.check_generation, 0)):
        with pytest.raises(UsageError) as err:
            call(bad)
        assert "\n" not in str(err.value) and len(str(err.value)) < 300


# --- every wait honours --lock-timeout and names the holder -------------------------------------

HOLDER = """
import sys
from llmgw_store.core import locks
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.temproots import gc_lock
from llmgw_store.roots.profiles import profile_lock

kind, root, arg = sys.argv[1:4]
layout = Layout.at(root)
if kind == "key":
    cm = locks.hold(layout.locks, arg, "a test holding the key", 600)
elif kind == "gc":
    cm = gc_lock(layout, shared=False, timeout=600)
else:
    cm = profile_lock(Store.open(root), arg)
with cm:
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder():
    children = []

    def hold(kind: str, root: Path, arg: str = "") -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(root), arg], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        children.append(child)
        assert child.stdout.readline().strip() == "held"
        return child

    yield hold
    for child in children:
        child.stdin.close()
        child.wait(timeout=HOLD_TIMEOUT_S)


def timed_out(proc, holder_pid: int) -> None:
    line = one_error_line(proc, 75)
    assert f"pid {holder_pid}" in line, line
    assert "--lock-timeout" in line


def test_build_gives_up_on_the_gc_lock(store, holder, recipe, index, uv_bin):
    h = holder("gc", store["root"])
    proc = run_cli(store["root"], "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   "--as-of", "2024-06-02", "--lock-timeout", "2", timeout=HOLD_TIMEOUT_S)
    timed_out(proc, h.pid)


def test_build_gives_up_on_the_key_lock(store, holder, recipe, index, uv_bin):
    root = store["root"]
    out = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")
    run_cli(root, "gc", check=True)  # unrooted: gone, so the next build needs the key's lock
    h = holder("key", root, out["key"])
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), "--as-of", "2024-06-02",
                   "--lock-timeout", "2", timeout=HOLD_TIMEOUT_S)
    timed_out(proc, h.pid)


@pytest.mark.parametrize("command", [["activate", "p", "PATH"], ["rollback", "p"], ["generations", "p", "--delete", "1"]])
def test_profile_changes_give_up_on_the_profile_lock(store, holder, command):
    root = store["root"]
    run_cli(root, "activate", "p", store["path"], check=True)
    run_cli(root, "pin", "keep", store["path"], check=True)
    h = holder("profile", root, "p")
    args = [store["path"] if a == "PATH" else a for a in command]
    timed_out(run_cli(root, *args, "--lock-timeout", "2", timeout=HOLD_TIMEOUT_S), h.pid)


@pytest.mark.parametrize("command", [["activate", "p", "PATH"], ["pin", "x", "PATH"], ["gc"], ["gc", "--print-roots"],
                                     ["optimise"], ["doctor", "--rebuild-index"]])
def test_commands_give_up_on_the_gc_lock(store, holder, command):
    root = store["root"]
    h = holder("gc", root)
    args = [store["path"] if a == "PATH" else a for a in command]
    timed_out(run_cli(root, *args, "--lock-timeout", "2", timeout=HOLD_TIMEOUT_S), h.pid)


def test_a_busy_index_is_exit_75_after_the_lock_timeout(store):
    """SQLite's own wait is bounded by --lock-timeout too (its busy timeout is never longer)."""
    root = store["root"]
    import sqlite3

    con = sqlite3.connect(str(root / "var" / "db.sqlite"), isolation_level=None)
    con.execute("BEGIN IMMEDIATE")  # the write lock, as a long transaction of another process would
    try:
        line = one_error_line(run_cli(root, "pin", "keep", store["path"], "--lock-timeout", "2",
                                      timeout=HOLD_TIMEOUT_S), 75)
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert "index" in line and "--lock-timeout" in line
    run_cli(root, "pin", "keep", store["path"], "--lock-timeout", "2", check=True)


def test_verify_repair_gives_up_on_the_key_lock(store, holder, uv_bin):
    root = store["root"]
    victim = Path(store["path"]) / "bin" / "tinyengine"
    os.chmod(victim, 0o755)  # damaged: a writable file
    h = holder("key", root, store["name"][:32])
    timed_out(run_cli(root, "verify", "--repair", "--uv", str(uv_bin), "--lock-timeout", "2", timeout=HOLD_TIMEOUT_S),
              h.pid)


def test_lock_timeout_defaults_live_in_the_library():
    from click.testing import CliRunner

    from llmgw_store.cli.main import cli
    from llmgw_store.core import locks

    for command, default in (("build", locks.BUILD_LOCK_TIMEOUT_S), ("gc", locks.LOCK_TIMEOUT_S),
                             ("activate", locks.BUILD_LOCK_TIMEOUT_S), ("rollback", locks.LOCK_TIMEOUT_S),
                             ("pin", locks.LOCK_TIMEOUT_S), ("unpin", locks.LOCK_TIMEOUT_S),
                             ("verify", locks.BUILD_LOCK_TIMEOUT_S), ("doctor", locks.LOCK_TIMEOUT_S),
                             ("optimise", locks.LOCK_TIMEOUT_S), ("pull", locks.BUILD_LOCK_TIMEOUT_S),
                             ("generations", locks.LOCK_TIMEOUT_S)):
        text = CliRunner().invoke(cli, [command, "--help"]).output
        assert "--lock-timeout" in text and f"{default:g}" in text.replace(".0]", "]"), command


def test_gc_keeps_the_lock_file_of_a_profile_whose_lock_name_looks_like_a_key(store):
    """`profile-<24 characters>` is 32 characters, as long as a key: gc must not take it for a
    stale key's lock (deleting a lock file someone holds lets two processes lock two inodes)."""
    root = store["root"]
    profile = "p" * 24
    run_cli(root, "activate", profile, store["path"], check=True)
    lock = root / "var" / "locks" / f"profile-{profile}.lock"
    assert lock.exists()
    run_cli(root, "gc", check=True)
    assert lock.exists()
