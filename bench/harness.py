"""The one harness every bench uses: how a command is run and measured, how two commands are
compared, and how a bench writes its rows (JSON and a printed table). No bench times or measures
anything by itself.

Measuring one command (`Meter.run`):
- wall seconds: CLOCK_MONOTONIC around fork and wait4 of the command alone, taken by a small C
  launcher (bench/launch.c, compiled once into ~/.cache/llmgw-bench with `cc -O2`);
- peak RSS: ru_maxrss of the command and the children it waited for, as the launcher sees it. The
  launcher is tiny when it forks, so the figure is the command's own: a child forked straight from
  a Python bench that has touched 600 MiB starts its ru_maxrss at that high-water mark (issue 28).
  For a pipeline it is the largest single process, not the sum (what GNU time reports too). It
  counts every resident page, those of files the command maps (page cache) included;
- CPU seconds: `cpu.stat` of a fresh cgroup v2 the command is moved into before exec, so children
  nobody waits for (Python's compileall -j N forkserver, a daemon) are counted; they are given up to
  `STRAGGLER_WAIT_S` to end after the command exits, then killed (cgroup.kill) and counted.
Fallbacks, each named in every result document (`host.launcher`, `host.cpu_accounting`): without a
C compiler, GNU time (`/usr/bin/time -f`, Debian package `time`; wall then taken around it, its own
~1 ms start included on both sides); without either, no peak RSS at all (a figure from wait4 here
would be this process's memory, not the command's). Without a writable cgroup v2 (it needs root,
or a delegated subtree), CPU seconds are wait4's (`cpu_waited_s`) and the document says which
children that misses. `LLMGW_BENCH_LAUNCHER=c|time|none` forces one launcher.

Comparing (`Bench.compare`): the sides run alternately in fresh processes, one run of each per
round, the order rotating every round (A B, B A, ...), after one untimed warm-up of each; a side
may prepare its round (a fresh root, a copy of a cache) outside the timing and check afterwards
that the run did the work. A row gives each side's median wall and CPU seconds and largest peak
RSS, the median of the per-round ratios (the ratio quoted; steadier than a ratio of medians when
the load swings between rounds) beside the ratio of medians, and the 1-minute load average seen
during the row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = Path(sys.executable)
CLI = PY.with_name("llmgw-store")
LAUNCH_SRC = Path(__file__).with_name("launch.c")
STRAGGLER_WAIT_S = 30.0
SCHEMA = 1


class BenchError(SystemExit):
    """A bench cannot run or a command it measures failed: one line, exit 1."""

    def __init__(self, message: str) -> None:
        super().__init__(f"bench: {message}")


@dataclass
class Run:
    """One measured run of one command."""

    wall_s: float
    rss_mib: float | None      # None: no launcher could measure it (see Meter.launcher)
    cpu_s: float | None        # cgroup: every process the command started; None without a cgroup
    cpu_waited_s: float        # rusage of the children waited for
    code: int
    stdout: str
    stderr: str
    stragglers_killed: int = 0


def clean_env(extra: dict | None = None) -> dict:
    """The environment commands run in: this one without PYTHONDONTWRITEBYTECODE (every start
    then uses cached bytecode, as on a node), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra or {})
    return env


