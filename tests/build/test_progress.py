"""Progress on every long step (issue 16): a real build against the loopback index whose slow steps
(the bytecode compile, held by the COMPILE_PAUSE hook, and a verify command that sleeps) must
still say something at least every 2 s; `--progress=json` gives one JSON object per stderr line;
a child's output never reaches the terminal unescaped; the reporter's own rules (rate limit,
quiet short steps, the child progress protocol) with a collecting reporter."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import tempfile
import threading

import pytest

from llmgw_store.base import report
from llmgw_store.supervise import procs
from tests.conftest import cli_cmd, run_cli
from tests.support import recipes
from tests.support.barrier import Barrier


def write_recipe(tmp_path, verify: str, name: str):
    return recipes.write_recipe(tmp_path, 'version = "1.0"', name, verify=["sh", "-c", verify])


def slow_recipe(tmp_path):
    return write_recipe(tmp_path, "sleep 3; tinyengine", "slow.toml")


def build(root, recipe, index, uv_bin, *global_opts) -> subprocess.CompletedProcess:
    """A build whose bytecode compile is held (COMPILE_PAUSE) until its progress has reported the
    compile's count (the heartbeat of a step that lasts), whatever the machine's speed."""
    gate = Barrier(root.parent / f"gate-{root.name}")
    cmd = cli_cmd(root, *global_opts, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **gate.env("COMPILE_PAUSE")})
    seen = []
    try:
        gate.reached("COMPILE_PAUSE", proc)
        for line in proc.stderr:  # the build's own word, line by line (bounded: it ends when the build does)
            seen.append(line)
            if "compiling bytecode" in line and "modules" in line:  # `0/N modules`, or its JSON event
                break
        gate.go("COMPILE_PAUSE")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "".join(seen) + err)


def test_a_slow_build_reports_at_least_every_two_seconds(tmp_path, index, uv_bin):
    proc = build(tmp_path / "root", slow_recipe(tmp_path), index, uv_bin, "--progress=plain")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    stamps = [float(m.group(1)) for m in (re.match(r"\[\s*([0-9.]+)s\] ", ln) for ln in lines) if m]
    assert len(stamps) == len(lines), proc.stderr  # every line is timestamped
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert max(gaps) <= 2.0, f"a gap of {max(gaps):.1f}s:\n{proc.stderr}"
    text = proc.stderr
    # the compile counts its modules (total first, then how many are done), the verify command beats
    assert re.search(r"compiling bytecode: 0/\d+ modules", text), text
    assert re.search(r"verify command `sh -c sleep 3; tinyengine`: \ds…", text), text
    assert "verify command `sh -c sleep 3; tinyengine`: done in" in text
    assert proc.stdout.strip().endswith("-tinyengine-1.0-cpu")


def test_progress_json_is_one_object_per_line_on_stderr(tmp_path, index, uv_bin):
    proc = build(tmp_path / "root", slow_recipe(tmp_path), index, uv_bin, "--progress=json", "--json")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stderr.splitlines()]
    assert events and all(isinstance(e["t"], float) for e in events)
    steps = [e for e in events if "step" in e]
    assert {"step", "done", "total", "unit"} <= set(steps[0])
    assert any(e["step"] == "compiling bytecode" and e["unit"] == "modules" and e["total"] for e in steps)
    assert any(e.get("end") for e in steps)
    assert json.loads(proc.stdout)["path"].endswith("-tinyengine-1.0-cpu")  # stdout: the one document


def test_progress_none_prints_nothing_but_the_result(tmp_path, index, uv_bin, recipe):
    proc = run_cli(tmp_path / "root", "--progress=none", "build", str(recipe), "--index-url", index.url,
                   "--uv", str(uv_bin), check=True)
    assert proc.stderr == ""
    assert proc.stdout.strip().endswith("-tinyengine-1.0-cpu")


def test_a_childs_escape_sequences_never_reach_the_terminal(tmp_path, index, uv_bin):
    # A verify command (or uv, or a package's build) prints terminal control sequences: retitle the
    # window, clear the screen. The heartbeat shows its last line as detail, escaped.
    hostile = write_recipe(tmp_path, r"printf '\033]0;owned\007\033[2Jevil\n'; sleep 2; tinyengine", "hostile.toml")
    for mode in ("plain", "tty"):
        # A terminal of 120 columns: the live line is cut to the terminal's width, which is COLUMNS
        # when set (80 under pytest-xdist's workers, too narrow to reach the detail).
        proc = run_cli(tmp_path / f"root-{mode}", f"--progress={mode}", "build", str(hostile), "--index-url",
                       index.url, "--uv", str(uv_bin), env={"COLUMNS": "120"})
        assert proc.returncode == 0, proc.stderr
        # shown escaped
        assert ("\\x1b]0;ow" if mode == "tty" else "\\x1b]0;owned\\x07\\x1b[2Jevil") in proc.stderr, proc.stderr
        assert "\x07" not in proc.stderr and "\x1b]" not in proc.stderr and "\x1b[2J" not in proc.stderr
        if mode == "tty":  # the live line is rewritten in place, and cleared before the result
            assert "\x1b[K" in proc.stderr  # (text mode turned the \r into a line end)


class Collect(report.Reporter):
    interval = 0.0
    active = True

    def __init__(self):
        self.lines: list[str] = []
        self.updates: list[report.Update] = []

    def message(self, text):
        self.lines.append(text)

    def show(self, update):
        self.updates.append(update)


def test_progress_shows_a_step_once_it_has_lasted_an_interval_and_ends_it():
    sink = Collect()
    sink.interval = 3600.0  # nothing lasts that long here
    with report.reporting_to(sink):
        for i in range(1000):
            report.progress("quick", i, 1000, "files")
        report.progress("quick", 1000, 1000, "files")
    assert sink.updates == []  # a quick step stays silent, its end too
    sink = Collect()
    with report.reporting_to(sink):
        for i in range(1, 11):
            report.progress("counted", i * 100, 1000, "B")
    assert [u.done for u in sink.updates] == [i * 100 for i in range(1, 11)]
    assert sink.updates[-1].final and not any(u.final for u in sink.updates[:-1])
    assert report.describe(sink.updates[-1]).startswith("counted: 1000 B in ")


def test_describe_uses_iec_units_rate_and_eta():
    u = report.Update("pushing x", 3 << 30, 8 << 30, "B", 10.0, rate=300 << 20, eta=17.2)
    assert report.describe(u) == "pushing x: 3.0 GiB of 8.0 GiB (300.0 MiB/s, ETA 17s)"
    u = report.Update("compiling bytecode", 1234, 27481, "modules", 4.0, rate=340.0, eta=77.0)
    assert report.describe(u) == "compiling bytecode: 1,234/27,481 modules (340/s, ETA 1m17s)"


def child_output(data: bytes):
    f = tempfile.TemporaryFile()
    f.write(data)
    f.flush()
    return f


def test_the_child_progress_protocol_counts_and_refuses_what_it_does_not_know():
    sink = Collect()
    with report.reporting_to(sink), child_output(
        b"llmgw-progress: total 1000 modules\n"
        b"llmgw-progress: +256\nllmgw-progress: +256\n"
        b"llmgw-progress: +99999999999999999999\n"     # out of bounds: not a progress line
        b"llmgw-progress: total -5 modules\n"            # malformed: ignored
        b"llmgw-progress: +256 \x1b[2J\n"                # not a full match: ignored
    ) as out:
        beat = procs.Heartbeat(out.fileno(), "compiling bytecode")
        assert beat() is None  # counted: the heartbeat leaves the line to progress
        out.write(b"llmgw-progress: +488\n")
        out.flush()
        beat()
    assert [(u.done, u.total, u.unit) for u in sink.updates] == [(512, 1000, "modules"), (1000, 1000, "modules")]
    assert sink.updates[-1].final


def test_the_heartbeat_detail_is_the_last_line_cut_short():
    with child_output(b"Resolved 3 packages\nPrepared " + b"x" * 5000 + b"\npartial line") as out:
        beat = procs.Heartbeat(out.fileno(), "uv pip install")
        assert beat() == "partial line"
        out.write(b" now complete\n")
        out.flush()
        assert beat() == "partial line now complete"
        assert beat() == "partial line now complete"  # nothing new: the last line stays
    with child_output(b"Resolved 3 packages\nPrepared " + b"x" * 5000 + b"\n") as out:
        assert procs.Heartbeat(out.fileno(), "uv pip install")() == "Prepared " + "x" * 111


def test_heartbeat_beats_while_a_block_runs(monkeypatch):
    sink = Collect()
    stop = threading.Event()
    with report.reporting_to(sink), report.heartbeat("waiting", every=0.05, tail=lambda: "detail"):
        stop.wait(0.3)
    beats = [u for u in sink.updates if u.step == "waiting"]
    assert len(beats) >= 2 and beats[-1].final and beats[0].detail == "detail"


@pytest.mark.parametrize("mode", ["plain", "json", "tty"])
def test_messages_are_escaped_in_every_text_mode(mode, tmp_path):
    path = tmp_path / "err"
    with open(path, "w") as stream:
        with report.reporting_to(report.renderer(mode, stream)):
            report.say("file \x1b[31mred\x1b[0m\nname")
    text = path.read_text()
    assert "\x1b[31m" not in text
    if mode == "json":
        assert json.loads(text)["msg"] == "file \x1b[31mred\x1b[0m\nname"  # JSON escapes it itself
    else:
        assert "file \\x1b[31mred\\x1b[0m\\nname" in text


def test_auto_is_plain_when_stderr_is_not_a_terminal(tmp_path):
    with open(tmp_path / "f", "w") as stream:
        assert type(report.renderer("auto", stream)) is report.Plain
    r, w = os.openpty()
    try:
        with open(w, "w", closefd=False) as stream:
            assert type(report.renderer("auto", stream)) is report.Tty or os.environ.get("TERM") == "dumb"
    finally:
        os.close(r)
        os.close(w)


def test_the_watchdog_says_the_announced_step_is_still_running(tmp_path):
    # Python-side work, a lock wait, a query: nothing reports, yet a line comes within 2 s.
    path = tmp_path / "err"
    with open(path, "w") as stream, report.reporting_to(report.renderer("plain", stream)):
        threading.Event().wait(2.0)  # nothing announced yet: an early error must stay one line
        assert path.read_text() == ""
        report.say("asking the index")
        threading.Event().wait(2.5)
    lines = path.read_text().splitlines()
    assert lines[0].endswith("] asking the index")
    assert re.fullmatch(r"\[\s*[0-9.]+s\] asking the index: [12]s…", lines[1]), lines


def test_the_watchdog_in_json_marks_its_events_idle(tmp_path):
    path = tmp_path / "err"
    with open(path, "w") as stream, report.reporting_to(report.renderer("json", stream)):
        report.say("waiting for a lock")
        threading.Event().wait(2.0)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert events[0]["msg"] == "waiting for a lock"
    assert events[1]["step"] == "waiting for a lock" and events[1]["idle"] and events[1]["unit"] == "s"
