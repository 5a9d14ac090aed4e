"""procs: children die with the run that started them, and with the process that started them,
grandchildren included; `reap` kills a dead build's processes and nothing else. Real processes,
found in /proc by a mark in their environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from llmgw_store.build import bytecode
from llmgw_store.supervise import procs
from tests.support import procscan
from tests.support.barrier import Barrier

SH_TWO_SLEEPS = ["sh", "-c", "sleep 100 & sleep 100"]


@pytest.fixture
def mark():
    """A string only this test's processes carry (in their environment); they are killed after."""
    value = f"procs-test-{uuid.uuid4().hex}"
    yield value
    procscan.kill_all(procscan.mentioning(value))


def env_with(mark: str, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PROCS_TEST_MARK": mark, **extra}


def sleeps(mark: str) -> list[procscan.Proc]:
    return [p for p in procscan.mentioning(mark) if p.cmdline.startswith("sleep")]


def parent_running(code: str, mark: str) -> subprocess.Popen:
    """A Python process that runs `code` (with procs imported), started like a build."""
    return subprocess.Popen([sys.executable, "-c", "from llmgw_store.supervise import procs\n" + textwrap.dedent(code)],
                            env={**os.environ, "MARK": mark}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_sigkill_of_the_parent_kills_child_and_grandchild(mark):
    parent = parent_running(f"""
        import os
        procs.run({SH_TWO_SLEEPS!r}, env={{"PATH": os.environ["PATH"], "PROCS_TEST_MARK": os.environ["MARK"]}})
    """, mark)
    try:
        found = procscan.wait_for(lambda: len(sleeps(mark)) == 2 and sleeps(mark), 30, "sh to start two sleeps")
    finally:
        parent.kill()
        parent.wait(timeout=10)
    # In a group of their own (the keeper's), not the parent's or ours.
    assert {p.pgid for p in found} != {os.getpgid(0)} and len({p.pgid for p in found}) == 1
    started = time.monotonic()
    left = procscan.gone_within(mark, 5)
    assert left == [], left
    assert time.monotonic() - started < 2


def test_keyboard_interrupt_in_the_parent_kills_the_group(mark):
    parent = parent_running(f"""
        import os
        try:
            procs.run({SH_TWO_SLEEPS!r}, env={{"PATH": os.environ["PATH"], "PROCS_TEST_MARK": os.environ["MARK"]}})
        except KeyboardInterrupt:
            print("interrupted")
    """, mark)
    procscan.wait_for(lambda: len(sleeps(mark)) == 2, 30, "sh to start two sleeps")
    parent.send_signal(signal.SIGINT)
    out, err = parent.communicate(timeout=10)
    assert out.strip() == "interrupted", err
    # run returns (here: raises) only once the group is dead.
    assert procscan.mentioning(mark) == []


def test_timeout_kills_the_group_and_returns_the_output_so_far(mark):
    started = time.monotonic()
    done = procs.run(["sh", "-c", "echo before; sleep 100 & sleep 100"], env=env_with(mark), timeout=0.5)
    assert done.timed_out and done.returncode < 0
    assert done.output == "before\n"
    assert time.monotonic() - started < 5
    assert procscan.mentioning(mark) == []


def test_grandchildren_are_killed_when_the_command_ends(mark):
    # The command exits at once; the sleep it left in the background dies with its group.
    done = procs.run(["sh", "-c", "sleep 100 & echo started"], env=env_with(mark))
    assert (done.returncode, done.output, done.timed_out) == (0, "started\n", False)
    assert procscan.mentioning(mark) == []


@pytest.mark.parametrize("how", ["exits", "times out"])
def test_a_child_that_left_the_group_with_setsid_is_killed_too(mark, how):
    # F1: `setsid` puts the sleep in a session and group of its own, out of the group kill's reach;
    # the keeper is a child subreaper, so the orphaned sleep becomes its child and is killed by the
    # descendant walk. Double forks (the sleep's parent shell gone) included.
    script = "setsid sh -c 'sleep 300 & sleep 300' & exit 0" if how == "exits" else \
        "setsid sleep 300 & sleep 100"
    done = procs.run(["sh", "-c", script], env=env_with(mark), timeout=None if how == "exits" else 0.5)
    assert done.timed_out == (how == "times out")
    assert procscan.gone_within(mark, 5) == [], "a setsid child outlived the run"


def test_output_and_exit_status(tmp_path, mark):
    done = procs.run(["sh", "-c", "echo out; echo err >&2; printf 'a\\r\\nb'; exit 3"], env=env_with(mark), cwd=tmp_path)
    assert (done.returncode, done.output) == (3, "out\nerr\na\nb")
    done = procs.run(["sh", "-c", "pwd; kill -TERM $$"], env=env_with(mark), cwd=tmp_path)
    assert (done.returncode, done.output) == (-signal.SIGTERM, f"{tmp_path}\n")
    # The command gets SIGPIPE's default disposition back (Python ignores it): `yes | head` ends.
    done = procs.run(["sh", "-c", "yes | head -n 2"], env=env_with(mark), timeout=10)
    assert (done.returncode, done.output, done.timed_out) == (0, "y\ny\n", False)


def test_a_missing_or_unrunnable_command_raises_as_subprocess_does(tmp_path, mark):
    with pytest.raises(FileNotFoundError):
        procs.run(["no-such-command-here"], env=env_with(mark))
    with pytest.raises(FileNotFoundError):
        procs.run([str(tmp_path / "missing")], env=env_with(mark))
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(PermissionError):
        procs.run([script], env=env_with(mark))
    script.chmod(0o755)
    assert procs.run(["./script"], env=env_with(mark), cwd=tmp_path).output == "hi\n"
    # Found but not executable by the kernel: the keeper says so, like a shell would (exit 127).
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\x01 not a program\n")
    junk.chmod(0o755)
    done = procs.run([junk], env=env_with(mark))
    assert done.returncode == 127 and "cannot run" in done.output and "Exec format error" in done.output


def test_recording_gives_children_the_token_and_notes_their_groups(tmp_path, mark):
    record = tmp_path / "k.pgids"
    with procs.recording(record) as token:
        done = procs.run(["sh", "-c", 'echo "$LLMGW_STORE_BUILD"; cat "$0"', record], env=env_with(mark))
        lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert not record.exists()
    assert done.output.splitlines()[0] == token
    # While the child ran, the record held the token and the child's group (the keeper's pid).
    written = [json.loads(line) for line in done.output.splitlines()[1:]]
    assert written[0]["token"] == token and written[0]["pid"] == os.getpid()
    assert list(written[1]) == ["child"]
    assert lines[1:] == [written[1], {"ended": written[1]["child"]}]


def test_reap_kills_what_carries_a_dead_builds_token_and_nothing_else(tmp_path, mark):
    token, other = uuid.uuid4().hex, uuid.uuid4().hex
    base = {"PATH": os.environ["PATH"], "PROCS_TEST_MARK": mark}

    def start(**env: str) -> subprocess.Popen:
        return subprocess.Popen(["sleep", "100"], env={**base, **env}, start_new_session=True)

    ours = start(LLMGW_STORE_BUILD=token)
    # Left its group (as a child calling setsid would): found by its token all the same.
    escaped = subprocess.Popen(["setsid", "sleep", "100"], env={**base, "LLMGW_STORE_BUILD": token})
    unrelated = start()  # its pgid is in the record, as a recycled pgid would be
    other_build = start(LLMGW_STORE_BUILD=other)
    lookalike = start(NOTE=f"LLMGW_STORE_BUILD={token}")
    keep = [unrelated, other_build, lookalike]
    record = tmp_path / "k.pgids"
    record.write_text("\n".join(json.dumps(d) for d in [
        {"token": token, "pid": 1, "since": 0},
        {"child": ours.pid}, {"child": unrelated.pid}, {"child": 999999}, {"ended": 999999},
    ]) + '\n{"child": 12')  # the last line cut short, as a crash would leave it
    try:
        procscan.wait_for(lambda: len(sleeps(mark)) == 5, 10, "five sleeps")
        reaped = procs.reap(record)
        assert not record.exists()
        assert reaped.groups == (ours.pid, unrelated.pid)
        assert ours.pid in reaped.killed and reaped.left == ()
        assert len(reaped.killed) == 2 and not set(reaped.killed) & {p.pid for p in keep}
        assert ours.wait(timeout=5) == -signal.SIGKILL
        assert {p.pid for p in sleeps(mark)} == {p.pid for p in keep}
        assert all(p.poll() is None for p in keep)
    finally:
        for p in [ours, escaped, *keep]:
            p.kill()
            p.wait(timeout=10)


def test_reap_without_a_record_does_nothing(tmp_path):
    assert procs.reap(tmp_path / "none.pgids") == procs.Reaped()
    bad = tmp_path / "bad.pgids"
    bad.write_text("not json\n")
    assert procs.reap(bad) == procs.Reaped() and not bad.exists()


def test_compile_workers_die_with_the_compile_script_alone(tmp_path, mark):
    """The script is SIGKILLed by itself (no keeper around it here): its pool worker, which is held
    at the COMPILE_PAUSE hook, dies too (PR_SET_PDEATHSIG set by the pool's initializer)."""
    env_dir = tmp_path / "env"
    (env_dir / "lib").mkdir(parents=True)
    (env_dir / "lib" / "m.py").write_text("x = 1\n")
    gate = Barrier(tmp_path)
    script = subprocess.Popen(
        [sys.executable, "-I", "-S", bytecode.WORKER, env_dir, env_dir / "lib", tmp_path / "cache"],
        env=env_with(mark, **gate.env("COMPILE_PAUSE")), start_new_session=True,
    )
    held = gate.reached("COMPILE_PAUSE", script)
    worker = [p for p in procscan.mentioning(mark) if p.pid == held]
    assert worker and worker[0].ppid == script.pid  # a pool worker, not the script itself
    script.kill()
    script.wait(timeout=10)
    assert procscan.gone_within(mark, 5) == [], worker
