"""gc's /proc scan holds a store path that a running process names through any prefix: the root
bind-mounted elsewhere in a container's own mount namespace, or reached through a symlinked parent.
(The positive case with the literal store path: tests/roots/test_gc.py::test_running_process_keeps_its_environment.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, run_cli

HOLD = "import time; print('up', flush=True); time.sleep(120)"


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    """Two unrooted environments A and B."""
    t = build_store(tmp_path_factory.mktemp("gcpre"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    return copy_store(template["root"], tmp_path / "root"), template["names"]


def gc(root: Path) -> dict:
    return json.loads(run_cli(root, "--json", "gc", check=True).stdout)


def on_disk(root: Path) -> set[str]:
    return {p.name for p in (root / "store").iterdir() if "-uv-" not in p.name and not p.name.startswith(".")}


def _hold(argv: list[str], env_path: str):
    proc = subprocess.Popen(argv, cwd="/", stdout=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": env_path})
    assert proc.stdout.readline() == "up\n", "the engine did not start"
    return proc


def _kept_while_running(root: Path, a: str, proc: subprocess.Popen) -> None:
    """gc keeps A (and only A) while `proc` runs from it, naming its pid; collects it after."""
    try:
        r = gc(root)
        assert on_disk(root) == {a}, r["deleted"]
        assert any(k["kind"] == "process" and k["pid"] == proc.pid and k["paths"] == [a] for k in r["kept"])
    finally:
        proc.kill()
        proc.wait()
    assert [d["name"] for d in gc(root)["deleted"]] == [a]


def test_engine_in_a_mount_namespace_with_the_root_bind_mounted_elsewhere_keeps_its_environment(store, tmp_path):
    """A container bind-mounts the shared root at ALT in its own mount namespace and runs an engine
    from ALT/store/A: the host's gc (same pid namespace) sees only ALT/... in /proc."""
    root, (a, b) = store
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")
    if subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True).returncode:
        pytest.skip("unshare --mount is not permitted here")
    alt = tmp_path / "alt"
    alt.mkdir()
    env_path = f"{alt}/store/{a}"
    script = f"mount --bind '{root}' '{alt}' && exec '{env_path}/bin/python' -c \"{HOLD}\""
    proc = _hold(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env_path)
    assert not (alt / "store").exists()  # the mount is the container's alone
    _kept_while_running(root, a, proc)


def test_engine_reaching_the_root_through_a_symlinked_parent_keeps_its_environment(store, tmp_path):
    """A unit runs with --root LNK/root where LNK is a link to the root's parent."""
    root, (a, b) = store
    lnk = tmp_path / "lnk"
    lnk.symlink_to(tmp_path)
    env_path = f"{lnk}/root/store/{a}"
    _kept_while_running(root, a, _hold([f"{env_path}/bin/python", "-c", HOLD], env_path))


def test_a_name_this_store_does_not_hold_is_no_root(store):
    """`/nix/store/<hash>-...` (same alphabet) or another store's path: not listed as this store's root."""
    root, (a, b) = store
    other = "/nix/store/" + "0" * 32 + "-python3-3.11.9"
    proc = _hold(["/bin/sh", "-c", f"echo up; exec sleep 120 # {other}"], other)
    try:
        kept = json.loads(run_cli(root, "--json", "gc", "--print-roots", check=True).stdout)["roots"]
        assert all(k.get("pid") != proc.pid for k in kept), kept
    finally:
        proc.kill()
        proc.wait()
