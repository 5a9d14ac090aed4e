"""The gc units run the node's day as the config file says — gc with `--config` (the file's [gc]
table is the policy, as for a gc run by hand; no policy of the units' own), then push-roots and
stats where the file configures them —, carry gc options given as flags, refuse a calendar systemd
would not parse, name documentation that exists, and what they run works from the first night: gc
on a root with no store yet has nothing to do (exit 0, nothing created)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from llmgw_store.roots.systemd import DEFAULT_ON_CALENDAR, GcPolicy, NodeDay, render, strict_calendar
from tests.conftest import REPO, build_store, cli_cmd, copy_store, run_cli

ANALYZE = shutil.which("systemd-analyze")


def exec_argvs(service: Path) -> list[list[str]]:
    """Every ExecStart, in order, as systemd splits it (every value is double-quoted, none holds a
    quote here)."""
    return [json.loads("[" + ", ".join(ln.removeprefix("ExecStart=").split(" ")) + "]")
            for ln in service.read_text().splitlines() if ln.startswith("ExecStart=")]


def exec_argv(service: Path) -> list[str]:
    """The first ExecStart (the gc)."""
    return exec_argvs(service)[0]


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


def test_the_units_have_no_policy_of_their_own(tmp_path):
    """Without a flag or a config file, the unit's gc is a bare `gc`, as by hand (the units used to
    add --delete-older-than 30d, --min-free 200G, --max-cache 20G and --keep-dead-for 1h)."""
    out, root = tmp_path / "units", tmp_path / "root"
    run_cli(root, "systemd-units", "--out", str(out), check=True)
    assert exec_argvs(out / "llmgw-store-gc.service") == [[cli_cmd(root)[0], "--root", str(root), "gc"]]


def test_none_is_passed_to_gc_as_no_limit(tmp_path):
    """`none` is gc's own "no limit" (over a config file's value), and what the unit runs parses it."""
    out, root = tmp_path / "units", tmp_path / "root"
    run_cli(root, "systemd-units", "--out", str(out), "--min-free", "none", "--max-cache", "none",
            "--delete-older-than", "30d", check=True)
    argv = exec_argv(out / "llmgw-store-gc.service")
    assert argv[3:] == ["gc", "--delete-older-than", "30d", "--min-free", "none", "--max-cache", "none"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "nothing to collect" in done.stderr, done.stderr


def test_the_policy_comes_from_the_environment_too(tmp_path):
    out = tmp_path / "units"
    run_cli(tmp_path / "root", "systemd-units", "--out", str(out), check=True,
            env={"LLMGW_STORE_GC_MAX_CACHE": "5G", "LLMGW_STORE_GC_ON_CALENDAR": "daily"})
    assert exec_argv(out / "llmgw-store-gc.service")[-3:] == ["gc", "--max-cache", "5G"]
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
    service, timer, _, _ = render("/opt/llmgw-store/bin/llmgw-store", Path("/var/lib/llmgw-store"), GcPolicy(),
                                  DEFAULT_ON_CALENDAR, None,
                                  NodeDay("/etc/llmgw-store/config.toml", push_roots=True, stats=True))
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


def node_config(tmp_path: Path, gc_table: str) -> Path:
    """A node's config file: its [gc] policy, its roots' cache and key, its metrics file."""
    conf = tmp_path / "node.toml"
    conf.write_text(f"{gc_table}\n[node]\nroots_to = \"file://{tmp_path / 'cache'}\"\n"
                    f"secret_key = \"{tmp_path / 'keys' / 'node-1.secret'}\"\n\n"
                    f"[stats]\nprometheus = \"{tmp_path / 'llmgw.prom'}\"\n")
    conf.chmod(0o644)
    return conf


def test_the_units_run_gc_push_roots_and_stats_with_the_config_file(tmp_path):
    root, out = tmp_path / "root", tmp_path / "units"
    conf = node_config(tmp_path, '[gc]\nkeep_dead_for = "2h"\nmin_free = "100G"\n')
    doc = json.loads(run_cli(root, "--config", str(conf), "--json", "systemd-units", "--out", str(out),
                             check=True).stdout)
    base = [cli_cmd(root)[0], "--root", str(root), "--config", str(conf)]
    assert exec_argvs(out / "llmgw-store-gc.service") == [[*base, "gc"], [*base, "push-roots"], [*base, "stats"]]
    assert len(doc["then"]) == 2 and doc["exec_start"].endswith('"gc"')
    # A flag still goes into the gc line; the file's values are read by gc when it runs.
    run_cli(root, "--config", str(conf), "systemd-units", "--out", str(out), "--max-cache", "5G", check=True)
    assert exec_argv(out / "llmgw-store-gc.service") == [*base, "gc", "--max-cache", "5G"]
    # Half a [node] table is refused, nothing written.
    half = tmp_path / "half.toml"
    half.write_text(f"[node]\nroots_to = \"file://{tmp_path / 'cache'}\"\n")
    half.chmod(0o644)
    proc = run_cli(root, "--config", str(half), "systemd-units", "--out", str(tmp_path / "u2"))
    assert proc.returncode == 2 and "sets roots_to but not secret_key" in proc.stderr, proc.stderr
    assert not (tmp_path / "u2").exists()
    # push-roots without --to, its variable or the file's [node] roots_to: exit 2, naming the flag and the key
    bare = run_cli(root, "push-roots", "--secret-key", str(tmp_path / "keys" / "node-1.secret"))
    assert bare.returncode == 2 and "'--to'" in bare.stderr and "roots_to" in bare.stderr, bare.stderr


def _state(root: Path) -> tuple[list[str], list[str]]:
    """(store paths on disk, the profile's generation links)."""
    return (sorted(e.name for e in (root / "store").iterdir() if not e.name.startswith(".")),
            sorted(e.name for e in (root / "profiles").iterdir() if e.name.startswith("p-")))


def test_the_units_gc_is_the_hand_run_gc_with_that_file(built, tmp_path):
    """A generation 40 days old and a file that sets no delete_older_than: the unit's day keeps it,
    as `gc --config FILE` by hand does, publishes the node's roots (both paths) and writes the
    metrics file."""
    a, b = built["names"][:2]
    conf = node_config(tmp_path, '[gc]\nkeep_dead_for = "1h"\n')
    run_cli(built["root"], "keygen", "node-1", "--out", str(tmp_path / "keys"), check=True)
    roots = []
    for i in (1, 2):
        root = copy_store(built["root"], tmp_path / f"root-{i}")
        run_cli(root, "activate", "p", a, check=True)
        run_cli(root, "activate", "p", b, check=True)
        old = time.time() - 40 * 86400
        os.utime(root / "profiles" / "p-1-link", (old, old), follow_symlinks=False)
        roots.append(root)
    by_unit, by_hand = roots
    out = tmp_path / "units"
    run_cli(by_unit, "--config", str(conf), "systemd-units", "--out", str(out), check=True)
    argvs = exec_argvs(out / "llmgw-store-gc.service")
    assert [argv[5] for argv in argvs] == ["gc", "push-roots", "stats"]
    for argv in argvs:
        done = subprocess.run(argv, capture_output=True, text=True, check=False,
                              env={k: v for k, v in os.environ.items() if k != "LLMGW_STORE_CONFIG"})
        assert done.returncode == 0, (argv, done.stderr)
    run_cli(by_hand, "--config", str(conf), "gc", check=True)
    assert _state(by_unit)[0] == _state(by_hand)[0] and a in _state(by_unit)[0]
    assert _state(by_unit)[1] == _state(by_hand)[1] == ["p-1-link", "p-2-link"]
    published = json.loads((tmp_path / "cache" / "roots" / "node-1.json").read_text())
    assert published["node"] == "node-1" and sorted(published["keys"]) == sorted(n[:32] for n in (a, b))
    assert "llmgw_store_" in (tmp_path / "llmgw.prom").read_text()
