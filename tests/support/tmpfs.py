"""A real tmpfs of a chosen size, for full-disk and read-only-filesystem tests (root only: the test
is skipped where mounting is not permitted)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str = "128m") -> Iterator[Path]:
    """`mnt` (created) with a fresh tmpfs of `size` mounted on it, unmounted afterwards."""
    mnt.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], capture_output=True, check=False)
        subprocess.run(["chmod", "-R", "u+w", str(mnt)], check=False)
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its filesystem has no block left; the file."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        try:
            while True:
                os.write(fd, b"\0")
        except OSError:
            pass
    finally:
        os.close(fd)
    return path


def remount_readonly(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
