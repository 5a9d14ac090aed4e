"""A second, real local user for tests (made with useradd as root, removed afterwards), and the
installed `llmgw-store` run as that user — as a systemd unit's `User=` runs an engine.

The user runs the command with a system interpreter every user can execute (the test
environment's may live in root's private home) and the test environment's site-packages, so what
runs is this checkout's code. Where that cannot work (not root, no useradd, a checkout other users
cannot read), `local_user` skips the test and says why.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SYSTEM_PATH = "/usr/bin:/bin"
TIMEOUT_S = 60


def system_python() -> str | None:
    """A /usr/bin python of this interpreter's minor version (the site-packages are built for it)."""
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return shutil.which(minor, path=SYSTEM_PATH)


def _world_readable(path: Path) -> str | None:
    """None when every user can read `path` (and enter each directory on the way), else why not."""
    path = path.resolve()
    for p in [*reversed(path.parents), path]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH or (p == path and not mode & stat.S_IROTH):
            return f"{p} is mode {stat.S_IMODE(mode):o}"
    return None


@contextmanager
def shared_dir(prefix: str = "llmgw-shared-") -> Iterator[Path]:
    """A directory under /tmp every user may traverse (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


@contextmanager
def local_user(prefix: str = "llmgwsvc") -> Iterator:
    """A fresh local user (pwd entry) with no home and no shell, removed on exit."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("a second user can only be made as root with useradd")
    name = f"{prefix}{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        import pwd

        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def need_cli_for_others() -> str:
    """The system interpreter a second user runs the CLI with; skips when there is none, or when
    the checkout or its site-packages are not readable by other users."""
    python = system_python()
    if python is None:
        pytest.skip(f"no {SYSTEM_PATH} python{sys.version_info.major}.{sys.version_info.minor} for a second user")
    repo = Path(__file__).resolve().parents[2]
    for p in (site_packages(), repo / "store", repo / "cli"):
        why = _world_readable(p)
        if why is not None:
            pytest.skip(f"other users cannot read this checkout ({why})")
    return python


_RUN_CLI = ("import site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = 'llmgw-store'; "
            "from llmgw_store.cli import main; main()")


def cli_as(user, root: Path, *args: str, env: dict | None = None, python: str | None = None,
           timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """`llmgw-store --root ROOT ARGS...` run as `user`, with a clean environment and cwd /."""
    python = python or need_cli_for_others()
    base = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "LLMGW_STORE_PROGRESS": "plain"}
    return subprocess.run([python, "-I", "-c", _RUN_CLI, str(site_packages()), "--root", str(root), *args],
                          user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/", capture_output=True,
                          text=True, timeout=timeout, env={**base, **(env or {})}, check=False)


def run_as(user, argv: list[str], env: dict | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/", capture_output=True,
                          text=True, timeout=timeout, env={"PATH": SYSTEM_PATH, **(env or {})}, check=False)
