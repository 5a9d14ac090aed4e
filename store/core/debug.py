"""Test hooks that widen race windows on purpose, like Nix's NIX_DEBUG_GC_WAIT. Each is an
environment variable holding seconds to sleep at one named point; unset, they cost a dict lookup."""

from __future__ import annotations

import os
import time


def pause(point: str) -> None:
    """Sleep for $LLMGW_STORE_DEBUG_<POINT> seconds, if set."""
    seconds = os.environ.get(f"LLMGW_STORE_DEBUG_{point}")
    if seconds:
        time.sleep(float(seconds))
