"""Defaults the library and the CLI share: defined once here, read by both (the CLI's `--help`
shows these values; nothing repeats them). Lock timeouts live with the locks (core/locks.py)."""

from __future__ import annotations

PYPI_SIMPLE = "https://pypi.org/simple"

# Where a build's interpreter may come from (uv's --python-preference values).
PYTHON_PREFERENCES = ("only-managed", "managed", "system", "only-system")
PYTHON_PREFERENCE = "managed"  # the host's interpreter before a download (issue 16)

