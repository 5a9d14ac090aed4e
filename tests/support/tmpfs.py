"""A real small filesystem for a test: a tmpfs mounted on a fresh directory (root only; the test is
skipped where mounting is not permitted), unmounted afterwards even if the test left it read-only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(mnt: Path, size: str = "64m") -> Iterator[Path]:
    mnt.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], capture_output=True, check=False)
        subprocess.run(["chmod", "-R", "u+w", str(mnt)], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
