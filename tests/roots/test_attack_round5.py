"""The fifth round of attacks (an outsider's, from the docs alone): the no-op follow's fast path and
the locations of README's "On disk" that another local user could have made before the store did.
Each attack that worked is a test here, with the honest case beside it; docs/operations.md's
threat table names them.

Real parts: the builder store of tests/support/delta.py, a node store following `prod` from a
file:// cache (tests/roots/test_release_follow_fast.Fleet), the installed CLI in subprocesses, another
user's files made with chown (as root)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.roots.test_release_follow_fast import Fleet
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files are made with chown, as root")


def _fleet(w, tmp_path: Path) -> Fleet:
    return Fleet(w, tmp_path, f"file://{tmp_path / 'cache'}")


# --- holds/: another user's hold freezes a profile ---------------------------------------------

@needs_root
@pytest.mark.parametrize("planted", ["owned", "writable"])
def test_a_holds_directory_another_user_could_write_is_refused(world, tmp_path, planted):
    """holds/ of another user (or one every user may write), holding their `svc` link to the old
    build: the node must not stay on it, "held", while the release moves on — the directory is
    refused as profiles/ is (exit 2, naming it), and nothing is switched or held."""
    w, (a, b) = world, world["names"]
    f = _fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0 and f.current() == a
    holds = f.node / "holds"
    holds.mkdir()
    os.symlink(f"../store/{a}", holds / "svc")
    if planted == "owned":
        os.lchown(holds / "svc", NOBODY, NOBODY)
        os.chown(holds, NOBODY, NOBODY)
    else:
        holds.chmod(0o777)
    f.set(b)
    proc, _ = f.follow()
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "held at" not in proc.stdout and f"{holds}" in proc.stderr and "another user may have planted it" in proc.stderr
    hold = f.node_cli("hold", "svc", check=False)
    assert hold.returncode == 2 and f"{holds}" in hold.stderr
    # Moved away, the follow takes the release again.
    shutil.rmtree(holds)
    proc, _ = f.follow()
    assert proc.returncode == 0 and f.current() == b, proc.stderr


def test_a_hold_the_store_made_is_kept_and_its_directory_is_the_stores(world, tmp_path):
    """The honest case: `hold` makes holds/ (0755, the store owner's), the follow stays held while the
    release moves, `unhold` lets it go."""
    w, (a, b) = world, world["names"]
    f = _fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    f.node_cli("hold", "svc")
    st = os.stat(f.node / "holds", follow_symlinks=False)
    assert (st.st_mode & 0o7777, st.st_uid) == (0o755, os.geteuid())
    f.set(b)
    proc, fast = f.follow()
    assert proc.returncode == 0 and not fast and "held at" in proc.stdout and f.current() == a, proc.stderr
    f.node_cli("unhold", "svc")
    proc, _ = f.follow()
    assert proc.returncode == 0 and f.current() == b, proc.stderr


@needs_root
def test_the_fast_path_does_not_answer_past_a_holds_directory_it_would_refuse(world, tmp_path):
    """A release that has not moved, and holds/ others may write (the hold the operator made taken
    out of it by them): the fast path must not answer "already at" where the full command refuses
    the directory — the answer is the full command's, exit 2."""
    w, (a, _) = world, world["names"]
    f = _fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    proc, fast = f.follow()
    assert proc.returncode == 0 and fast, proc.stderr  # answered fast, before holds/ existed
    (f.node / "holds").mkdir()
    for planted in ("writable", "owned"):
        if planted == "writable":
            (f.node / "holds").chmod(0o777)
        else:
            (f.node / "holds").chmod(0o755)
            os.chown(f.node / "holds", NOBODY, NOBODY)
        proc, fast = f.follow()
        assert proc.returncode == 2 and not fast, (planted, proc.stdout, proc.stderr)
        assert "another user may have planted it" in proc.stderr
    shutil.rmtree(f.node / "holds")
    assert f.follow()[1]


# --- the pointer the first cache serves: what was tried and is refused, fast path or not ---------

def _hostile_pointers(good: bytes) -> dict[str, bytes | None]:
    """name -> the bytes put at releases/prod.json (None: a FIFO there)."""
    return {
        "non-utf8": good[:-2] + b"\xff\xfe" + good[-2:],
        "nested": b"[" * 30000 + b"]" * 30000,
        "huge int": b"1" * 60000,
        "over the cap": good + b" " * (64 << 10),
        "trailing bytes": good + b" {}",
        "fifo": None,
    }


def test_hostile_pointers_are_refused_and_the_fast_path_answers_none_of_them(world, tmp_path):
    """Each shape a cache writer can serve in place of the pointer the node follows: refused with
    one line (a failure exit), never answered fast, the node where it was and its mark unchanged; the
    genuine pointer put back is answered fast again."""
    w, (a, _) = world, world["names"]
    f = _fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    obj = tmp_path / "cache" / "releases" / "prod.json"
    good, mark = obj.read_bytes(), (f.node / "var" / "seen.json").read_bytes()
    for name, data in _hostile_pointers(good).items():
        obj.unlink()
        if data is None:
            os.mkfifo(obj)
        else:
            obj.write_bytes(data)
        proc, fast = f.follow()
        assert proc.returncode != 0 and not fast and proc.stdout == "", (name, proc.stderr)
        assert proc.stderr.startswith("llmgw-store: error: ") and proc.stderr.count("\n") == 1, (name, proc.stderr)
        assert f.current() == a and (f.node / "var" / "seen.json").read_bytes() == mark, name
    obj.unlink()
    obj.write_bytes(good)
    proc, fast = f.follow()
    assert proc.returncode == 0 and fast, proc.stderr
