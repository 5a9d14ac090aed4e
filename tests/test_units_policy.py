"""The gc units carry the node's policy (gc options into ExecStart), refuse a calendar systemd would
not parse, name documentation that exists, and what they run works from the first night: gc on a
root with no store yet has nothing to do (exit 0, nothing created)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw_store.roots.systemd import DEFAULT_ON_CALENDAR, GcPolicy, render, strict_calendar
from tests.conftest import REPO, build_store, cli_cmd, copy_store, run_cli

ANALYZE = shutil.which("systemd-analyze")


def exec_argv(service: Path) -> list[str]:
    """ExecStart as systemd splits it (every value is double-quoted, none holds a quote here)."""
    line = next(ln for ln in service.read_text().splitlines() if ln.startswith("ExecStart="))
    return json.loads("[" + ", ".join(line.removeprefix("ExecStart=").split(" ")) + "]")


def test_the_policy_options_reach_the_gc_the_unit_runs(tmp_path):
    root, out = tmp_path / "root", tmp_path / "units"
    proc = run_cli(root, "--json", "systemd-units", "--out", str(out), "--min-free", "500G", "--max-cache", "50G",
                   "--delete-older-than", "14d", "--keep", "3", "--keep-dead-for", "2h", "--on-calendar", "hourly",
                   check=True)
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1 and doc["on_calendar"] == "hourly"
    argv = exec_argv(out / "llmgw-store-gc.service")
    assert argv == [cli_cmd(root)[0], "--root", str(root), "gc", "--delete-older-than", "14d", "--keep", "3",
                    "--min-free", "500G", "--max-cache", "50G", "--keep-dead-for", "2h"]
    assert "OnCalendar=hourly\n" in (out / "llmgw-store-gc.timer").read_text()
    # The first night, before anything was built: exit 0, nothing created.
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "nothing to collect" in done.stderr, done.stderr
    assert not root.exists()


def test_the_default_unit_prunes_caches_by_live_use(tmp_path):
    out = tmp_path / "units"
    run_cli(tmp_path / "root", "systemd-units", "--out", str(out), check=True)
    argv = exec_argv(out / "llmgw-store-gc.service")
    assert argv[argv.index("--max-cache") + 1] == "20G" and "--prune-live" not in argv


def test_none_leaves_an_option_out(tmp_path):
    out = tmp_path / "units"
    run_cli(tmp_path / "root", "systemd-units", "--out", str(out), "--min-free", "none", "--max-cache", "none",
            check=True)
    argv = exec_argv(out / "llmgw-store-gc.service")
    assert "--min-free" not in argv and "--max-cache" not in argv and "--delete-older-than" in argv


def test_the_policy_comes_from_the_environment_too(tmp_path):
    out = tmp_path / "units"
    run_cli(tmp_path / "root", "systemd-units", "--out", str(out), check=True,
            env={"LLMGW_STORE_GC_MAX_CACHE": "5G", "LLMGW_STORE_GC_ON_CALENDAR": "daily"})
    assert exec_argv(out / "llmgw-store-gc.service")[-4:-2] == ["--max-cache", "5G"]
    assert "OnCalendar=daily\n" in (out / "llmgw-store-gc.timer").read_text()


@pytest.mark.parametrize("args", [
    ["--on-calendar", "every day"], ["--on-calendar", "daily at 4"], ["--on-calendar", ""],
    ["--on-calendar", "25:00"], ["--min-free", "lots"], ["--min-free", ""], ["--max-cache", "10X"],
    ["--delete-older-than", "a month"], ["--keep", "-1"], ["--keep-dead-for", "1h\nUser=root"],
], ids=repr)
def test_a_bad_value_is_exit_2_and_nothing_is_written(tmp_path, args):
    out = tmp_path / "units"
    proc = run_cli(tmp_path / "root", "systemd-units", "--out", str(out), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: ") and "Traceback" not in proc.stderr
    assert not out.exists()


def test_every_calendar_is_checked_without_systemd_too(tmp_path):
    """Where systemd-analyze is missing, the strict parser decides: PATH without it."""
    out = tmp_path / "units"
    bare = {"PATH": str(tmp_path / "empty-bin")}
    bad = run_cli(tmp_path / "root", "systemd-units", "--out", str(out), "--on-calendar", "every day", env=bare)
    assert bad.returncode == 2 and "--on-calendar 'every day'" in bad.stderr, bad.stderr
    run_cli(tmp_path / "root", "systemd-units", "--out", str(out), "--on-calendar", "Mon..Fri *-*-* 02:30",
            env=bare, check=True)


GOOD = ["daily", "hourly", "weekly", "*-*-* 04:17:00", "Mon..Fri *-*-* 02:30", "Sat,Sun 03:00", "*-*-01 00:00:00",
        "2030-01-01 12:00", "*:0/15", "Mon *-*-* 04:00:00 UTC", "*-*-* 00/6:00", "monday 06:00", "04:17"]
BAD = ["every day", "daily at 4", "tomorrow", "*-*-* 04:17:00 04:00", "-1", "Mon Fri", "04:17 Mon", "* * * * *",
       "@daily", "$(id)", "*-*-* 04:17:00; rm"]


def test_the_strict_parser_accepts_what_systemd_accepts_and_no_more():
    assert all(strict_calendar(s) for s in GOOD), [s for s in GOOD if not strict_calendar(s)]
    assert not any(strict_calendar(s) for s in BAD), [s for s in BAD if strict_calendar(s)]
    if ANALYZE is None:
        pytest.skip("systemd-analyze is not installed: the parser is checked against its own cases only")
    for spec in GOOD + BAD:
        accepted = subprocess.run([ANALYZE, "calendar", "--", spec], capture_output=True, check=False).returncode == 0
        if strict_calendar(spec):
            assert accepted, f"the strict parser accepts {spec!r}, systemd does not"


def test_documentation_names_what_exists_and_systemd_accepts_the_units(tmp_path):
    out = tmp_path / "units"
    doc = json.loads(run_cli(tmp_path / "root", "--json", "systemd-units", "--out", str(out), check=True).stdout)
    service = (out / "llmgw-store-gc.service").read_text()
    urls = [ln.removeprefix("Documentation=") for ln in service.splitlines() if ln.startswith("Documentation=")]
    assert urls == ([doc["documentation"]] if doc["documentation"] else [])
    for url in urls:
        assert url.startswith("file://") and Path(url.removeprefix("file://")).is_file(), url
    if doc["documentation"] is None:
        assert "# Documentation: `llmgw-store gc --help`" in service
    if ANALYZE:
        check = subprocess.run([ANALYZE, "verify", str(out / "llmgw-store-gc.service"),
                                str(out / "llmgw-store-gc.timer")], capture_output=True, text=True, check=False)
        assert check.returncode == 0 and not check.stderr.strip(), check.stderr


def test_the_shipped_examples_are_what_it_writes():
    service, timer, _ = render("/opt/llmgw-store/bin/llmgw-store", Path("/var/lib/llmgw-store"), GcPolicy(),
                               DEFAULT_ON_CALENDAR, None)
    assert (REPO / "contrib" / "llmgw-store-gc.service").read_text() == service
    assert (REPO / "contrib" / "llmgw-store-gc.timer").read_text() == timer


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("units"), wheels, "2024-02-02", "2024-03-03")
    yield t
    t["index"].stop()


def test_the_unit_collects_and_prunes_a_real_store(built, tmp_path):
    root = copy_store(built["root"], tmp_path / "root")
    run_cli(root, "activate", "p", built["names"][0], check=True)
    out = tmp_path / "units"
    run_cli(root, "systemd-units", "--out", str(out), "--min-free", "none", "--max-cache", "0",
            "--keep-dead-for", "none", check=True)
    done = subprocess.run(exec_argv(out / "llmgw-store-gc.service"), capture_output=True, text=True, check=False,
                          env={**os.environ, "LLMGW_STORE_PROGRESS": "plain"})
    assert done.returncode == 0, done.stderr
    assert sorted(e.name for e in (root / "store").iterdir() if not e.name.startswith(".")) == [built["names"][0]]
    assert "cache entr" in done.stdout or "uv cache prune" in done.stderr, (done.stdout, done.stderr)
