"""Containing each child the store starts (a build's uv and compiler, an activation's check) in a
cgroup v2 of its own, so that killing it and everything it started is one atomic operation.

Which containment a node gets (`containment()`, shown by `llmgw-store doctor`):

    systemd-scope   systemd manages the cgroup hierarchy (/run/systemd/system exists) and the
                    store runs as root with systemd-run: the keeper is started by
                    `systemd-run --scope`, in a transient scope unit of its own; the scope's
                    cgroup is killed through its `cgroup.kill` when the child is done.
    cgroup          no systemd, and the store may write the cgroup v2 hierarchy (root on this
                    kind of host: a container, a node without systemd): a child cgroup
                    `llmgw-store-<pid>-<random>` is made below the store's own cgroup, the keeper
                    moves itself into it before it starts the command, and `cgroup.kill` ends it.
    subreaper       neither works (no cgroup v2, no cgroup.kill — Linux < 5.14 —, not root): the
                    keeper's own fallback, a child subreaper that walks /proc for its descendants
                    and kills them, then its process group. A descendant that keeps changing pid
                    faster than the walk can escape it; the cgroup kinds close that.

`LLMGW_STORE_CONTAINMENT=auto|systemd-scope|cgroup|subreaper` chooses (auto: the first that works,
in that order); a kind that is asked for but does not work here falls back the same way, saying so
once. Invariants:
- The keeper joins its cgroup before it forks the command, so nothing the command starts is ever
  outside it; `cgroup.kill` kills every process of the cgroup and makes forks into it fail, so a
  pid-hopping descendant cannot outrun it.
- `Scope.kill` returns only once the cgroup holds no live process (bounded by KILL_WAIT_S), then
  removes it: when `procs.run` returns, nothing it started runs.
- A cgroup left by a store that was SIGKILLed (its keeper killed the cgroup's processes when its
  socket closed; only the empty directory remains) is removed by the next store process that
  makes one, once it is older than STALE_S (a younger one may be another store's, not yet joined).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from llmgw_store.base import defaults
from llmgw_store.supervise.keeper import own_cgroup

ENV = "LLMGW_STORE_CONTAINMENT"
CHOSEN_ENV = "_LLMGW_STORE_CONTAINMENT"  # the CLI's effective `containment` setting (flag > ENV > config file)
KINDS = defaults.CONTAINMENTS
PREFIX = "llmgw-store-"
KILL_WAIT_S = 5.0
STALE_S = 60.0
POLL_S = 0.002

_chosen: tuple[str, str] | None = None  # (kind, what it is / why), decided once per process
_swept = False


@dataclass
class Scope:
    """One child's cgroup: where it is (known at once for `cgroup`; for `systemd-scope` read from
    the keeper's /proc entry while it runs), what to put before the keeper's argv, and the
    argument that tells the keeper which cgroup to join."""

    kind: str
    path: str | None
    prefix: list[str] = field(default_factory=list)
    keeper_arg: str = ""

    def locate(self, pid: int) -> None:
        """systemd-scope: the scope's cgroup, read from the keeper's /proc entry (it runs in it)."""
        if self.path is not None:
            return
        try:
            with open(f"/proc/{pid}/cgroup", "rb") as f:
                rel = next((ln[3:].strip() for ln in f.read().split(b"\n") if ln.startswith(b"0::")), None)
        except OSError:
            return
        mount = _mount()
        if rel and mount and PREFIX.encode() in rel:
            self.path = mount + rel.decode()

    def kill(self) -> bool:
        """SIGKILL whatever is left in the cgroup, wait (bounded) until it holds no live process,
        remove it (a `cgroup` one: systemd collects its scopes); whether it is empty."""
        if self.path is None:
            return True
        if _populated(self.path):  # usually not: the keeper killed it all before it died
            _write(f"{self.path}/cgroup.kill", b"1")
        deadline = time.monotonic() + KILL_WAIT_S
        while _populated(self.path):
            if time.monotonic() >= deadline:
                return False  # stuck in the kernel (D state) with SIGKILL pending: left for a sweep
            time.sleep(POLL_S)
        if self.kind == "cgroup":
            try:
                os.rmdir(self.path)
            except OSError:
                pass
        return True


def _mount() -> str | None:
    """The cgroup2 mount point (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for ln in f.read().split(b"\n"):
                parts = ln.split(b" - ", 1)
                if len(parts) == 2 and parts[1].split(b" ", 1)[0] == b"cgroup2":
                    return parts[0].split(b" ")[4].decode()
    except OSError:
        pass
    return None


def _write(path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, data)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _populated(path: str) -> bool:
    try:
        with open(f"{path}/cgroup.events", "rb") as f:
            return b"populated 1" in f.read()
    except OSError:
        return False  # gone


def _new_cgroup(base: str) -> str | None:
    """A fresh child cgroup below `base` with a `cgroup.kill`, or None."""
    path = f"{base}/{PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.mkdir(path, 0o755)
    except OSError:
        return None
    if not os.path.exists(f"{path}/cgroup.kill"):
        os.rmdir(path)
        return None
    return path


def _sweep(base: str) -> None:
    """Remove empty cgroups of ours older than STALE_S (left by a store that was SIGKILLed)."""
    global _swept
    if _swept:
        return
    _swept = True
    now = time.time()
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for e in entries[:1000]:
        try:
            if now - e.stat(follow_symlinks=False).st_mtime > STALE_S and not _populated(e.path):
                os.rmdir(e.path)
        except OSError:
            pass  # populated (EBUSY) or gone


def _systemd_ok() -> str | None:
    """Why the systemd-scope kind is not usable here, or None when it is."""
    import shutil
    import subprocess

    if not os.path.isdir("/run/systemd/system"):
        return "systemd does not manage this host's cgroups"
    if os.geteuid() != 0:
        return "not root (the system manager's scopes are root's)"
    exe = shutil.which("systemd-run")
    if exe is None:
        return "no systemd-run"
    try:
        probe = subprocess.run([exe, "--scope", "--quiet", "--collect", "true"], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemd-run failed ({exc})"
    return None if probe.returncode == 0 else "systemd-run --scope failed"


def choose(kind: str) -> tuple[str, str]:
    """Decide this process's containment now, as `kind` asks (one of KINDS; the library's form of
    $LLMGW_STORE_CONTAINMENT, which a config file's `containment` key can feed); what it got."""
    global _chosen
    if kind not in KINDS:
        from llmgw_store.base.errors import UsageError

        raise UsageError(f"containment {kind[:40]!r}: use one of {', '.join(KINDS)}")
    _chosen = None
    return containment(kind)


def containment(asked: str | None = None) -> tuple[str, str]:
    """(kind, what: the cgroup below which children go, or why the fallback) for this process."""
    global _chosen
    if _chosen is not None:
        return _chosen
    asked = asked or os.environ.get(CHOSEN_ENV) or os.environ.get(ENV, "auto").strip() or "auto"
    if asked not in KINDS:
        asked = "auto"
    notes = []
    if asked in ("auto", "systemd-scope"):
        why = _systemd_ok()
        if why is None:
            _chosen = ("systemd-scope", "a transient scope unit per child (systemd-run --scope)")
            return _chosen
        notes.append(f"systemd-scope: {why}")
    if asked in ("auto", "systemd-scope", "cgroup"):
        base = own_cgroup()
        probe = _new_cgroup(base) if base is not None else None
        if probe is not None:
            os.rmdir(probe)
            _chosen = ("cgroup", base)
            return _chosen
        notes.append("cgroup: " + ("no cgroup v2 hierarchy" if base is None
                                   else f"cannot make a child cgroup with cgroup.kill below {base}"))
    _chosen = ("subreaper", "; ".join(notes) or "asked for")
    return _chosen


def new_scope() -> Scope | None:
    """The containment for one child about to start, or None (the keeper's subreaper walk)."""
    kind, where = containment()
    if kind == "cgroup":
        _sweep(where)
        path = _new_cgroup(where)
        return Scope("cgroup", path, keeper_arg=path) if path is not None else None
    if kind == "systemd-scope":
        import shutil

        unit = f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}.scope"
        return Scope("systemd-scope", None, [shutil.which("systemd-run") or "systemd-run", "--scope", "--quiet",
                                             "--collect", f"--unit={unit}", "--"], keeper_arg="self")
    return None
