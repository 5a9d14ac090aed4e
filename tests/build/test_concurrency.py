"""Concurrency and crashes, with real processes: one build per key, and SIGKILL mid-build."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import build_json, cli_cmd, run_cli, run_in_env
from tests.support import procscan
from tests.support.barrier import Barrier
from tests.support.recipes import write_recipe


def outcomes(root: Path) -> list[str]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    return [r[0] for r in con.execute("SELECT outcome FROM builds ORDER BY id")]


def test_four_processes_building_one_key_run_one_build(root, recipe, index, uv_bin, tmp_path):
    # The builder that takes the key's lock is held with its .partial open until the three others
    # are queued behind it: all four meet at the lock.
    gate = Barrier(tmp_path)
    gate.go("LOCK_WAIT")  # open: a waiter only says it is queued
    env = {**os.environ, **gate.env("BUILD_PAUSE", "LOCK_WAIT")}
    cmd = cli_cmd(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    builder = gate.reached("BUILD_PAUSE", procs[0])
    assert builder not in gate.reached_by("LOCK_WAIT", 3, procs)
    gate.go("BUILD_PAUSE")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append((json.loads(out), err))
    paths = {doc["path"] for doc, _ in results}
    assert len(paths) == 1
    hows = sorted(doc["how"] for doc, _ in results)
    assert hows == ["built", "waited", "waited", "waited"]
    assert outcomes(root) == ["built"]
    waiters = [err for doc, err in results if doc["how"] == "waited"]
    assert all("waiting for pid" in err and "building" in err for err in waiters)
    assert run_in_env(Path(paths.pop()), "tinyengine") == "tinyengine 1.0 tinydep 1.0"


def test_different_keys_build_in_parallel(root, recipe, index, uv_bin, tmp_path):
    # Both builders are held inside their builds at once (each holding its own key's lock), then let go.
    gate = Barrier(tmp_path)
    env = {**os.environ, **gate.env("BUILD_PAUSE")}
    base = cli_cmd(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    procs = [subprocess.Popen(base + ["--as-of", d], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for d in ("2024-02-02", "2024-06-02")]
    gate.reached_by("BUILD_PAUSE", 2, procs)
    gate.go("BUILD_PAUSE")
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        docs.append(json.loads(out))
    assert all(d["how"] == "built" for d in docs)
    # The build log shows the two builds running at the same time: each started before the other ended.
    con = sqlite3.connect(root / "var" / "db.sqlite")
    (s1, f1), (s2, f2) = con.execute("SELECT started, finished FROM builds WHERE outcome = 'built'").fetchall()
    assert s1 < f2 and s2 < f1


def test_sigkill_mid_build_leaves_nothing_registered_and_next_build_succeeds(root, recipe, index, uv_bin, tmp_path):
    gate = Barrier(tmp_path)
    cmd = cli_cmd(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    victim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **gate.env("BUILD_PAUSE")})
    gate.reached("BUILD_PAUSE", victim)  # a .partial with a venv exists, nothing is registered
    partials = list((root / "store").glob("*.partial"))
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)

    con = sqlite3.connect(root / "var" / "db.sqlite")
    assert con.execute("SELECT count(*) FROM paths").fetchone()[0] == 0
    assert outcomes(root) == ["running"]
    assert [p.name for p in (root / "store").iterdir() if p.name != ".wheels"] == [partials[0].name]

    doc = build_json(root, recipe, index, uv_bin)
    assert doc["how"] == "built"
    assert outcomes(root) == ["abandoned", "built"]
    # (.links: the pool the build shares its files through; .wheels: the wheel home it links from)
    assert sorted(p.name for p in (root / "store").iterdir()) == [".links", ".wheels", Path(doc["path"]).name]
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinydep 1.0"


def test_lock_timeout_exits_75(root, recipe, index, uv_bin, tmp_path):
    gate = Barrier(tmp_path)
    cmd = cli_cmd(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    holder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **gate.env("BUILD_PAUSE")})
    try:
        gate.reached("BUILD_PAUSE", holder)  # it holds the key's lock until told to go on
        waiter = subprocess.run(cmd + ["--lock-timeout", "1"], capture_output=True, text=True, timeout=60)
        assert waiter.returncode == 75, waiter.stderr
        assert "gave up after 1s waiting for pid" in waiter.stderr
        assert waiter.stderr.count("error:") == 1 and "Traceback" not in waiter.stderr
    finally:
        holder.kill()
        holder.wait(timeout=10)


# Issue 12: a SIGKILLed build must not leave its children (uv, the bytecode compiler and its pool
# workers) running and writing into its .partial. Checked as an operator would: by looking in /proc
# for any live process that still mentions the store root.

ORPHAN_GRACE_S = 5.0


def _uv_installing(root: Path):
    return [p for p in procscan.mentioning(str(root)) if " pip install " in f" {p.cmdline} "]


def _compile_workers(root: Path):
    # ProcessPoolExecutor forks: the compiler and its pool workers share its command line.
    found = [p for p in procscan.mentioning(str(root)) if "bytecode_worker.py" in p.cmdline]
    return found if len(found) >= 2 else None


@pytest.mark.parametrize("phase", ["uv install", "bytecode compile"])
def test_sigkill_during_a_child_leaves_no_process_behind(root, recipe, index, uv_bin, phase, tmp_path):
    env = dict(os.environ)
    gate = Barrier(tmp_path)
    if phase == "uv install":
        # Once resolved (the lock file is written), every wheel download takes 20 s: uv sits in `pip install`.
        index.slow(20, when=lambda: any((root / "store").glob("*.partial/.llmgw/requirements.lock")))
        caught = lambda: _uv_installing(root)  # noqa: E731
    else:
        env.update(gate.env("COMPILE_PAUSE"))  # each compile worker is held before its first file
        caught = lambda: gate.pids("COMPILE_PAUSE") and _compile_workers(root)  # noqa: E731
    cmd = cli_cmd(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    victim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        children = procscan.wait_for(caught, 90, f"the build to reach {phase}")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    assert children
    left = procscan.gone_within(str(root), ORPHAN_GRACE_S)
    procscan.kill_all(left)
    assert not left, "left running after SIGKILL of the build:\n" + "\n".join(map(str, left))


# Where a killed build can stand: a random moment of its run, or held at one of its debug points
# (with its venv made; inside a compile worker, a child of the build; while hashing the frozen tree).
KILL_POINTS = (None, "BUILD_PAUSE", "COMPILE_PAUSE", "HASH_PAUSE")


def test_twenty_builds_killed_at_random_points_leave_nothing_and_rebuild(root, recipe, index, uv_bin, tmp_path):
    """SIGKILL a build 20 times (a different key each time, one root, so the uv and pyc caches are
    shared as on a real host), each time at a random moment of its run or held at a random one of
    its debug points, and start the same build again at once: within half a second nothing of the
    killed build may still run, and the rebuild must succeed. The points make sure the kills land
    inside a child and inside each phase, as they do for a real engine, whose compile is most of
    its build; the random moments cover what lies between them."""
    seed = int(os.environ.get("LLMGW_STORE_TEST_SEED") or time.time_ns() % 10**6)
    rng = random.Random(seed)
    cmd = cli_cmd(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    started = time.monotonic()
    build_json(root, recipe, index, uv_bin, "--as-of", "2024-03-01")  # the interpreter etc. memoised
    calibrate = time.monotonic()
    build_json(root, recipe, index, uv_bin, "--as-of", "2024-03-02")
    run_time = time.monotonic() - calibrate
    report = []
    for i in range(20):
        as_of = f"2024-02-{i + 2:02d}"
        point = KILL_POINTS[i % len(KILL_POINTS)] if i < len(KILL_POINTS) else rng.choice(KILL_POINTS)
        delay = rng.uniform(0, run_time)
        gate = Barrier(tmp_path / f"kill-{i}")
        where = f"seed {seed}, iteration {i} (killed " + (f"at {point})" if point else f"after {delay:.2f}s of {run_time:.2f}s)")
        victim = subprocess.Popen(cmd + ["--as-of", as_of], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, **(gate.env(point) if point else {})})
        if point:
            gate.reached(point, victim)
        else:
            time.sleep(delay)  # the random moment itself: any outcome but "nothing left, rebuilt" fails
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        rebuild = subprocess.Popen(cmd + ["--as-of", as_of], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        left = procscan.gone_within(str(root), 0.5, but=rebuild.pid)
        out, err = rebuild.communicate(timeout=120)
        procscan.kill_all(left)
        assert not left, f"{where}: left running:\n" + "\n".join(map(str, left))
        assert rebuild.returncode == 0, f"{where}: the rebuild failed: {err}"
        doc = json.loads(out)
        report.append(f"{point or f'{delay:.2f}s'}:{doc['how']}")
        assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinydep 1.0"
        assert procscan.gone_within(str(root), ORPHAN_GRACE_S) == []
    print(f"seed {seed}, one build {run_time:.2f}s, 20/20 rebuilt in {time.monotonic() - started:.0f}s: "
          + " ".join(report))


def test_a_child_that_left_its_group_dies_with_the_build(root, tmp_path, index, uv_bin):
    """A grandchild that calls setsid leaves the group its keeper kills; the keeper is a child
    subreaper, so the escaped process is still its descendant and is killed with the rest when the
    build is SIGKILLed (before: only the next build of the key found it, by its token)."""
    flag = tmp_path / "escape"
    recipe = write_recipe(tmp_path, 'version = "1.0"', "escaping.toml",
                          verify=["sh", "-c", f"if [ -e {flag} ]; then setsid sleep 300 & sleep 300; fi"])
    flag.touch()
    cmd = cli_cmd(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    victim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sleeps = lambda: [p for p in procscan.mentioning(str(root)) if p.cmdline.startswith("sleep 300")]  # noqa: E731
    try:
        procscan.wait_for(lambda: len(sleeps()) == 2, 90, "verify to start its two sleeps")
        assert any(os.getsid(p.pid) == p.pid for p in sleeps())  # one is in a session of its own
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    flag.unlink()
    try:
        procscan.wait_for(lambda: sleeps() == [], 10, "the keeper to kill its group and what left it")
        proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
        assert proc.returncode == 0, proc.stderr
        assert procscan.mentioning(str(root)) == []
    finally:
        procscan.kill_all(sleeps())