def _compiled_launcher() -> Path | None:
    """bench/launch.c compiled once per source version; None where no C compiler works."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    digest = hashlib.sha256(LAUNCH_SRC.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmgw-bench"
    exe = cache / f"launch-{digest}"
    if os.access(exe, os.X_OK):
        return exe
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".launch-{digest}.{os.getpid()}"
    proc = subprocess.run([cc, "-O2", "-o", str(tmp), str(LAUNCH_SRC)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, exe)  # atomic: a concurrent bench sees no launcher or a whole one
    return exe


def _gnu_time() -> Path | None:
    t = Path("/usr/bin/time")
    if not os.access(t, os.X_OK):
        return None
    probe = subprocess.run([str(t), "-f", "%M", "-o", "/dev/null", "true"], capture_output=True)
    return t if probe.returncode == 0 else None


def _cgroup2_root() -> tuple[Path | None, str]:
    """The cgroup v2 directory this process is in, or None and why not."""
    mount = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                head, _, tail = line.partition(" - ")
                if tail.split(" ", 1)[0] == "cgroup2":
                    mount = Path(head.split()[4])
                    break
        own = next((ln.strip()[3:] for ln in open("/proc/self/cgroup") if ln.startswith("0::")), None)
    except OSError as exc:
        return None, f"cannot read the cgroup mounts: {exc}"
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy is mounted"
    return mount / own.lstrip("/"), str(mount)


class Meter:
    """Runs commands and measures them (module docstring: what each figure is)."""

    _made = 0  # meters made by this process: each has a cgroup of its own

    def __init__(self, launcher: str | None = None) -> None:
        want = launcher or os.environ.get("LLMGW_BENCH_LAUNCHER", "auto")
        self.launch: Path | None = None
        self.gnu_time: Path | None = None
        if want in ("auto", "c"):
            self.launch = _compiled_launcher()
        if self.launch is None and want in ("auto", "c", "time"):
            self.gnu_time = _gnu_time()
        if self.launch:
            self.launcher = f"bench/launch.c ({self.launch}): wall, peak RSS and rusage of the command alone"
        elif self.gnu_time:
            self.launcher = ("GNU time (no C compiler for bench/launch.c): peak RSS of the command alone; "
                             "wall includes GNU time's own start (~1 ms) on both sides")
        else:
            self.launcher = ("none (no C compiler, no GNU time): peak RSS NOT measured; "
                             "install Debian's `time` package or a C compiler")
        self.cgroup: Path | None = None
        self._n = 0
        self.cpu_accounting = self._make_cgroup()

    def _make_cgroup(self) -> str:
        parent, where = _cgroup2_root()
        if parent is None:
            return f"missing ({where}): CPU seconds are wait4's, children nobody waits for are not counted"
        _sweep_dead(parent)
        Meter._made += 1
        base = parent / f"llmgw-bench-{os.getpid()}.{Meter._made}"
        try:
            base.mkdir()
        except OSError as exc:
            return (f"missing (cannot create a cgroup under {parent}: {exc.strerror}): CPU seconds are "
                    "wait4's, children nobody waits for are not counted")
        self.cgroup = base
        probe = self.run(["true"], check=False)
        if probe.code != 0 or probe.cpu_s is None:
            self.close()
            return (f"missing (cannot move a process into {base}): CPU seconds are wait4's, children "
                    "nobody waits for are not counted")
        return f"cgroup v2 cpu.stat under {where} (every process the command starts, waited for or not)"

    def close(self) -> None:
        if self.cgroup is not None:
            for child in self.cgroup.iterdir() if self.cgroup.is_dir() else ():
                if child.is_dir():
                    _kill_cgroup(child)
                    _rmdir_quiet(child)
            _rmdir_quiet(self.cgroup)
            self.cgroup = None

    def run(self, argv: list[str], *, env: dict | None = None, cwd: Path | None = None, check: bool = True,
            timeout: float | None = None) -> Run:
        """Run `argv` (stdin empty, stdout and stderr captured) and measure it."""
        argv = [str(a) for a in argv]
        self._n += 1
        cg = None
        if self.cgroup is not None:
            cg = self.cgroup / f"run{self._n}"
            cg.mkdir()
        with tempfile.TemporaryDirectory(prefix="llmgw-bench-run-") as tmp:
            res = Path(tmp) / "rusage"
            if self.launch:
                full = [str(self.launch), str(res), str(cg / "cgroup.procs") if cg else "-", "--", *argv]
            else:
                full = [str(self.gnu_time), "-f", "%M %U %S", "-o", str(res), "--", *argv] if self.gnu_time else argv
                if cg:  # the shell moves itself into the cgroup, then becomes GNU time (or the command)
                    full = ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', str(cg / "cgroup.procs"), *full]
            with open(Path(tmp) / "out", "w+b") as out, open(Path(tmp) / "err", "w+b") as err:
                t0 = time.perf_counter()
                proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        env=clean_env() if env is None else env, cwd=cwd)
                try:
                    _, status, usage = _wait4(proc, timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    if cg:
                        _kill_cgroup(cg)
                        _rmdir_quiet(cg)
                    raise BenchError(f"timed out after {timeout} s: {' '.join(argv)[:300]}") from None
                wall = time.perf_counter() - t0
                code = os.waitstatus_to_exitcode(status)
                if code < 0:
                    code = 128 - code
                out.seek(0)
                err.seek(0)
                stdout = out.read().decode(errors="replace")
                stderr = err.read().decode(errors="replace")
            rss = None
            waited = usage.ru_utime + usage.ru_stime
            if self.launch and res.exists():
                w_ns, rss_kib, u_us, s_us, code = (int(x) for x in res.read_text().split())
                wall, rss, waited = w_ns / 1e9, rss_kib / 1024, (u_us + s_us) / 1e6
            elif self.gnu_time and res.exists():
                # GNU time writes "Command exited with non-zero status N" first when it fails
                rss_kib, u, s = res.read_text().split("\n")[-2].split()
                rss, waited = int(rss_kib) / 1024, float(u) + float(s)
        cpu, killed = None, 0
        if cg:
            killed = _wait_empty(cg, STRAGGLER_WAIT_S)
            cpu = _cpu_seconds(cg)
            _rmdir_quiet(cg)
        run = Run(wall, None if rss is None else round(rss, 2), cpu, waited, code, stdout, stderr, killed)
        if check and code != 0:
            raise BenchError(f"exit {code}: {' '.join(argv)[:300]}\n{stderr[-3000:]}")
        return run


def _sweep_dead(parent: Path) -> None:
    """Remove the empty cgroups of benches that died (a SIGKILLed bench cannot remove its own)."""
    for base in parent.glob("llmgw-bench-*"):
        try:
            os.kill(int(base.name.split("-")[2].split(".")[0]), 0)
            continue  # its bench is alive
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        for child in base.iterdir():
            if child.is_dir() and not _populated(child):
                _rmdir_quiet(child)
        _rmdir_quiet(base)


def _wait4(proc: subprocess.Popen, timeout: float | None):
    """wait4 of `proc` (its rusage), bounded by `timeout` seconds."""
    if timeout is None:
        pid, status, usage = os.wait4(proc.pid, 0)
    else:
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            time.sleep(0.01)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return pid, status, usage


def _populated(cg: Path) -> bool:
    try:
        return "populated 1" in (cg / "cgroup.events").read_text()
    except OSError:
        return False


def _kill_cgroup(cg: Path) -> int:
    """Kill what is left in `cg`; how many processes that was."""
    try:
        pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return 0
    if not pids:
        return 0
    try:
        (cg / "cgroup.kill").write_text("1")
    except OSError:  # before Linux 5.14
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return len(pids)


def _wait_empty(cg: Path, wait_s: float) -> int:
    """Wait until no process is left in `cg` (children nobody waited for finish their work and are
    counted), at most `wait_s`; then kill the rest. Returns how many were killed."""
    deadline = time.monotonic() + wait_s
    while _populated(cg) and time.monotonic() < deadline:
        time.sleep(0.005)
    killed = _kill_cgroup(cg) if _populated(cg) else 0
    end = time.monotonic() + 5
    while _populated(cg) and time.monotonic() < end:
        time.sleep(0.005)
    return killed


def _cpu_seconds(cg: Path) -> float | None:
    try:
        for line in (cg / "cpu.stat").read_text().splitlines():
            k, v = line.split()
            if k == "usage_usec":
                return int(v) / 1e6
    except (OSError, ValueError):
        pass
    return None


def _rmdir_quiet(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------
# What the bench ran on.

def git_commit() -> dict:
    """The commit the bench and the store were run at, and whether the tree differed from it."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip() != ""
        return {"commit": head, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def install_kind() -> str:
    """'regular' or 'editable': how llmgw-store is installed for this interpreter (pip's
    direct_url.json, read by a clean `python -I` outside the checkout, whose egg-info would
    otherwise answer), 'unknown' where that cannot be told."""
    probe = ("from importlib import metadata as m\n"
             "try:\n    print(m.distribution('llmgw-store').read_text('direct_url.json') or '{}')\n"
             "except m.PackageNotFoundError:\n    print('')\n")
    out = subprocess.run([str(PY), "-I", "-c", probe], capture_output=True, text=True, cwd="/").stdout.strip()
    if not out:
        return "unknown"
    try:
        return "editable" if json.loads(out).get("dir_info", {}).get("editable") else "regular"
    except (ValueError, AttributeError):
        return "unknown"


def fs_type(path: Path) -> str:
    """The file system `path` is on (df's fstype: ext4, tmpfs, ...)."""
    p = Path(path)
    while not p.exists():
        p = p.parent
    out = subprocess.run(["df", "--output=fstype,target", str(p)], capture_output=True, text=True)
    lines = out.stdout.split("\n")
    return " on ".join(lines[1].split()) if out.returncode == 0 and len(lines) > 1 else "unknown"


def du_bytes(*paths: Path) -> int:
    """Bytes on disk under `paths` together, each inode once (one `du` over them all)."""
    existing = [str(p) for p in paths if os.path.lexists(p)]
    if not existing:
        return 0
    out = subprocess.run(["du", "-s", "-c", "-B1", *existing], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def rmtree(path: Path) -> None:
    """Remove a tree the store made read-only. Only its directories are made writable (all that
    unlinking needs): its files may be hard links of another root's wheel home or store paths,
    whose modes a check compares (a `chmod -R` here damaged the warm-up root's wheel home)."""
    if os.path.lexists(path):
        subprocess.run(["find", str(path), "-type", "d", "!", "-perm", "-u+w", "-exec", "chmod", "u+w", "{}", "+"],
                       check=False, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Comparing and reporting.

@dataclass
class Side:
    """One command of a comparison. `argv` is a list, or a function of the round number that
    prepares the round outside the timing (a fresh root, a copy of a cache) and returns the argv.
    `after(round, run)` checks the run did the work (raise if not) and may return figures to keep
    (disk, steps); it is not timed either."""

    name: str
    argv: list | Callable[[int], list]
    env: dict | None = None
    cwd: Path | None = None
    after: Callable[[int, Run], dict | None] | None = None
    runs: list[Run] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)

    def run_once(self, meter: Meter, i: int) -> tuple[Run, dict]:
        argv = self.argv(i) if callable(self.argv) else self.argv
        run = meter.run(argv, env=self.env, cwd=self.cwd)
        extra = self.after(i, run) if self.after else None
        return run, extra or {}


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _summary(side: Side) -> dict:
    runs = side.runs
    rss = [r.rss_mib for r in runs if r.rss_mib is not None]
    out = {
        "name": side.name,
        "wall_s": round(_median([r.wall_s for r in runs]), 4),
        "cpu_s": _round(_median([r.cpu_s for r in runs]), 3),
        "cpu_waited_s": _round(_median([r.cpu_waited_s for r in runs]), 3),
        "rss_mib": round(max(rss), 1) if rss else None,
        "runs_s": [round(r.wall_s, 4) for r in runs],
    }
    if any(r.stragglers_killed for r in runs):
        out["stragglers_killed"] = sum(r.stragglers_killed for r in runs)
    keys = {k for e in side.extras for k in e}
    median_run = sorted(range(len(runs)), key=lambda j: runs[j].wall_s)[len(runs) // 2] if runs else 0
    for k in sorted(keys):  # what the side's check kept: the median of numbers, else the median run's
        vals = [e.get(k) for e in side.extras]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[k] = _median(nums) if len(nums) == len(vals) else vals[median_run]
    return out


def _round(x: float | None, n: int) -> float | None:
    return None if x is None else round(x, n)


def _ratio(pairs: list[tuple[float | None, float | None]]) -> float | None:
    rs = [a / b for a, b in pairs if a is not None and b]
    return round(statistics.median(rs), 3) if rs else None


def _goal_met(goal: tuple[str, float] | None, ratio: float | None) -> bool | None:
    if goal is None or ratio is None:
        return None
    op, value = goal
    return ratio <= value if op == "<=" else ratio >= value


def add_common_args(ap: argparse.ArgumentParser, *, rounds: int) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="Small sizes, 2 rounds, the tests' loopback package index (no PyPI): the mode the "
                         "test suite runs, to keep the bench working; its figures are not the record.")
    ap.add_argument("--out", type=Path, help="Directory for the result JSON (default: a new one under $TMPDIR).")
    ap.add_argument("--work", type=Path,
                    help="Scratch directory (created; default: a new one under $TMPDIR). Its file system is "
                         "reported: the disk rows measure the disk it is on.")
    ap.add_argument("--rounds", "--repeat", "--reps", dest="rounds", type=int, default=None,
                    help=f"Alternating rounds (default {rounds}; --quick: 2). --repeat and --reps: the old names.")
    ap.add_argument("--allow-editable", action="store_true",
                    help="Measure hot-path rows from an editable install anyway (flagged in every such row).")
    ap.set_defaults(default_rounds=rounds)


class Bench:
    """One bench's run: the meter, its rows, the document it writes (OUT/<name>.json)."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.quick = bool(args.quick)
        self.rounds = args.rounds or (2 if self.quick else args.default_rounds)
        if self.rounds < 1:
            raise BenchError("--rounds must be at least 1")
        self.out = args.out or Path(tempfile.mkdtemp(prefix=f"llmgw-bench-{name}-out-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.keep_work = args.work is not None
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix=f"llmgw-bench-{name}-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.meter = Meter()
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.install = install_kind()
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.commit = git_commit()  # at the start: the code that ran, whatever changes meanwhile
        self.load_start = load1()
        self._hot_flag: str | None = None
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ.setdefault("LLMGW_STORE_PYTHON_PREFERENCE", "only-system")

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc) -> None:
        self.meter.close()
        if not self.keep_work:
            rmtree(self.work)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", file=sys.stderr)

    def hot_path(self) -> str | None:
        """Call before hot-path rows (hit, activate, rollback, list, info): they measure an
        interpreter start, which an editable install slows (setuptools' finder), flattering every
        ratio to a bare start. Refused outside --quick unless --allow-editable; flagged always."""
        if self.install == "regular":
            return None
        if not (self.quick or self.args.allow_editable):
            raise BenchError(
                f"llmgw-store is installed {self.install} for {PY}: hot-path rows would measure that "
                "install's start, not a node's. Run with a regular install (python3 -m venv reg && reg/bin/pip "
                "install . && reg/bin/python bench/...), or pass --allow-editable to flag the rows instead")
        self._hot_flag = f"{self.install.upper()} INSTALL ({PY}): not a node's start; ratios flattered"
        print(f"WARNING: {self._hot_flag}", file=sys.stderr)
        return self._hot_flag

    def compare(self, row: str, subject: Side, baselines: list[Side], *,
                goal: tuple[str, float] | list[tuple[str, float] | None] | None = None,
                rounds: int | None = None, warmup: bool = True, hot: bool = False, note: str | None = None,
                names: list[str] | None = None, built: str | None = None) -> list[dict]:
        """Alternate `subject` and `baselines` in fresh processes; one row per baseline (named
        `names[i]`, else `row` + ' vs ' + its name). `goal`: one for every row, or a list with one
        (or None) per baseline. `built`: the store path name of the built environment the row
        measures (a row on a real environment says which; tests/repo/test_bench.py checks it)."""
        sides = [subject, *baselines]
        if warmup and not self.quick:  # the page cache and bytecode warm for every side alike
            for s in sides:
                s.run_once(self.meter, -1)
        loads = []
        for i in range(rounds or self.rounds):
            order = sides[i % len(sides):] + sides[:i % len(sides)]
            for s in order:
                loads.append(load1())
                run, extra = s.run_once(self.meter, i)
                s.runs.append(run)
                s.extras.append(extra)
            print(f"  {row}: round {i + 1}: " + ", ".join(f"{s.name} {s.runs[-1].wall_s:.3f}s" for s in sides),
                  file=sys.stderr)
        out = []
        a = _summary(subject)
        for j, b_side in enumerate(baselines):
            b = _summary(b_side)
            g = goal[j] if isinstance(goal, list) else goal
            ratio = _ratio([(x.wall_s, y.wall_s) for x, y in zip(subject.runs, b_side.runs, strict=True)])
            r = {
                "row": names[j] if names else f"{row} vs {b_side.name}",
                "figure": a["wall_s"], "unit": "s", "baseline": b_side.name, "baseline_figure": b["wall_s"],
                "ratio": ratio,
                "ratio_of_medians": round(a["wall_s"] / b["wall_s"], 3) if b["wall_s"] else None,
                "cpu_ratio": _ratio([(x.cpu_s if x.cpu_s is not None else x.cpu_waited_s,
                                      y.cpu_s if y.cpu_s is not None else y.cpu_waited_s)
                                     for x, y in zip(subject.runs, b_side.runs, strict=True)]),
                "goal": _goal_text(g), "goal_met": _goal_met(g, ratio),
                "load": [min(loads), max(loads)], "rounds": len(subject.runs),
                "subject": a, "against": b,
            }
            if hot:
                r["interpreter"] = str(PY)
                r["install"] = self.install
                if self._hot_flag:
                    r["flag"] = self._hot_flag
            if note:
                r["note"] = note
            if built:
                r["built"] = built
            self.rows.append(r)
            out.append(r)
        return out

    def figure(self, row: str, value: float, unit: str, baseline: str, baseline_value: float, *,
               goal: tuple[str, float] | None = None, note: str | None = None, detail: dict | None = None,
               built: str | None = None) -> dict:
        """A row that is not a timing of alternating runs (bytes on disk, bytes fetched): its
        figure against a baseline figure, ratio = value / baseline_value. `built`: as compare's."""
        ratio = round(value / baseline_value, 4) if baseline_value else None
        r = {"row": row, "figure": value, "unit": unit, "baseline": baseline, "baseline_figure": baseline_value,
             "ratio": ratio, "goal": _goal_text(goal), "goal_met": _goal_met(goal, ratio), "load": [load1(), load1()]}
        if note:
            r["note"] = note
        if detail:
            r["detail"] = detail
        if built:
            r["built"] = built
        self.rows.append(r)
        return r

    def document(self) -> dict:
        return {
            "bench": self.name, "schema": SCHEMA, **self.commit, "started": self.started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": self.quick,
            "argv": sys.argv,
            "host": {"cpus": os.cpu_count(), "load_start": self.load_start, "load_end": load1(),
                     "python": str(PY), "python_version": platform.python_version(), "cli": str(CLI),
                     "install": self.install, "launcher": self.meter.launcher,
                     "cpu_accounting": self.meter.cpu_accounting, "work": str(self.work),
                     "work_fs": fs_type(self.work)},
            "rows": self.rows, "notes": self.notes,
        }

    def finish(self) -> Path:
        doc = self.document()
        path = self.out / f"{self.name}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(render_table(doc))
        print(f"results: {path}")
        return path


def _goal_text(goal: tuple[str, float] | None) -> str | None:
    return None if goal is None else f"{goal[0]} {goal[1]:g}"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "s":
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "bytes":
        return f"{value / 2**20:.2f} MiB"
    return f"{value:g} {unit}"


def render_table(doc: dict) -> str:
    """The markdown table a note can quote: one line per row, then where and how it ran."""
    h = doc["host"]
    lines = [f"{doc['bench']} at {(doc.get('commit') or 'unknown')[:12]}{' (dirty)' if doc.get('dirty') else ''}"
             f"{' [quick]' if doc.get('quick') else ''}, {doc['started']}; {h['cpus']} CPUs, load "
             f"{h['load_start']} -> {h['load_end']}; {h['python']} (Python {h['python_version']}, {h['install']} "
             f"install); work on {h['work_fs']}",
             "",
             "| row | figure | baseline | ratio | goal | CPU s | peak RSS MiB | disk MiB | load |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["rows"]:
        goal = r.get("goal") or ""
        if r.get("goal_met") is not None:
            goal += " (met)" if r["goal_met"] else " (NOT met)"
        a, b = r.get("subject"), r.get("against")
        cpu = rss = disk = ""
        if a and b:
            disk = " / ".join(_fmt2(_disk(x) / 2**20, 1) if _disk(x) is not None else "–" for x in (a, b))
            disk = "" if disk == "– / –" else disk
            cpu = f"{_fmt2(a.get('cpu_s') if a.get('cpu_s') is not None else a.get('cpu_waited_s'))} / " \
                  f"{_fmt2(b.get('cpu_s') if b.get('cpu_s') is not None else b.get('cpu_waited_s'))}"
            rss = f"{_fmt2(a.get('rss_mib'), 1)} / {_fmt2(b.get('rss_mib'), 1)}"
        ratio = "–" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        name = _cell(r["row"] + (f" **[{r['flag']}]**" if r.get("flag") else ""))
        lines.append(f"| {name} | {_fmt(r['figure'], r['unit'])} | {_cell(r['baseline'])}: "
                     f"{_fmt(r['baseline_figure'], r['unit'])} | {ratio} | {goal} | {cpu} | {rss} | {disk} | "
                     f"{r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    lines.append("")
    lines.append(f"peak RSS: {h['launcher']}; CPU: {h['cpu_accounting']}")
    for n in doc.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _disk(side: dict) -> float | None:
    """The bytes on disk a side's check kept (du, each inode once), if it kept any."""
    for k in ("disk_env_bytes", "disk_bytes", *sorted(side)):
        if k.startswith("disk") and isinstance(side.get(k), (int, float)):
            return side[k]
    return None


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _fmt2(x: float | None, n: int = 2) -> str:
    return "–" if x is None else f"{x:.{n}f}"
