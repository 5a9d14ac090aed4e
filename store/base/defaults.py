"""Defaults the library and the CLI share: defined once here, read by both (the CLI's `--help`
shows these values; nothing repeats them). Nothing is imported: the fast path reads this module."""

from __future__ import annotations

PYPI_SIMPLE = "https://pypi.org/simple"

# Where a build's interpreter may come from (uv's --python-preference values).
PYTHON_PREFERENCES = ("only-managed", "managed", "system", "only-system")
PYTHON_PREFERENCE = "managed"  # the host's interpreter before a download (issue 16)


# --progress / LLMGW_STORE_PROGRESS (base/report.py renders each).
PROGRESS_MODES = ("auto", "tty", "plain", "json", "none")
# How each child is contained (supervise/cgroups.py; docs/operations.md#containment-of-children).
CONTAINMENTS = ("auto", "systemd-scope", "cgroup", "subreaper")

# How long a command waits for a lock before it exits 75 (core/locks.py): a key is held for a whole
# build; every other lock only for short critical sections.
BUILD_LOCK_TIMEOUT_S = 3600.0
LOCK_TIMEOUT_S = 60.0
