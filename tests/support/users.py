"""A second, hostile local user for tests, and a directory every user may traverse.

    @pytest.fixture(scope="module")
    def intruder():
        yield from second_user("llmgwsec")

The user is real: made with useradd (only as root; otherwise the test is skipped) and removed
afterwards. `as_user` runs a Python snippet as that user with the system's python3 and no store
code: what any user of the node could type.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

TIMEOUT_S = 60
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def second_user(prefix: str):
    """Generator for a module-scoped fixture: the pwd entry of a fresh local user."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or SYSTEM_PYTHON is None:
        pytest.skip("a second user can only be made as root with useradd (and needs /usr/bin/python3)")
    import pwd

    name = f"{prefix}{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def as_user(user, script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([SYSTEM_PYTHON, "-I", "-c", textwrap.dedent(script), *args],
                          user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
                          capture_output=True, text=True, timeout=TIMEOUT_S, env={"PATH": "/usr/bin:/bin"})
    if check and proc.returncode != 0:
        raise AssertionError(f"as {user.pw_name}: exit {proc.returncode}: {proc.stderr}")
    return proc


def shared_template(wheels, *as_ofs: str):
    """Generator for a module-scoped fixture: tests/conftest.build_store's store of tinyengine 1.0
    built as of each date, in a directory other users may traverse (so a second user can reach
    its files), removed afterwards."""
    from tests.conftest import build_store

    d = shared_dir()
    t = build_store(d, wheels, *as_ofs)
    try:
        yield t
    finally:
        t["index"].stop()
        shutil.rmtree(d, ignore_errors=True)


def shared_dir(prefix: str = "llmgw-sec-") -> Path:
    """A new directory under /tmp every user may traverse (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    return d
