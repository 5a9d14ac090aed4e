"""The store's file primitives (system/files.py) on real files: the bounded reader never follows a
link (last component, or any component below a dir_fd), never waits on a FIFO, never reads more
than its limit; the atomic write never opens an existing file; the secret file is whole or absent
and refused when shared, open or another user's. Each refusal beside the case that works."""

from __future__ import annotations

import os
import threading

import pytest

from llmgw_store.base.errors import UnsafePathError
from llmgw_store.system import files


def test_read_bounded_reads_a_regular_file(tmp_path):
    (tmp_path / "f").write_bytes(b"hello")
    assert files.read_bounded(tmp_path / "f", 5) == b"hello"


@pytest.mark.parametrize("make, words", [
    (lambda p: p.symlink_to("/etc/hostname"), "symbolic link"),
    (lambda p: p.symlink_to("/dev/zero"), "symbolic link"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: p.write_bytes(b"x" * 6), "larger than 5 bytes"),
])
def test_read_bounded_refuses(tmp_path, make, words):
    p = tmp_path / "f"
    make(p)
    with pytest.raises(files.FileRefused, match=words) as exc:
        files.read_bounded(p, 5)
    assert isinstance(exc.value, OSError) and isinstance(exc.value, ValueError)


def test_read_bounded_stops_at_the_limit_when_the_size_lies(tmp_path):
    """/proc files say size 0 and hold more: the read itself is bounded."""
    with pytest.raises(files.FileRefused, match="larger than 10 bytes"):
        files.read_bounded("/proc/self/status", 10)


def test_no_component_below_a_dir_fd_is_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"x")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "sub").symlink_to(tmp_path / "real")
    fd = files.open_dir(tmp_path / "base")
    try:
        with pytest.raises(files.FileRefused, match="not a directory"):
            files.read_bounded("sub/f", 10, dir_fd=fd)
        with pytest.raises(files.FileRefused, match="climbs out"):
            files.read_bounded("../real/f", 10, dir_fd=fd)
        with pytest.raises(FileNotFoundError):
            files.read_bounded("missing", 10, dir_fd=fd)
    finally:
        os.close(fd)
    with pytest.raises(files.FileRefused):
        files.open_dir(tmp_path / "base" / "sub")


def test_owner_mode_and_links_are_checked_and_old_modes_closed_up(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x")
    p.chmod(0o666)
    with pytest.raises(files.FileRefused, match="mode"):
        files.read_bounded(p, 10, deny_mode=0o022)
    with pytest.raises(files.FileRefused, match="owned by uid"):
        files.read_bounded(p, 10, owner=os.geteuid() + 1)
    assert p.stat().st_mode & 0o777 == 0o666  # refused, and left as it was
    p.chmod(0o644)  # readable by all, as an older version left it: closed up once it passes
    assert files.read_bounded(p, 10, deny_mode=0o022, tighten=0o077) == b"x"
    assert p.stat().st_mode & 0o777 == 0o600
    os.link(p, tmp_path / "g")
    with pytest.raises(files.FileRefused, match="2 hard links"):
        files.read_bounded(p, 10, one_link=True)


def test_write_atomic_replaces_a_link_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out").symlink_to(victim)
    files.write_atomic(tmp_path / "out", b"new", mode=0o640)
    assert victim.read_text() == "keep"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"new"
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o640  # exactly, whatever the umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]  # no temporary left


def test_write_atomic_exclusive_takes_no_existing_name(tmp_path):
    (tmp_path / "k").symlink_to(tmp_path / "nowhere")  # even a dangling link is a taken name
    with pytest.raises(FileExistsError):
        files.write_atomic(tmp_path / "k", b"x", exclusive=True)
    assert (tmp_path / "k").is_symlink() and not (tmp_path / "nowhere").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["k"]


def test_write_outside_checks_the_directory(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        files.write_outside(open_dir / "x", b"x")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert files.write_outside(sticky / "x", b"x").read_bytes() == b"x"
    (tmp_path / "ln").symlink_to(sticky)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        files.write_outside(tmp_path / "ln" / "y", b"y")
    with pytest.raises(UnsafePathError, match="does not exist"):
        files.write_outside(tmp_path / "nodir" / "y", b"y")


def test_private_secret_is_made_once_whole_and_refused_when_not_private(tmp_path):
    p = tmp_path / "key"
    first = files.private_secret(p, 32)
    assert len(first) == 32 and files.private_secret(p, 32) == first
    assert p.stat().st_mode & 0o777 == 0o600
    os.link(p, tmp_path / "copy")
    with pytest.raises(files.FileRefused, match="hard links"):
        files.private_secret(p, 32)
    os.unlink(tmp_path / "copy")
    p.chmod(0o640)
    with pytest.raises(files.FileRefused, match="mode"):
        files.private_secret(p, 32)
    q = tmp_path / "linked"
    q.symlink_to(p)
    with pytest.raises(files.FileRefused, match="symbolic link"):
        files.private_secret(q, 32)


def test_private_secret_racing_makers_agree(tmp_path):
    """Many threads make the same secret at once: every one reads the same whole 32 bytes (the
    file is linked into place complete, never seen empty or half-written)."""
    p = tmp_path / "key"
    got, errors = [], []

    def make():
        try:
            got.append(files.private_secret(p, 32))
        except Exception as exc:  # collected for the assertion
            errors.append(exc)
    threads = [threading.Thread(target=make) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(got)) == 1 and len(got[0]) == 32
    assert [x.name for x in tmp_path.iterdir()] == ["key"]
