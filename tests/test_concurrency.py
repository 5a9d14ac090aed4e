"""Concurrency and crashes, with real processes: one build per key, and SIGKILL mid-build."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from tests.conftest import build_json, cli_cmd, run_in_env


def wait_for_partial(root: Path, timeout: float = 60) -> list[Path]:
    """The .partial directories once one holds a venv (the build reached its debug pause)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        partials = list((root / "store").glob("*.partial")) if (root / "store").exists() else []
        if any((p / "bin" / "python").exists() for p in partials):
            return partials
        time.sleep(0.05)
    raise AssertionError("the build never reached its pause")


def outcomes(root: Path) -> list[str]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    return [r[0] for r in con.execute("SELECT outcome FROM builds ORDER BY id")]


def test_four_processes_building_one_key_run_one_build(root, recipe, index, uv_bin):
    # Each builder pauses 2 s with its .partial open, so all four meet at the lock.
    env = {**os.environ, "LLMGW_STORE_DEBUG_BUILD_PAUSE": "2"}
    cmd = cli_cmd(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
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


def test_different_keys_build_in_parallel(root, recipe, index, uv_bin):
    env = {**os.environ, "LLMGW_STORE_DEBUG_BUILD_PAUSE": "3"}
    base = cli_cmd(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    procs = [subprocess.Popen(base + ["--as-of", d], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for d in ("2024-02-02", "2024-06-02")]
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


def test_sigkill_mid_build_leaves_nothing_registered_and_next_build_succeeds(root, recipe, index, uv_bin):
    env = {**os.environ, "LLMGW_STORE_DEBUG_BUILD_PAUSE": "60"}
    cmd = cli_cmd(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    victim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    partials = wait_for_partial(root)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)

    con = sqlite3.connect(root / "var" / "db.sqlite")
    assert con.execute("SELECT count(*) FROM paths").fetchone()[0] == 0
    assert outcomes(root) == ["running"]
    assert [p.name for p in (root / "store").iterdir()] == [partials[0].name]

    doc = build_json(root, recipe, index, uv_bin)
    assert doc["how"] == "built"
    assert outcomes(root) == ["abandoned", "built"]
    assert sorted(p.name for p in (root / "store").iterdir()) == [Path(doc["path"]).name]
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinydep 1.0"


def test_lock_timeout_exits_75(root, recipe, index, uv_bin):
    env = {**os.environ, "LLMGW_STORE_DEBUG_BUILD_PAUSE": "30"}
    cmd = cli_cmd(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    holder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for_partial(root)
        waiter = subprocess.run(cmd + ["--lock-timeout", "1"], capture_output=True, text=True, timeout=60)
        assert waiter.returncode == 75, waiter.stderr
        assert "gave up after 1s waiting for pid" in waiter.stderr
        assert waiter.stderr.count("error:") == 1 and "Traceback" not in waiter.stderr
    finally:
        holder.kill()
        holder.wait(timeout=10)
