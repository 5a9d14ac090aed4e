"""Facts about this machine that decide what a build produces (they enter every key)."""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache


@lru_cache(maxsize=1)
def platform_facts() -> dict[str, str]:
    """OS, machine and libc. `os.confstr` answers from glibc itself, without reading any binary."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc and sys.platform.startswith("linux"):
        name, version = platform.libc_ver()
        libc = f"{name} {version}".strip() or "musl-or-unknown"
    return {"os": sys.platform, "machine": platform.machine(), "libc": libc}
