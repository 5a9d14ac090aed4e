"""`systemd-units`: the gc service and timer for THIS installation, running the node's day.

The units name the entry point that is running now (pip, pipx and `--prefix` installs all put it
somewhere else than /usr/bin), the store root it was given and the config file it read, so what
the timer runs is what the operator runs by hand: `gc` with `--config FILE` reads the file's [gc]
table as a hand-run `gc` does (the units have no policy of their own: a gc option is written into
ExecStart only when given to `systemd-units` as a flag or variable). After gc, where the file
configures them, the service runs `push-roots` ([node] roots_to and secret_key: the roots cache
gc keeps) and `stats` ([stats] prometheus: the textfile node_exporter reads), each with the same
`--config`. Every value that goes into a unit is checked before anything is written — sizes and
durations parsed as `gc` parses them, the calendar expression by `systemd-analyze calendar` where
it is installed (else by a strict parser of the same grammar) — and quoted for systemd (`%` and `$`
are systemd's own specifiers and are doubled), so no value can add a line or a directive.

With `--follow`, a second pair (FOLLOW_SERVICE, FOLLOW_TIMER) makes the node converge without an
operator: every `--follow-every` (60 s by default) the service runs `activate PROFILE` for each
profile the config file's `releases` table names (activate reads that table: the profile follows
its release, a held profile stays where it is), then `push-roots` where the file configures it, so
`fleet` sees what the node runs. The profiles are those of the file when the units are written:
after changing the table, write the units again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.app.results import Result
from llmgw_store.app.units import parse_duration, parse_size
from llmgw_store.base.errors import UsageError
from llmgw_store.base.text import shown
from llmgw_store.cache.releases import check_release_name
from llmgw_store.core.layout import Layout
from llmgw_store.core.names import check_profile
from llmgw_store.system.files import write_outside

SERVICE = "llmgw-store-gc.service"
TIMER = "llmgw-store-gc.timer"
FOLLOW_SERVICE = "llmgw-store-follow.service"
FOLLOW_TIMER = "llmgw-store-follow.timer"
DEFAULT_FOLLOW_EVERY = "60s"
_FOLLOW_EVERY_MAX_S = 7 * 86400
DEFAULT_ON_CALENDAR = "*-*-* 04:17:00"
OFF = "none"  # gc's "no limit" for a size or duration option, over the config file's value
_PATH_MAX = 4096
_CALENDAR_MAX = 100
CALENDAR_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GcPolicy:
    """The gc options written into ExecStart besides `--config` (None leaves one out; `OFF`, gc's
    "no limit", overrides the file's value).
    None by default, as gc's own: the config file's [gc] table is the node's policy, read by gc
    when the timer runs it, as when it is run by hand."""

    delete_older_than: str | None = None
    keep: int | str | None = None  # a count, or its text as given (checked by args)
    min_free: str | None = None
    max_cache: str | None = None
    keep_dead_for: str | None = None

    def args(self) -> list[str]:
        """The gc arguments, each value checked as gc checks it (exit 2 before anything is written)."""
        out = ["gc"]
        for option, value, parse in (("--delete-older-than", self.delete_older_than, parse_duration),
                                     ("--keep", self.keep, _count),
                                     ("--min-free", self.min_free, parse_size),
                                     ("--max-cache", self.max_cache, parse_size),
                                     ("--keep-dead-for", self.keep_dead_for, parse_duration)):
            if value is None:
                continue
            text = str(value).strip()
            if text.lower() == OFF and option != "--keep":
                out += [option, OFF]  # gc's "no limit", over the config file's value
                continue
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
    exec_start: str  # the gc
    on_calendar: str
    documentation: str | None
    then: tuple[str, ...] = ()  # what runs after gc: push-roots, stats (ExecStart lines, in order)
    follow_service: str | None = None  # with --follow: the follow service and timer, what it runs, how often
    follow_timer: str | None = None
    follow: tuple[str, ...] = ()  # the follow service's ExecStart lines: activate per profile, then push-roots
    follow_every: str | None = None


@dataclass(frozen=True)
class NodeDay:
    """What the service runs besides gc, from the config file (`config`, absolute; None: none read):
    push-roots when the file sets [node] roots_to and secret_key, stats when it sets [stats] prometheus."""

    config: str | None = None
    push_roots: bool = False
    stats: bool = False
    follows: tuple[str, ...] = ()  # the profiles the file's `releases` table names (checked names, sorted)

    @classmethod
    def from_file(cls, path: str | None, values: dict[str, object]) -> NodeDay:
        if path is None:
            return cls()
        roots = [k for k in ("node.roots_to", "node.secret_key") if k in values]
        if len(roots) == 1:
            missing = ({"node.roots_to", "node.secret_key"} - set(roots)).pop().split(".")[1]
            raise UsageError(f"{path}: [node] sets {roots[0].split('.')[1]} but not {missing}: push-roots needs both "
                             "(set both to publish this node's roots after each gc, or neither)")
        follows = []
        words = values.get("releases")  # PROFILE=RELEASE words (cli/config.py checked them: a tuple)
        for word in words if isinstance(words, tuple) else ():
            profile, _, release = str(word).partition("=")
            follows.append(check_profile(profile))
            check_release_name(release)
        return cls(os.path.abspath(path), push_roots=len(roots) == 2, stats="stats.prometheus" in values,
                   follows=tuple(sorted(set(follows))))


def follow_every(text: str) -> str:
    """`--follow-every`: a duration as gc parses them, from 1 s to a week, written as seconds."""
    try:
        seconds = parse_duration(str(text).strip())
    except UsageError as exc:
        raise UsageError(f"--follow-every {shown(text)}: {exc}") from None
    if not 1 <= seconds <= _FOLLOW_EVERY_MAX_S:
        raise UsageError(f"--follow-every {shown(text)}: from 1s to 7d")
    return f"{int(seconds)}s"


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
           docs: str | None = None, day: NodeDay = NodeDay()) -> tuple[str, str, str, tuple[str, ...]]:
    if not os.path.isabs(exe) or not root.is_absolute():
        raise UsageError("the entry point and the store root must be absolute paths")
    gc_args = policy.args()  # a bad size or duration is a usage error, before anything is written
    on_calendar = check_calendar(on_calendar)
    base = [exe, "--root", str(root), *(["--config", day.config] if day.config else [])]

    def line(args: list[str]) -> str:
        return " ".join(_quoted(a, "value") for a in [*base, *args])

    exec_start = line(gc_args)
    then = tuple(line([cmd]) for cmd, wanted in (("push-roots", day.push_roots), ("stats", day.stats)) if wanted)
    doc_line = (f"Documentation={docs}\n" if docs and not any(ord(c) < 33 for c in docs)
                else "# Documentation: `llmgw-store gc --help`, and docs/operations.md of llmgw-store's source\n")
    steps = "".join(f"ExecStart={t}\n" for t in then)
    after = ("# Then, in order, each once the one before succeeded (75 counts as success): what the config\n"
             "# file configures of push-roots ([node]) and stats ([stats] prometheus).\n" if then else "")
    service = f"""# Written by `llmgw-store systemd-units`: ExecStart is the installation that wrote it, with its
# store root and config file, whose [gc] table is the policy. After moving or reinstalling
# llmgw-store, or to change what runs after gc, write the units again.
[Unit]
Description=llmgw-store garbage collection ({root})
{doc_line}After=local-fs.target

[Service]
Type=oneshot
# 75 (EX_TEMPFAIL): another gc held the lock; the timer simply tries again next time.
SuccessExitStatus=75
ExecStart={exec_start}
{after}{steps}Nice=10
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
    return service, timer, exec_start, then


def render_follow(exe: str, root: Path, day: NodeDay, every: str,
                  docs: str | None = None) -> tuple[str, str, tuple[str, ...]]:
    """The follow service and timer: `activate PROFILE` for each followed profile, then push-roots."""
    if not os.path.isabs(exe) or not root.is_absolute():
        raise UsageError("the entry point and the store root must be absolute paths")
    if day.config is None or not day.follows:
        raise UsageError("--follow writes a unit that follows the releases of the config file: give --config FILE "
                         "whose `releases` table names them (releases = {vllm = \"vllm-prod\"})")
    every = follow_every(every)
    base = [exe, "--root", str(root), "--config", day.config]

    def line(args: list[str]) -> str:
        return " ".join(_quoted(a, "value") for a in [*base, *args])

    lines = tuple(line(["activate", p]) for p in day.follows) + ((line(["push-roots"]),) if day.push_roots else ())
    doc_line = (f"Documentation={docs}\n" if docs and not any(ord(c) < 33 for c in docs)
                else "# Documentation: `llmgw-store activate --help`, and docs/fleet.md of llmgw-store's source\n")
    steps = "".join(f"ExecStart={t}\n" for t in lines)
    service = f"""# Written by `llmgw-store systemd-units --follow`: each profile the config file's `releases`
# table named then follows its release (a held profile stays where it is: `llmgw-store hold`), in
# order, each once the one before succeeded; then push-roots where the file's [node] table is set.
# After changing that table, or moving or reinstalling llmgw-store, write the units again.
[Unit]
Description=llmgw-store follow the releases ({root})
{doc_line}After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
# 75 (EX_TEMPFAIL): a lock was held; the timer simply tries again next time.
SuccessExitStatus=75
{steps}Nice=5
"""
    timer = f"""# Written by `llmgw-store systemd-units --follow`.
[Unit]
Description=Follow the llmgw-store releases ({root})

[Timer]
OnBootSec={every}
OnUnitActiveSec={every}
AccuracySec=1s

[Install]
WantedBy=timers.target
"""
    return service, timer, lines


def write_units(out_dir: str | Path, *, root: str | Path | None = None, policy: GcPolicy = GcPolicy(),
                on_calendar: str = DEFAULT_ON_CALENDAR, exe: str | None = None, day: NodeDay = NodeDay(),
                follow: str | None = None) -> Units:
    """Write SERVICE and TIMER into `out_dir` (each atomically: a temporary file renamed over it);
    with `follow` (how often, a duration), FOLLOW_SERVICE and FOLLOW_TIMER too. Every value is
    checked before the first file is written."""
    store_root = Layout.at(root).root.absolute()
    docs = documentation()
    exe = exe or entry_point()
    service, timer, exec_start, then = render(exe, store_root, policy, on_calendar, docs, day)
    files = [(SERVICE, service), (TIMER, timer)]
    follow_lines: tuple[str, ...] = ()
    if follow is not None:
        f_service, f_timer, follow_lines = render_follow(exe, store_root, day, follow, docs)
        files += [(FOLLOW_SERVICE, f_service), (FOLLOW_TIMER, f_timer)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files:
        # Outside the root (/etc/systemd/system): a checked directory, never through a link.
        write_outside(out / name, text.encode(), mode=0o644)
    followed = follow is not None
    return Units(service=str(out / SERVICE), timer=str(out / TIMER), exec_start=exec_start,
                 on_calendar=on_calendar, documentation=docs, then=then,
                 follow_service=str(out / FOLLOW_SERVICE) if followed else None,
                 follow_timer=str(out / FOLLOW_TIMER) if followed else None, follow=follow_lines,
                 follow_every=follow_every(follow) if follow is not None else None)
