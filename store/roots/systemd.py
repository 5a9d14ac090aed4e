"""`systemd-units`: the gc service and timer for THIS installation, carrying the node's gc policy.

The units name the entry point that is running now (pip, pipx and `--prefix` installs all put it
somewhere else than /usr/bin) and the store root it was given, so what the timer runs is what the
operator just ran. The service runs `gc` with the policy given here (GcPolicy: how old a
generation may get, how much free space to keep, how large the caches may grow, the grace period),
written into ExecStart, where `systemctl cat` shows it. Every value that goes into a unit is checked
before anything is written — sizes and durations parsed as `gc` parses them, the calendar
expression by `systemd-analyze calendar` where it is installed (else by a strict parser of the
same grammar) — and quoted for systemd (`%` and `$` are systemd's own specifiers and are doubled),
so no value can add a line or a directive.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.core.errors import UsageError
from llmgw_store.core.files import write_outside
from llmgw_store.core.layout import Layout
from llmgw_store.core.names import shown
from llmgw_store.core.results import Result
from llmgw_store.core.units import parse_duration, parse_size

SERVICE = "llmgw-store-gc.service"
TIMER = "llmgw-store-gc.timer"
DEFAULT_ON_CALENDAR = "*-*-* 04:17:00"
OFF = "none"  # a policy value that leaves its gc option out
_PATH_MAX = 4096
_CALENDAR_MAX = 100
CALENDAR_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GcPolicy:
    """What the timer's gc does, as `gc` options; `OFF` (or None) leaves one out. The defaults: drop
    generations older than 30 days (never a profile's current one), collect until 200 GiB are free,
    prune the uv and bytecode caches to 20 GiB by live use (entries no live path was built from go
    first), and keep a path unrooted less than an hour ago (a rollback right after a switch)."""

    delete_older_than: str | None = "30d"
    keep: int | None = None
    min_free: str | None = "200G"
    max_cache: str | None = "20G"
    keep_dead_for: str | None = "1h"

    def args(self) -> list[str]:
        """The gc arguments, each value checked as gc checks it (exit 2 before anything is written)."""
        out = ["gc"]
        for option, value, parse in (("--delete-older-than", self.delete_older_than, parse_duration),
                                     ("--keep", self.keep, _count),
                                     ("--min-free", self.min_free, parse_size),
                                     ("--max-cache", self.max_cache, parse_size),
                                     ("--keep-dead-for", self.keep_dead_for, parse_duration)):
            if value is None or str(value).strip().lower() == OFF:
                continue
            text = str(value).strip()
            try:
                parse(text)
            except UsageError as exc:
                raise UsageError(f"{option} {shown(text)}: {exc}") from None
            out += [option, text]
        return out


def _count(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise UsageError("not a number of generations (1, 2, ...)")
    return int(text)


@dataclass(frozen=True)
class Units(Result):
    service: str
    timer: str
    exec_start: str
    on_calendar: str
    documentation: str | None


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


def documentation() -> str | None:
    """A `Documentation=` URL that exists on this machine: the operations page of this
    installation's source tree (a checkout, an editable install). A wheel ships no docs: then
    None, and the unit's comment says where to look instead (`llmgw-store gc --help`)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
    return page.as_uri() if page.is_file() else None


# --- OnCalendar --------------------------------------------------------------------------------------
# The grammar of systemd.time(7) "Calendar Events", strictly: a shorthand, or
#     [WEEKDAYS] [DATE] [TIME] [TIMEZONE]
# WEEKDAYS: Mon..Sun names (full or 3 letters), lists with `,`, ranges with `..`; DATE: Y-M-D or M-D,
# each part `*` or numbers with `,` lists, `..` ranges and `/` repetitions (`~` for days from the
# month's end); TIME: H:M[:S] alike (seconds may have a fraction); TIMEZONE: UTC or an Area/City.
_SHORTHANDS = {"minutely", "hourly", "daily", "monthly", "weekly", "yearly", "annually", "quarterly",
               "semiannually"}
_DAY = r"(?:mon|tue|wed|thu|fri|sat|sun)(?:day|sday|nesday|rsday|urday)?"
_WEEKDAYS = re.compile(rf"{_DAY}(?:\.\.{_DAY})?(?:,{_DAY}(?:\.\.{_DAY})?)*", re.IGNORECASE)
_NUM = r"[0-9]{1,4}"
_VALUE = rf"(?:\*|{_NUM}(?:\.\.{_NUM})?)(?:/{_NUM})?"
_PART = rf"{_VALUE}(?:,{_VALUE})*"
_DATE = re.compile(rf"(?:{_PART}-)?{_PART}[-~]{_PART}")
_SECONDS = r"(?:\*|[0-9]{1,2}(?:\.[0-9]{1,6})?(?:\.\.[0-9]{1,2})?)(?:/[0-9]{1,2}(?:\.[0-9]{1,6})?)?"
_TIME = re.compile(rf"{_PART}:{_PART}(?::{_SECONDS}(?:,{_SECONDS})*)?")
_ZONE = re.compile(r"UTC|[A-Z][A-Za-z_]{1,30}(?:/[A-Z][A-Za-z_+-]{1,30}){1,2}")


def strict_calendar(spec: str) -> bool:
    """Whether `spec` is a calendar expression of systemd.time(7)'s grammar (see above)."""
    words = spec.split()
    if len(words) == 1 and words[0].lower() in _SHORTHANDS:
        return True
    if not words or len(words) > 4:
        return False
    parts = [_WEEKDAYS, _DATE, _TIME, _ZONE]
    matched = False
    for word in words:
        while parts and not parts[0].fullmatch(word):
            parts.pop(0)
        if not parts:
            return False
        parts.pop(0)
        matched = True
    return matched


def check_calendar(spec: str) -> str:
    """`spec`, once it is a calendar expression systemd accepts: `systemd-analyze calendar` says so
    where it is installed, else strict_calendar; anything else (`every day`) is a UsageError."""
    hint = "use a systemd calendar expression such as 'daily' or '*-*-* 04:17:00' (see systemd.time(7))"
    if not spec or len(spec) > _CALENDAR_MAX or not spec.isprintable() or spec != spec.strip():
        raise UsageError(f"--on-calendar {shown(spec)}: {hint}")
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        try:
            done = subprocess.run([analyze, "calendar", "--", spec], capture_output=True, text=True,
                                  timeout=CALENDAR_CHECK_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None:
            if done.returncode != 0:
                raise UsageError(f"--on-calendar {shown(spec)}: systemd-analyze calendar refuses it; {hint}")
            # systemd parses it; the strict grammar still keeps every byte of the unit plain.
            if re.fullmatch(r"[A-Za-z0-9*:,./~ +_-]+", spec):
                return spec
    if not strict_calendar(spec):
        raise UsageError(f"--on-calendar {shown(spec)}: {hint}")
    return spec


def _quoted(value: str, what: str) -> str:
    if not value or len(value) > _PATH_MAX or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise UsageError(f"{what} {value[:80]!r} cannot go into a systemd unit (empty, too long or a control character)")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def render(exe: str, root: Path, policy: GcPolicy, on_calendar: str,
           docs: str | None = None) -> tuple[str, str, str]:
    if not os.path.isabs(exe) or not root.is_absolute():
        raise UsageError("the entry point and the store root must be absolute paths")
    gc_args = policy.args()  # a bad size or duration is a usage error, before anything is written
    on_calendar = check_calendar(on_calendar)
    argv = [exe, "--root", str(root), *gc_args]
    exec_start = " ".join(_quoted(a, "value") for a in argv)
    doc_line = (f"Documentation={docs}\n" if docs and not any(ord(c) < 33 for c in docs)
                else "# Documentation: `llmgw-store gc --help`, and docs/operations.md of llmgw-store's source\n")
    service = f"""# Written by `llmgw-store systemd-units`: ExecStart is the installation that wrote it, with its
# store root and gc policy. After moving or reinstalling llmgw-store, or to change the policy, write
# the units again (`llmgw-store systemd-units --help` lists the policy's options).
[Unit]
Description=llmgw-store garbage collection ({root})
{doc_line}After=local-fs.target

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


def write_units(out_dir: str | Path, *, root: str | Path | None = None, policy: GcPolicy = GcPolicy(),
                on_calendar: str = DEFAULT_ON_CALENDAR, exe: str | None = None) -> Units:
    """Write SERVICE and TIMER into `out_dir` (each atomically: a temporary file renamed over it)."""
    store_root = Layout.at(root).root.absolute()
    docs = documentation()
    service, timer, exec_start = render(exe or entry_point(), store_root, policy, on_calendar, docs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in ((SERVICE, service), (TIMER, timer)):
        # Outside the root (/etc/systemd/system): a checked directory, never through a link.
        write_outside(out / name, text.encode(), mode=0o644)
    return Units(service=str(out / SERVICE), timer=str(out / TIMER), exec_start=exec_start,
                 on_calendar=on_calendar, documentation=docs)
