"""A file gc cannot unlink (chattr +i, as a co-tenant container's root could set) leaves its tree
in the trash with one line naming it and the likely cause; gc collects the rest and exits 1 (a
failure the cron log shows), every time until the attribute is gone — never exit 2 with a claim
that root does not own the store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, run_cli


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("gcimm"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    yield root, template["names"]
    # or pytest cannot remove it (wherever gc moved it)
    subprocess.run(["find", str(root), "(", "-name", "pyvenv.cfg", "-o", "-name", "METADATA", ")", "-exec", "chattr", "-i", "{}", "+"], capture_output=True)


def immutable(path: Path) -> None:
    if shutil.which("chattr") is None or os.geteuid() != 0:
        pytest.skip("needs root and chattr(1)")
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this filesystem does not take chattr +i: {done.stderr.strip()}")


def on_disk(root: Path) -> set[str]:
    return {p.name for p in (root / "store").iterdir() if "-uv-" not in p.name and not p.name.startswith(".")}


def test_a_file_gc_cannot_unlink_fails_only_its_own_path(store):
    root, (a, b) = store
    run_cli(root, "pin", "later", str(root / "store" / b), check=True)
    immutable(root / "store" / a / "pyvenv.cfg")
    proc = run_cli(root, "--json", "gc")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(proc.stdout)
    assert [d["name"] for d in r["deleted"]] == [a] and on_disk(root) == {b}
    [left] = r["undeleted"]
    assert Path(left).parent == root / "var" / "trash" and Path(left).name.startswith(a)
    lines = [ln for ln in proc.stderr.splitlines() if left in ln]
    assert len(lines) == 1 and "lsattr" in lines[0] and "immutable" in lines[0], proc.stderr
    assert "owns the store" not in proc.stderr and "Traceback" not in proc.stderr
    # Every later gc still collects what is dead (B, unpinned now), says the same line, exits 1.
    run_cli(root, "unpin", "later", check=True)
    proc = run_cli(root, "gc")
    assert proc.returncode == 1 and on_disk(root) == set(), proc.stderr
    assert f"{left}" in proc.stderr and "owns the store" not in proc.stderr
    # Once the attribute is gone, gc deletes it and succeeds again.
    subprocess.run(["chattr", "-i", str(Path(left) / "pyvenv.cfg")], check=True)
    proc = run_cli(root, "--json", "gc")
    assert proc.returncode == 0, proc.stderr
    assert list((root / "var" / "trash").iterdir()) == [] and json.loads(proc.stdout)["undeleted"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="what the kernel refuses root")
def test_eperm_for_root_is_not_called_an_ownership_problem():
    import errno

    from llmgw_store.base.errors import AccessDeniedError, NotPermittedError, from_os_error

    err = from_os_error(PermissionError(errno.EPERM, "Operation not permitted", "/r/var/trash/x/f"))
    assert isinstance(err, NotPermittedError) and err.exit_code == 1
    assert "/r/var/trash/x/f" in str(err) and "lsattr" in str(err) and "owns the store" not in str(err)
    # EACCES (another user's root, a squashed NFS) is still "not yours": exit 2.
    assert isinstance(from_os_error(PermissionError(errno.EACCES, "Permission denied", "/r/var")), AccessDeniedError)


def test_an_immutable_file_shared_with_the_wheel_home_fails_only_its_own_path(store):
    """A wheel's file (METADATA: the wheel home's inode, hard-linked into the path) made immutable."""
    root, (a, b) = store
    [meta] = [p for p in (root / "store" / a).rglob("METADATA") if "tinyengine" in str(p)][:1]
    immutable(meta)
    proc = run_cli(root, "--json", "gc")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "owns the store" not in proc.stderr, proc.stderr
    r = json.loads(proc.stdout)
    assert {d["name"] for d in r["deleted"]} == {a, b} and on_disk(root) == set() and len(r["undeleted"]) == 1
    assert proc.stderr.count(r["undeleted"][0]) == 1, proc.stderr


def test_an_immutable_dead_directory_stays_in_the_store_and_the_rest_goes(store):
    root, (a, b) = store
    immutable(root / "store" / a)  # rename(2) into the trash is refused
    try:
        proc = run_cli(root, "--json", "gc")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        r = json.loads(proc.stdout)
        assert [d["name"] for d in r["deleted"]] == [b] and on_disk(root) == {a}
        assert r["undeleted"] == [str(root / "store" / a)] and "lsattr" in proc.stderr
    finally:
        subprocess.run(["chattr", "-i", str(root / "store" / a)], check=True)
    proc = run_cli(root, "--json", "gc")  # registered again from its manifest, and collected
    assert proc.returncode == 0 and on_disk(root) == set(), proc.stderr
