"""Every child the store starts is contained (supervise/cgroups.py): a cgroup v2 of its own where the
node gives one, killed with `cgroup.kill`; the keeper's subreaper walk otherwise. A check that
leaves its process group with setsid and keeps changing pid (fork, parent exits, repeat) escaped
the walk (2 runs of 3) and ran on as root after `activate` returned: with the cgroup it is gone the
moment the command returns, every time. Run many times: the race is the point."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from llmgw_store.supervise import cgroups, procs
from tests.conftest import build_store, run_cli

HOPPER = textwrap.dedent("""
    import os, sys, time
    stop = time.monotonic() + 60    # a safety net for the node if containment ever failed
    os.setsid()                     # out of the check's process group, into one of its own
    if os.fork():
        os._exit(0)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpgid(0)))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])  # running (and its group): the check may end now
    while time.monotonic() < stop:  # never the same pid for long
        if os.fork():
            os._exit(0)
""")
SCANS = 200  # /proc passes to look for a live member of the hopper's group


def cgroup_here() -> bool:
    kind, _ = cgroups.containment()
    return kind in ("cgroup", "systemd-scope")


needs_cgroup = pytest.mark.skipif(not cgroup_here(), reason="no cgroup v2 the store may write here (needs root)")


def live_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, in one pass over /proc/*/stat."""
    found = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(e))
    return found


def escaped(pgid: int) -> list[int]:
    """Members of the hopper's group seen alive in any of SCANS passes: a process that keeps
    changing pid can be missed by one pass over /proc, not by all of them."""
    for _ in range(SCANS):
        alive = live_members(pgid)
        if alive:
            return alive
    return []


def kill_group(pgid: int) -> None:
    """A group kill is atomic in the kernel (forks wait for it): one that works ends every hopper."""
    for _ in range(100):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except OSError:
            return


@pytest.fixture
def hopper(tmp_path):
    script = tmp_path / "hopper.py"
    script.write_text(HOPPER)
    started = tmp_path / "started"
    yield script, started
    if started.exists():
        kill_group(int(started.read_text()))  # after a failure: nothing left running on the node


def hop(script: Path, started: Path) -> str:
    """Shell text: start the hopper, wait until it runs, exit 0."""
    return f"{sys.executable} {script} {started} & while [ ! -e {started} ]; do :; done; exit 0"


# A race is caught by repeating it: 20 attempts in the suite, the first QUICK of them in the quick
# loop (the others are `system`).
QUICK = 2
ATTEMPTS = [pytest.param(n, marks=pytest.mark.system if n >= QUICK else ()) for n in range(20)]


@needs_cgroup
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_pid_hopping_child_is_gone_when_run_returns(hopper, attempt):
    script, started = hopper
    done = procs.run(["sh", "-c", hop(script, started)], env=dict(os.environ), timeout=60)
    assert done.returncode == 0 and started.exists(), done.output
    assert escaped(int(started.read_text())) == []


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("contain"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@needs_cgroup
@pytest.mark.parametrize("attempt", range(20))
def test_a_pid_hopping_check_is_gone_the_moment_activate_returns(built, hopper, attempt):
    script, started = hopper
    proc = run_cli(built["root"], "--json", "activate", f"hop{attempt}", built["paths"][0], "--check",
                   f"sh -c '{hop(script, started)}'")
    assert started.exists(), proc.stderr
    assert escaped(int(started.read_text())) == []  # looked for first: the moment the command returned
    assert proc.returncode == 0 and json.loads(proc.stdout)["check"]["result"] == "passed", proc.stderr


@needs_cgroup
def test_each_child_has_its_own_cgroup_and_it_is_removed(tmp_path):
    kind, base = cgroups.containment()
    if kind != "cgroup":
        pytest.skip("a systemd scope is collected by systemd")
    out = procs.run(["sh", "-c", "cat /proc/self/cgroup"], env=dict(os.environ), timeout=30).output
    rel = next(ln[3:] for ln in out.splitlines() if ln.startswith("0::"))
    assert cgroups.PREFIX in rel and f"-{os.getpid()}-" in rel
    mount = cgroups._mount()
    assert not os.path.exists(mount + rel)  # removed once the child was done


def test_the_subreaper_fallback_still_kills_a_setsid_child(tmp_path, monkeypatch):
    """Where no cgroup can be made (forced here), the keeper's walk is what there is: a plain
    setsid escapee (one that stays one process) still dies with the command."""
    monkeypatch.setattr(cgroups, "_chosen", ("subreaper", "forced by the test"))
    pid = tmp_path / "pid"
    done = procs.run(["sh", "-c", f"setsid sleep 300 & echo $! > {pid}; exit 0"], env=dict(os.environ), timeout=30)
    assert done.returncode == 0
    try:
        assert not os.path.exists(f"/proc/{int(pid.read_text())}") or \
            open(f"/proc/{int(pid.read_text())}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    finally:
        try:
            os.kill(int(pid.read_text()), signal.SIGKILL)
        except OSError:
            pass


def test_doctor_says_which_containment_the_node_gets(built):
    proc = run_cli(built["root"], "--json", "doctor")
    doc = json.loads(proc.stdout)
    assert doc["containment"]["kind"] in ("systemd-scope", "cgroup", "subreaper") and doc["containment"]["detail"]
    text = run_cli(built["root"], "doctor").stdout
    assert f"children contained by: {doc['containment']['kind']}" in text


def test_containment_is_chosen_by_name_and_a_bad_name_is_a_usage_error(monkeypatch):
    from llmgw_store.base.errors import UsageError

    monkeypatch.setattr(cgroups, "_chosen", None)
    assert cgroups.choose("subreaper")[0] == "subreaper"
    with pytest.raises(UsageError):
        cgroups.choose("docker")
    monkeypatch.setattr(cgroups, "_chosen", None)
