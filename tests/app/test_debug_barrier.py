"""The debug points race tests hold processes at (store/app/debug.py, tests/support/barrier.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.barrier import Barrier

HOLD = "from llmgw_store.app import debug; debug.pause('SOMEWHERE'); print('after')"


def test_a_process_waits_at_its_point_until_the_test_says_go(tmp_path):
    gate = Barrier(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", HOLD], env={**os.environ, **gate.env("SOMEWHERE")},
                            stdout=subprocess.PIPE, text=True)
    assert gate.reached("SOMEWHERE", proc) == proc.pid
    assert proc.poll() is None  # held there: it has not printed or exited
    gate.go("SOMEWHERE")
    assert proc.communicate(timeout=60)[0] == "after\n" and proc.returncode == 0


def test_a_process_that_ends_before_its_point_fails_the_wait(tmp_path):
    gate = Barrier(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], env={**os.environ, **gate.env("SOMEWHERE")},
                            stderr=subprocess.PIPE, text=True)
    with pytest.raises(AssertionError, match="exited"):
        gate.reached("SOMEWHERE", proc, timeout=60)


def test_unset_points_cost_nothing_and_numbers_still_sleep(tmp_path):
    out = subprocess.run([sys.executable, "-c", HOLD], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LLMGW_STORE_DEBUG_SOMEWHERE": "0.01"})
    assert out.stdout == "after\n"


def test_several_processes_at_one_point_are_counted(tmp_path):
    gate = Barrier(tmp_path)
    gate.go("SOMEWHERE")  # open: each passes through, and says so
    procs = [subprocess.Popen([sys.executable, "-c", HOLD], env={**os.environ, **gate.env("SOMEWHERE")},
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    assert gate.reached_by("SOMEWHERE", 3, procs) == sorted(p.pid for p in procs)
    assert all(p.communicate(timeout=60)[0] == "after\n" for p in procs)
    gate.reset("SOMEWHERE")
    assert gate.pids("SOMEWHERE") == []
