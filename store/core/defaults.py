"""Defaults the library and the CLI share: defined once here, read by both (the CLI's `--help`
shows these values; nothing repeats them)."""

from __future__ import annotations

PYPI_SIMPLE = "https://pypi.org/simple"

# Where a build's interpreter may come from (uv's --python-preference values).
PYTHON_PREFERENCES = ("only-managed", "managed", "system", "only-system")
PYTHON_PREFERENCE = "only-managed"

# Seconds a command waits for a lock another process holds before it gives up with exit 75.
BUILD_LOCK_TIMEOUT_S = 3600.0  # another process building the same key: worth waiting for
GC_LOCK_TIMEOUT_S = 60.0  # gc and the commands that wait for it
