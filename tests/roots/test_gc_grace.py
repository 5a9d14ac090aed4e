"""gc --keep-dead-for (issue 15's grace period) with real processes and real profiles, and the
systemd units `systemd-units` writes for this installation."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, build_store, cli_cmd, copy_store, run_cli

DATES = ("2024-02-02", "2024-06-02", "2024-08-01")
LONG_AGO = "2020-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("grace"), wheels, *DATES)
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    a, b, c = template["names"]
    _last_used(root, {a: LONG_AGO, b: LONG_AGO, c: LONG_AGO})  # built a minute ago: used "now"
    return root, (a, b, c)


def _last_used(root: Path, when: dict[str, str]) -> None:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    for name, at in when.items():
        con.execute("UPDATE paths SET last_used = ? WHERE name = ?", (at, name))
    con.commit()
    con.close()


def gc(root: Path, *args: str) -> dict:
    return json.loads(run_cli(root, "--json", "gc", *args, check=True).stdout)


def deleted(r: dict) -> set[str]:
    return {d["name"] for d in r["deleted"]}


def test_a_path_whose_process_just_ended_is_kept(store):
    root, (a, b, c) = store
    proc = subprocess.Popen([str(root / "store" / a / "bin" / "python"), "-c",
                             "import time; print('up', flush=True); time.sleep(120)"], cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"  # running from the environment now
        r = gc(root, "--keep-dead-for", "1h")
        assert deleted(r) == {b, c}  # never rooted, last used long ago: no grace
    finally:
        proc.kill()
        proc.wait()
    # The process is gone; the last gc saw a rooted a moment ago.
    r = gc(root, "--keep-dead-for", "1h")
    assert deleted(r) == set() and r["kept_by_grace"] == [a]
    assert (root / "store" / a).is_dir()
    # The grace period is over once it is shorter than the time since: two hours ago, for one of 1h.
    con = sqlite3.connect(root / "var" / "db.sqlite")
    two_hours_ago = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() - 7200))
    assert con.execute("UPDATE gc_rooted SET last_rooted = ? WHERE name = ?", (two_hours_ago, a)).rowcount == 1
    con.commit()
    con.close()
    assert deleted(gc(root, "--keep-dead-for", "1h")) == {a}


def test_a_deleted_generation_keeps_its_path_for_the_grace_period(store):
    root, (a, b, c) = store
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    run_cli(root, "activate", "p", str(root / "store" / b), check=True)
    # No gc has seen a rooted: the generation's deletion time is what says when it lost its root.
    run_cli(root, "generations", "p", "--delete", "1", check=True)
    r = gc(root, "--keep-dead-for", "1h")
    assert deleted(r) == {c} and r["kept_by_grace"] == [a]
    text = run_cli(root, "gc", "--keep-dead-for", "1h", check=True).stdout
    assert "1 dead path(s) kept by --keep-dead-for" in text
    # Plain gc keeps today's meaning: no grace.
    assert deleted(gc(root)) == {a}


def test_delete_older_than_with_grace_keeps_what_it_just_unrooted(store):
    root, (a, b, c) = store
    run_cli(root, "activate", "p", str(root / "store" / a), check=True)
    run_cli(root, "activate", "p", str(root / "store" / b), check=True)
    r = gc(root, "--keep", "1", "--keep-dead-for", "1h")
    assert r["generations_deleted"] == {"p": [1]}
    assert deleted(r) == {c} and a in r["kept_by_grace"]


def test_never_rooted_but_recently_used_is_kept(store):
    root, (a, b, c) = store
    _last_used(root, {b: time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())})
    r = gc(root, "--keep-dead-for", "2h")
    assert deleted(r) == {a, c} and r["kept_by_grace"] == [b]
    assert run_cli(root, "gc", "--keep-dead-for", "soon").returncode == 2


def test_systemd_units_name_this_installation(tmp_path):
    root, out = tmp_path / "root", tmp_path / "units"
    proc = run_cli(root, "--json", "systemd-units", "--out", str(out), check=True)
    doc = json.loads(proc.stdout)
    service = (out / "llmgw-store-gc.service").read_text()
    exe = cli_cmd(root)[0]
    exec_line = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    assert exec_line == f'ExecStart="{exe}" "--root" "{root}" "gc"'  # no config file: gc's own defaults
    assert doc["exec_start"] == exec_line.removeprefix("ExecStart=")
    assert "OnCalendar=*-*-* 04:17:00" in (out / "llmgw-store-gc.timer").read_text()
    # What the unit runs works: the same argv, unquoted, is a gc of that root.
    argv = json.loads("[" + ", ".join(a for a in exec_line.removeprefix("ExecStart=").split(" ")) + "]")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    # (a root with no store yet: gc has nothing to do, after parsing every option the unit passes;
    # a timer installed before the first build must not fail every night)
    assert done.returncode == 0 and f"no store at {root} yet: nothing to collect" in done.stderr, done.stderr
    assert not root.exists()
    # systemd itself accepts both units (where systemd-analyze is installed)
    if shutil.which("systemd-analyze"):
        check = subprocess.run(["systemd-analyze", "verify", str(out / "llmgw-store-gc.service"),
                                str(out / "llmgw-store-gc.timer")], capture_output=True, text=True, check=False)
        assert check.returncode == 0 and not check.stderr.strip(), check.stderr


def test_systemd_units_refuse_hostile_values(tmp_path):
    root, out = tmp_path / "r%h$HOME", tmp_path / "units"
    proc = run_cli(root, "systemd-units", "--out", str(out), "--on-calendar", "daily\nExecStartPre=/bin/sh -c id")
    assert proc.returncode == 2 and proc.stderr.startswith("llmgw-store: error: --on-calendar")
    assert not out.exists()
    assert run_cli(root, "systemd-units", "--out", str(out), "--keep-dead-for", "1h\nUser=root").returncode == 2
    # specifiers in the root are escaped, not expanded by systemd
    run_cli(root, "systemd-units", "--out", str(out), check=True)
    assert f'"--root" "{tmp_path}/r%%h$$HOME"' in (out / "llmgw-store-gc.service").read_text()


def test_shipped_units_pass_the_grace_period():
    """The grace period is the config file's (the units have no policy of their own): the shipped
    service hands gc the file, and the documented node's file sets it."""
    service = (REPO / "contrib" / "llmgw-store-gc.service").read_text()
    assert '"--config" "/etc/llmgw-store/config.toml" "gc"' in service
    page = (REPO / "docs" / "operations.md").read_text()
    node = page[page.index("A fleet node, which only fetches"):page.index("The builder, which resolves")]
    assert 'keep_dead_for = "1h"' in node
