"""A second, hostile local user for tests, and a directory every user may traverse.

    @pytest.fixture(scope="module")
    def intruder():
        yield from second_user("llmgwsec")

The user is real: made with useradd (only as root; otherwise the test is skipped) and removed
afterwards. `as_user` runs a Python snippet as that user with the system's python3 and no store
code: what any user of the node could type.

`local_user` and `cli_as` run the installed `llmgw-store` as a second user (as a systemd unit's
`User=` runs an engine) with a system interpreter every user can execute and the test
environment's site-packages, so what runs is this checkout's code; where that cannot work (not
root, no useradd, a checkout other users cannot read) the test is skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TIMEOUT_S = 60
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def _fresh_user(prefix: str):
    """The pwd entry of a new local user with no home and no shell, removed when the generator ends."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("a second user can only be made as root with useradd")
    import pwd

    name = f"{prefix}{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def second_user(prefix: str):
    """Generator for a module-scoped fixture: the pwd entry of a fresh local user."""
    if SYSTEM_PYTHON is None:
        pytest.skip("a second user's snippets need /usr/bin/python3")
    yield from _fresh_user(prefix)


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


# -- a service user running the CLI --

SYSTEM_PATH = "/usr/bin:/bin"


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
def traversable_dir(prefix: str = "llmgw-shared-") -> Iterator[Path]:
    """A directory under /tmp every user may traverse (pytest's tmp_path is private to root)."""
    d = shared_dir(prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


@contextmanager
def local_user(prefix: str = "llmgwsvc") -> Iterator:
    """A fresh local user (pwd entry) with no home and no shell, removed on exit."""
    yield from _fresh_user(prefix)


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
