"""Test hooks that widen race windows on purpose, like Nix's NIX_DEBUG_GC_WAIT. Each is an
environment variable holding seconds to sleep at one named point; unset, they cost a dict lookup.
Children run in a clean environment, so a point inside a child (COMPILE_PAUSE, in each bytecode
compile worker) is handed to it explicitly with `passed_on`."""

from __future__ import annotations

import os
import time


def pause(point: str) -> None:
    """Sleep for $LLMGW_STORE_DEBUG_<POINT> seconds, if set."""
    seconds = os.environ.get(f"LLMGW_STORE_DEBUG_{point}")
    if seconds:
        time.sleep(float(seconds))


def passed_on(point: str) -> dict[str, str]:
    """{LLMGW_STORE_DEBUG_<POINT>: seconds} if set, for a child's environment; else {}."""
    name = f"LLMGW_STORE_DEBUG_{point}"
    seconds = os.environ.get(name)
    return {name: seconds} if seconds else {}
