"""verify against a store tampered to trap it: a file swapped for a symlink or a FIFO (before the
walk, and between the walk and the hashing), the listing or the path itself swapped for a link.
Nothing is followed, nothing blocks: the entry is named and the path reported damaged."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_store, cli_cmd, copy_store, run_cli
from tests.support.barrier import Barrier

TIMEOUT = 120  # a verify that blocks on a FIFO would never end: the test fails instead of hanging


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("verify-attacks"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def env(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    return root, root / "store" / template["names"][0]


def _target(path: Path) -> Path:
    return next(path.glob("lib/python3*/site-packages")) / "tinydep" / "__init__.py"


def _writable(d: Path) -> None:
    os.chmod(d, stat.S_IMODE(os.lstat(d).st_mode) | stat.S_IWUSR)


def verify(root: Path, *args: str) -> tuple[int, dict]:
    proc = run_cli(root, "--json", "verify", *args, timeout=TIMEOUT)
    return proc.returncode, json.loads(proc.stdout)


def named(report: dict, rel: str) -> bool:
    p = report["paths"][0]
    return rel in p["modified"] or any(rel in msg for msg in p["problems"])


def test_file_swapped_for_a_symlink_to_identical_bytes_is_not_followed(env, tmp_path):
    root, path = env
    target = _target(path)
    rel = str(target.relative_to(path))
    copy = tmp_path / "same-bytes.py"
    shutil.copyfile(target, copy)  # what the link leads to holds exactly the recorded bytes
    _writable(target.parent)
    target.unlink()
    os.symlink(copy, target)
    code, r = verify(root)
    assert code == 1 and r["paths"][0]["modified"] == [rel] and r["damaged"] == [path.name]


def test_file_swapped_for_a_fifo_does_not_block_verify(env):
    root, path = env
    target = _target(path)
    rel = str(target.relative_to(path))
    _writable(target.parent)
    target.unlink()
    os.mkfifo(target, 0o444)
    code, r = verify(root)
    assert code == 1 and r["paths"][0]["modified"] == [rel]


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_file_swapped_between_the_walk_and_the_hashing(env, tmp_path, kind):
    """The walk sees a regular file; the hashing threads (held at their start by a debug pause)
    then meet a FIFO or a link to the recorded bytes: it is opened O_NOFOLLOW|O_NONBLOCK and its
    descriptor checked, so verify neither blocks nor follows, and names the file."""
    root, path = env
    target = _target(path)
    rel = str(target.relative_to(path))
    copy = tmp_path / "same-bytes.py"
    shutil.copyfile(target, copy)
    _writable(target.parent)
    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cli_cmd(root, "--json", "verify"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **gate.env("HASH_PAUSE", "HASH_WALKED")})
    try:
        gate.reached("HASH_WALKED", proc)  # the walk saw a regular file; no thread has hashed it
        target.unlink()
        if kind == "fifo":
            os.mkfifo(target, 0o444)
        else:
            os.symlink(copy, target)
        gate.go("HASH_PAUSE")
        gate.go("HASH_WALKED")
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = json.loads(out)
    assert proc.returncode == 1, err
    assert named(r, rel) and r["damaged"] == [path.name]


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_listing_swapped_for_a_fifo_or_a_link_does_not_trap_verify(env, kind):
    root, path = env
    meta = path / ".llmgw"
    _writable(meta)
    (meta / "contents").unlink()
    if kind == "fifo":
        os.mkfifo(meta / "contents", 0o444)
    else:
        os.symlink("/dev/zero", meta / "contents")  # endless if read through the link
    code, r = verify(root)
    p = r["paths"][0]
    assert code == 1 and any("contents listing cannot be read" in m for m in p["problems"])


def test_store_path_swapped_for_a_link_to_a_good_copy_is_not_followed(env, tmp_path):
    root, path = env
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(path), str(copy)], check=True)
    os.chmod(path, 0o755)
    subprocess.run(["chmod", "-R", "u+w", str(path)], check=True)
    shutil.rmtree(path)
    os.symlink(copy, path)
    code, r = verify(root)
    assert code == 1 and any("not a directory" in m for m in r["paths"][0]["problems"])


def test_intact_copy_still_verifies(env):
    root, _ = env
    code, r = verify(root)
    assert code == 0 and r["damaged"] == []
