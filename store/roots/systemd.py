"""`systemd-units`: the gc service and timer for THIS installation.

The units name the entry point that is running now (pip, pipx and `--prefix` installs all put it
somewhere else than /usr/bin) and the store root it was given, so what the timer runs is what the
operator just ran. Every value that goes into a unit is checked (absolute paths without control
characters, a duration, a calendar expression of plain characters) and quoted for systemd (`%`
and `$` are systemd's own specifiers and are doubled), so no value can add a line or a directive.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core.errors import UsageError
from llmgw_store.core.files import write_outside
from llmgw_store.core.layout import Layout
from llmgw_store.core.results import Result
from llmgw_store.core.units import parse_duration

SERVICE = "llmgw-store-gc.service"
TIMER = "llmgw-store-gc.timer"
DEFAULT_ON_CALENDAR = "*-*-* 04:17:00"
DEFAULT_GC_ARGS = ("gc", "--delete-older-than", "30d", "--min-free", "200G")
_CALENDAR_RE = re.compile(r"[A-Za-z0-9*:,./~ +-]{1,100}")
_PATH_MAX = 4096


@dataclass(frozen=True)
class Units(Result):
    service: str
    timer: str
    exec_start: str


def entry_point(argv0: str | None = None) -> str:
    """The absolute path of the running `llmgw-store` (its argv[0] when that is the console
    script), else the one on PATH. Not resolved through links: a pipx link keeps working across
    upgrades of the venv it points into."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if argv0 and os.path.basename(argv0) == "llmgw-store":
        path = os.path.abspath(argv0 if os.sep in argv0 else (shutil.which(argv0) or argv0))
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("llmgw-store")
    if found:
        return os.path.abspath(found)
    raise UsageError("cannot tell where llmgw-store is installed (not run as `llmgw-store`, none on PATH); "
                     "run `llmgw-store systemd-units` from the installed command")


def _quoted(value: str, what: str) -> str:
    if not value or len(value) > _PATH_MAX or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise UsageError(f"{what} {value[:80]!r} cannot go into a systemd unit (empty, too long or a control character)")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def render(exe: str, root: Path, keep_dead_for: str, on_calendar: str) -> tuple[str, str, str]:
    if not os.path.isabs(exe) or not root.is_absolute():
        raise UsageError("the entry point and the store root must be absolute paths")
    parse_duration(keep_dead_for)  # a bad duration is a usage error, before anything is written
    if not _CALENDAR_RE.fullmatch(on_calendar):
        raise UsageError(f"--on-calendar {on_calendar[:80]!r}: use a systemd calendar expression "
                         "(letters, digits, * : , . / ~ + - and spaces; e.g. 'daily' or '*-*-* 04:17:00')")
    argv = [exe, "--root", str(root), *DEFAULT_GC_ARGS, "--keep-dead-for", keep_dead_for]
    exec_start = " ".join(_quoted(a, "value") for a in argv)
    service = f"""# Written by `llmgw-store systemd-units`: ExecStart is the installation that wrote it, with its
# store root. After moving or reinstalling llmgw-store, write the units again.
[Unit]
Description=llmgw-store garbage collection ({root})
Documentation=file:///usr/share/doc/llmgw-store/operations.md
After=local-fs.target

[Service]
Type=oneshot
# 75 (EX_TEMPFAIL): another gc held the lock; the timer simply tries again next time.
SuccessExitStatus=75
ExecStart={exec_start}
Nice=10
IOSchedulingClass=idle
"""
    timer = f"""# Written by `llmgw-store systemd-units`.
[Unit]
Description=Run llmgw-store gc ({root})

[Timer]
OnCalendar={on_calendar}
RandomizedDelaySec=30min
Persistent=true

[Install]
WantedBy=timers.target
"""
    return service, timer, exec_start


def write_units(out_dir: str | Path, *, root: str | Path | None = None, keep_dead_for: str = "1h",
                on_calendar: str = DEFAULT_ON_CALENDAR, exe: str | None = None) -> Units:
    """Write SERVICE and TIMER into `out_dir` (each atomically: a temporary file renamed over it)."""
    store_root = Layout.at(root).root.absolute()
    service, timer, exec_start = render(exe or entry_point(), store_root, keep_dead_for, on_calendar)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in ((SERVICE, service), (TIMER, timer)):
        # Outside the root (/etc/systemd/system): a checked directory, never through a link.
        write_outside(out / name, text.encode(), mode=0o644)
    return Units(service=str(out / SERVICE), timer=str(out / TIMER), exec_start=exec_start)
