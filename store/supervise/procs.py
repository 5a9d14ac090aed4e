"""The one way the store starts children, and how it makes sure none outlives the build that
started it (issue 12: a SIGKILLed build left uv and the bytecode compiler writing into its `.partial`).

    store process ──socketpair──▶ keeper  (own session and process group; pgid = keeper's pid)
                                    └─▶ the command  (PR_SET_PDEATHSIG(SIGKILL), bound to the keeper)
                                          └─▶ its children (uv's, the compile pool's workers) …

`run` starts a *keeper*: a small program (supervise/keeper.py, run as a script by this interpreter
with -I -S and the command's environment; it imports only C modules, so it costs an interpreter
start per child) in a new session, so it leads a process group of its own, which the command and
everything the command starts inherit — and, where the node allows one, in a cgroup v2 of its own
(supervise/cgroups.py: a child cgroup, or a systemd scope), which the keeper joins before it starts the
command. The keeper forks and execs the command and waits. The store holds the other end of a
socketpair; the keeper acts on its end:
- the command exits: the keeper writes its exit status on the socket and keeps waiting;
- the socket reaches EOF: the keeper kills everything it started, itself included — its cgroup at
  once through `cgroup.kill`, else its descendants and its process group (below).
EOF comes when the store closes its end — `run` does so on every way out: the command finished,
the timeout, an exception, KeyboardInterrupt — and also when the store process dies in any way,
SIGKILL included, because the kernel closes a dead process's descriptors. So every child, and
every grandchild that stayed in the group, is killed within milliseconds of the store's end.

Why this design, against the alternatives:
- `preexec_fn` (prctl through ctypes in the child) is not safe in a process with threads: the
  forked child runs Python code and may deadlock on a lock another thread held at fork time — and
  the store hashes a tree in a thread while verify runs. `run` passes no preexec_fn: Popen uses
  `start_new_session` and `pass_fds`, which it handles in C, thread-safely. The keeper is
  single-threaded, so its fork → prctl → exec is safe.
- PR_SET_PDEATHSIG alone fires when the parent *thread* that forked exits, not the process; it
  reaches only the direct child (not uv's children, not the compile pool's workers); and it is
  lost between fork and prctl if the parent dies in that gap. The keeper's socket is per process,
  so no thread's end matters; the kill is per group, so grandchildren die too; and a store that
  died before the keeper even started leaves a socket already at EOF. PDEATHSIG is still set on
  the command, bound to the keeper (whose only thread lives as long as it does, and which checks
  getppid() after prctl to close the gap), so the command dies if the keeper alone is killed.
- os.posix_spawn cannot run prctl at all.
`run` itself is synchronous: the thread that calls it waits until the keeper is reaped, so the
spawning thread always outlives the child.

Which signal, which group, and why it cannot hit an unrelated process:
- Always SIGKILL; nothing is asked to clean up, since what it would clean is a `.partial` the
  next build of the key removes anyway.
- The keeper signals its own group (killpg(0)). The store signals a keeper's group (pgid = the
  keeper's pid) only while that keeper is its own unreaped child — alive or a zombie — and a pid
  that is still held by a process or zombie is never handed out again, so that group cannot be
  someone else's.
- What escapes the group (a child calling setsid) is still the keeper's descendant: the keeper is
  a child subreaper (PR_SET_CHILD_SUBREAPER), so an orphan below it is reparented to it, never to
  init. Before its group kill the keeper walks /proc/*/stat for every live process whose parent
  chain reaches it and SIGKILLs them, reaping and walking again until none is left (bounded: 5 s).
  A descendant killed there has its pid held by a zombie of ours or its parent's until reaped. A
  descendant that keeps changing pid (fork, parent exits, repeat) can outrun that walk; and a
  process that escaped while the keeper itself was SIGKILLed is out of its reach: hence the
  cgroup where the node gives one — `cgroup.kill` kills every member at once, and `run` returns
  only once the cgroup is empty (`Scope.kill`), so nothing it started outlives it. Where no
  cgroup can be made the walk is what there is, and `reap` below is the backstop for builds.

Recording (`recording`, `reap`): while a build holds its key's lock, `recording(path)` writes
`path` (ROOT/var/locks/<key>.pgids): a random token, and one line per child started (its pgid) and
ended. Every child of the build runs with LLMGW_STORE_BUILD=<token> in its environment, which its
own children inherit. A build that takes the lock and finds such a file knows its holder died
without ending its record; `reap(path)` then SIGKILLs every process that still carries that token
— in a recorded group or not — and removes the file. It never kills a process by pgid or pid
number alone: a process is killed only if /proc/<pid>/environ holds the exact token, read after
a pidfd has pinned the process, and the signal goes through that pidfd. A recycled pid or pgid
belongs to a process without the token (the token is 128 random bits, made for one build), and a
pidfd whose process died signals nothing. Normally the keepers have already done the work and
`reap` finds nothing; it is the backstop for children that left their group, and for a keeper
killed together with the store (a keeper killed alone is seen by `run`, which kills its group).

Everything is bounded: waiting for a group to die takes at most KILL_WAIT_S.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmgw_store.base import report
from llmgw_store.supervise import cgroups

TOKEN_VAR = "LLMGW_STORE_BUILD"
KILL_WAIT_S = 5.0

# The keeper is a real module run as a script with -I -S (supervise/keeper.py): argv <socket fd>
# <cgroup to join> <executable> <argv0> <args…>. It imports no module of the store.
KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keeper.py")


@dataclass(frozen=True)
class Finished:
    """How a command ended: `returncode` as subprocess gives it (negative: killed by that signal),
    its stdout and stderr together, and whether `run` killed it for running past its timeout."""

    returncode: int
    output: str
    timed_out: bool = False


def run(argv: Sequence[str | os.PathLike], *, env: dict[str, str], cwd: str | os.PathLike | None = None,
        timeout: float | None = None, label: str | None = None) -> Finished:
    """Run `argv` under a keeper (see the module docstring) with `env` (plus the build token while
    a `recording` is active), stdin from /dev/null, stdout and stderr into one temporary file.
    Returns once the command has ended or timed out and its whole process group is dead, whatever
    happens meanwhile (an exception, KeyboardInterrupt: the group is killed, then it propagates).
    Raises FileNotFoundError or PermissionError, as subprocess does, when argv[0] cannot be found
    or executed. While the command runs longer than a second, progress reports `label` (default:
    the command's name) every second with the last line it printed (`Heartbeat`)."""
    import socket
    import subprocess
    import sys
    import tempfile

    args = [os.fsdecode(a) for a in argv]
    exe = _executable(args[0], env, cwd)
    env = dict(env)
    record = _active()
    if record is not None:
        env[TOKEN_VAR] = record.token
    ours, theirs = socket.socketpair()  # both close-on-exec: only the keeper gets `theirs`
    scope = cgroups.new_scope()  # this child's cgroup, if the node gives one (supervise/cgroups.py)
    with ours, tempfile.TemporaryFile() as out:
        try:
            keeper = subprocess.Popen(
                [*(scope.prefix if scope else ()), sys.executable, "-I", "-S", KEEPER, str(theirs.fileno()),
                 scope.keeper_arg if scope else "", exe, *args],
                env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            if scope is not None:
                scope.kill()
            raise
        finally:
            theirs.close()
        try:
            if record is not None:
                record.note("child", keeper.pid)
            step = label or os.path.basename(exe)
            with report.heartbeat(step, tail=Heartbeat(out.fileno(), step)):
                code, timed_out = _status(ours, timeout)
        finally:
            if scope is not None:
                scope.locate(keeper.pid)  # a systemd scope: found while the keeper still runs in it
            ours.close()  # EOF: the keeper kills its cgroup (or its descendants and group), itself included
            _bury(keeper)
            if scope is not None:
                # Whatever is left in the cgroup (the keeper killed alone, a fork racing its kill):
                # killed, waited for and removed, so nothing started here outlives this call.
                scope.kill()
            if record is not None:
                record.note("ended", keeper.pid)
        out.seek(0)
        output = _text(out.read())
    if code is None:
        code = keeper.returncode  # killed for the timeout, or the keeper died before the command
    return Finished(code, output, timed_out)


class Heartbeat:
    """What a running child has printed since the last beat, read from its output file (by pread,
    which leaves the child's file offset alone). A line `llmgw-progress: total N UNIT` or
    `llmgw-progress: +N` (a child that counts its work: the bytecode compiler) becomes a progress
    update of `step`; otherwise the last line printed is the heartbeat's detail. The child's output
    is not trusted: at most READ_MAX new bytes are read per beat, lines are matched in full against
    bounded patterns, and the detail (the unfinished last line, else the last line) is cut short
    (the renderer escapes control characters)."""

    READ_MAX = 1 << 20
    DETAIL_MAX = 120
    _LINE = re.compile(rb"llmgw-progress: (?:\+([0-9]{1,9})|total ([0-9]{1,12}) ([a-z]{1,16}))")

    def __init__(self, fd: int, step: str) -> None:
        self.fd, self.step, self.offset, self.started = fd, step, 0, time.monotonic()
        self.done, self.unit, self.counted = 0, "", False
        self.total: int | None = None
        self.last = self.shown = b""

    def __call__(self) -> str | None:
        size = os.fstat(self.fd).st_size
        if size - self.offset > self.READ_MAX:
            self.offset = size - self.READ_MAX  # a flood: counts in what is skipped are lost
        data = self.last + os.pread(self.fd, max(0, size - self.offset), self.offset)
        self.offset = max(self.offset, size)
        lines = data.replace(b"\r", b"\n").split(b"\n")
        self.last = lines.pop()[-4096:]  # an unfinished line, completed at the next beat
        for line in lines:
            m = self._LINE.fullmatch(line.strip())
            if m is None:
                if line.strip():
                    self.shown = line.strip()[:4096]
                continue
            self.counted = True
            if m.group(1) is not None:
                self.done += int(m.group(1))
            else:
                self.total, self.unit = int(m.group(2)), m.group(3).decode()
        if self.counted:
            report.progress(self.step, self.done, self.total, self.unit, since=self.started)
            return None
        text = (self.last.strip() or self.shown).decode("utf-8", "replace")
        return text[: self.DETAIL_MAX] if text else ""


def _executable(name: str, env: dict[str, str], cwd) -> str:
    """The file `name` runs, found as subprocess finds it (a name with a slash is a path, relative
    to `cwd`; a bare name is looked up on env's PATH)."""
    import errno

    if os.sep in name:
        path = os.path.join(os.fspath(cwd), name) if cwd is not None else name
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
        return os.path.abspath(path)
    for d in os.get_exec_path(env):
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _status(sock, timeout: float | None) -> tuple[int | None, bool]:
    """(exit code, False) once the keeper reports the command's end; (None, True) at the timeout;
    (None, False) if the keeper died without reporting."""
    deadline = None if timeout is None else time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True
            sock.settimeout(left)
        try:
            chunk = sock.recv(64)
        except TimeoutError:
            return None, True
        if not chunk:
            return None, False
        buf += chunk
    return int(buf), False


def _bury(keeper) -> None:
    """Wait (boundedly) for the keeper to die, then SIGKILL its group once more — while the keeper
    is an unreaped child of ours, so its pid, which is the pgid, cannot have been given to anyone
    else — and reap it."""
    if not _exited(keeper.pid, KILL_WAIT_S):
        _killpg(keeper.pid)  # the keeper did not kill its group: do it from here
        _exited(keeper.pid, KILL_WAIT_S)
    _killpg(keeper.pid)  # anything that joined the group while the keeper was dying
    try:
        keeper.wait(timeout=KILL_WAIT_S)
    except Exception:  # stuck in the kernel (D state) with SIGKILL pending; Popen reaps it later
        pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int, timeout: float) -> bool:
    """Whether child `pid` has exited (it is left unreaped), waiting at most `timeout` seconds."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            return bool(select.select([fd], [], [], timeout)[0])
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _text(data: bytes) -> str:
    """Bytes as `subprocess.run(text=True, errors="replace")` would give them."""
    import locale

    text = data.decode(locale.getpreferredencoding(False), errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


# -- recording the children of the build that holds a lock, and killing what a dead one left --


class _Record:
    def __init__(self, path: Path, token: str) -> None:
        self.path, self.token = path, token

    def note(self, what: str, pgid: int) -> None:
        with _lock, open(self.path, "a") as f:
            f.write(json.dumps({what: pgid}) + "\n")


_lock = threading.Lock()
_records: list[_Record] = []


def _active() -> _Record | None:
    with _lock:
        return _records[-1] if _records else None


@contextmanager
def recording(path: Path) -> Iterator[str]:
    """Until the block ends, give every child `run` starts (from any thread of this process) the
    environment variable LLMGW_STORE_BUILD=<a new random token>, and note its pgid in `path` when
    it starts and when it has ended; yields the token. Call it holding the lock that `path` sits
    beside, after `reap(path)`. The file is removed when the block ends, however it ends (`run`
    returns only once a child's group is dead), so a file found by the next holder of the lock was
    left by a process that died holding it."""
    token = secrets.token_hex(16)
    # The first line in one write(2) of < 100 bytes to a new file in the lock's private directory:
    # a crash leaves it whole or the file empty (no token: `reap` kills nothing, removes the file).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (json.dumps({"token": token, "pid": os.getpid(), "since": time.time()}) + "\n").encode())
    finally:
        os.close(fd)
    record = _Record(path, token)
    with _lock:
        _records.append(record)
    try:
        yield token
    finally:
        with _lock:
            _records.remove(record)
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Reaped:
    """What `reap` did: the pgids the dead holder had recorded as running, the pids it killed, and
    the pids still alive at its deadline (SIGKILLed, but stuck in the kernel)."""

    groups: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    left: tuple[int, ...] = ()


def reap(path: Path, wait: float = KILL_WAIT_S) -> Reaped:
    """SIGKILL whatever still runs of the children recorded in `path` by a holder of its lock that
    died, then remove `path`; waits at most `wait` seconds for them to go. A process is killed only
    if its environment holds that holder's token (see the module docstring); any process left in
    a recorded group carries it unless it replaced its whole environment — and the recorded
    groups' keepers kill those groups themselves as soon as the holder dies."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return Reaped()
    token, running = None, []
    for n, line in enumerate(lines):
        try:
            doc = json.loads(line)
            if n == 0:
                token = doc["token"]
            elif "child" in doc:
                running.append(int(doc["child"]))
            elif "ended" in doc and int(doc["ended"]) in running:
                running.remove(int(doc["ended"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the crash
    killed: set[int] = set()
    left: list[int] = []
    if isinstance(token, str) and len(token) == 32 and all(c in "0123456789abcdef" for c in token):
        item = f"{TOKEN_VAR}={token}".encode()
        deadline = time.monotonic() + wait
        while True:
            left = _carriers(item)
            if not left or time.monotonic() >= deadline:
                break
            killed.update(pid for pid in left if _kill_carrier(pid, item))
            time.sleep(0.02)
    path.unlink(missing_ok=True)
    return Reaped(tuple(running), tuple(sorted(killed)), tuple(left))


def _carries(pid: int, item: bytes) -> bool:
    """Whether process `pid`'s environment holds exactly `item` (NAME=value). A zombie, a process
    that is gone, or one we may not read (another user's, when not root) does not."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return item in f.read().split(b"\0")
    except OSError:
        return False


def _carriers(item: bytes) -> list[int]:
    me = os.getpid()
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me and _carries(int(e), item)]


def _kill_carrier(pid: int, item: bytes) -> bool:
    """SIGKILL `pid` if it carries `item`. The process is pinned by a pidfd before its environment
    is read and signalled through the pidfd: if `pid` died and its number went to another process
    meanwhile, the signal reaches nobody (ESRCH) instead of the newcomer."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None  # Linux < 5.3: a plain kill right after the check
    try:
        if not _carries(pid, item):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
