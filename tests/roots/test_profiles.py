"""Profiles on a real store: activation, rollback, generations, pins, diff, env/run; atomicity and
crashes with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import build_store, cli_cmd, run_cli
from tests.support.barrier import Barrier


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheels):
    """One store with two environments of tinyengine 1.0: resolved before and after tinydep 2.0."""
    t = build_store(tmp_path_factory.mktemp("profiles"), wheels, "2024-02-02", "2024-06-02")
    yield {"root": t["root"], "old": t["paths"][0], "new": t["paths"][1], "recipe": t["recipe"], "index": t["index"]}
    t["index"].stop()


def act(root, profile, target, *extra):
    return json.loads(run_cli(root, "--json", "activate", profile, str(target), *extra, check=True).stdout)


def test_activate_rollback_and_generations(built):
    root, old, new = built["root"], built["old"], built["new"]
    first = act(root, "p1", old)
    assert first["generation"] == 1 and first["changed"] and first["previous"] is None
    same = act(root, "p1", old)
    assert same["generation"] == 1 and not same["changed"]
    second = act(root, "p1", new)
    assert second["generation"] == 2 and second["previous"] == 1
    profiles = root / "profiles"
    assert os.readlink(profiles / "p1") == "p1-2-link"
    assert os.readlink(profiles / "p1-2-link") == f"../store/{Path(new).name}"  # relative links
    assert os.path.realpath(profiles / "p1") == new

    back = json.loads(run_cli(root, "--json", "rollback", "p1", check=True).stdout)
    assert (back["previous"], back["generation"]) == (2, 1) and os.path.realpath(profiles / "p1") == old
    fwd = run_cli(root, "rollback", "p1", "--to", "2", check=True)
    assert fwd.stdout == f"p1: generation 1 -> 2 ({new})\n"

    gens = json.loads(run_cli(root, "--json", "generations", "p1", check=True).stdout)
    assert [(g["number"], g["current"], g["version"]) for g in gens["generations"]] == [(1, False, "1.0"), (2, True, "1.0")]
    text = run_cli(root, "generations", "p1", check=True).stdout.splitlines()
    assert text[1].endswith(f"tinyengine 1.0 (cpu)  {new}  (current)") and text[1].lstrip().startswith("2  ")


def test_numbers_are_never_reused(built):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "p2", old)
    act(root, "p2", new)
    run_cli(root, "rollback", "p2", check=True)                # current: 1
    run_cli(root, "generations", "p2", "--delete", "2", check=True)
    assert act(root, "p2", new)["generation"] == 3
    assert sorted(p.name for p in (root / "profiles").glob("p2-*-link")) == ["p2-1-link", "p2-3-link"]


def test_exact_errors(built):
    root, old = built["root"], built["old"]
    act(root, "p3", old)
    cases = [
        (["rollback", "nosuch"], f"llmgw-store: error: no profile 'nosuch' in {root / 'profiles'} (see `llmgw-store list-profiles`)\n"),
        (["rollback", "p3", "--to", "9"], "llmgw-store: error: profile 'p3' has no generation 9 (it has: 1)\n"),
        (["rollback", "p3"], "llmgw-store: error: profile 'p3' has no generation before 1 to roll back to\n"),
        (["generations", "p3", "--delete", "1"],
         "llmgw-store: error: refusing to delete generation 1 of 'p3': it is the current one (roll back first)\n"),
        (["activate", "p3", str(root / "store" / "not-a-path")],
         f"llmgw-store: error: {root / 'store' / 'not-a-path'} is not a registered store path in {root / 'store'} (see `llmgw-store list`)\n"),
        (["activate", "Bad/Name", old], "llmgw-store: error: 'Bad/Name' is not a profile name: use [a-z0-9._-], starting with a letter or digit\n"),
        (["unpin", "nosuch"], f"llmgw-store: error: no pin 'nosuch' in {root / 'gcroots'}\n"),
    ]
    for args, stderr in cases:
        proc = run_cli(root, *args)
        assert (proc.returncode, proc.stderr, proc.stdout) == (2, stderr, ""), args


def test_delete_older_than_and_keep(built):
    root, old, new = built["root"], built["old"], built["new"]
    for target in (old, new, old, new):
        act(root, "p4", target)
    # generations 1..4, current 4; make 1 and 2 look 40 days old
    for n in (1, 2):
        link = root / "profiles" / f"p4-{n}-link"
        t = time.time() - 40 * 86400
        os.utime(link, (t, t), follow_symlinks=False)
    dry = json.loads(run_cli(root, "--json", "generations", "p4", "--older-than", "30d", "--dry-run", check=True).stdout)
    assert dry["deleted"] == [1, 2] and (root / "profiles" / "p4-1-link").is_symlink()
    run_cli(root, "generations", "p4", "--older-than", "30d", check=True)
    kept = json.loads(run_cli(root, "--json", "generations", "p4", "--keep", "1", check=True).stdout)
    assert kept["deleted"] == [3]
    listed = json.loads(run_cli(root, "--json", "generations", "p4", check=True).stdout)["generations"]
    assert [g["number"] for g in listed if g["linked"]] == [4]
    assert [g["number"] for g in listed if not g["linked"]] == [1, 2, 3]  # deleted: only their records stay


def test_activate_a_recipe_builds_then_activates(built):
    root, index = built["root"], built["index"]
    from tests.conftest import real_uv

    r = act(root, "p5", built["recipe"], "--index-url", index.url, "--uv", str(real_uv()))
    assert r["generation"] == 1 and r["path"] == built["old"]


def test_pin_and_unpin(built):
    root, old = built["root"], built["old"]
    out = json.loads(run_cli(root, "--json", "pin", "known-good", old, check=True).stdout)
    assert out["path"] == old and os.readlink(root / "gcroots" / "known-good") == f"../store/{Path(old).name}"
    run_cli(root, "unpin", "known-good", check=True)
    assert not (root / "gcroots" / "known-good").exists()


def test_diff_between_generations(built):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "p6", old)
    act(root, "p6", new)
    d = json.loads(run_cli(root, "--json", "diff", "p6@1", "p6@2", check=True).stdout)
    assert d["upgraded"] == [{"name": "tinydep", "from": "1.0", "to": "2.0"}]
    assert d["added"] == d["removed"] == d["downgraded"] == []
    text = run_cli(root, "diff", new, "p6@1", check=True).stdout
    assert "↓ tinydep 2.0 -> 1.0" in text and text.splitlines()[-1].startswith("size: ")


def test_env_and_run(built):
    root, old = built["root"], built["old"]
    act(root, "p7", old)
    lines = run_cli(root, "env", "p7", check=True).stdout
    assert f"export VIRTUAL_ENV={root / 'profiles' / 'p7'}\n" in lines
    shell = subprocess.run(["sh", "-c", f'eval "$({" ".join(cli_cmd(root, "env", "p7"))})" && tinyengine'],
                           capture_output=True, text=True, check=True)
    assert shell.stdout.strip() == "tinyengine 1.0 tinydep 1.0"
    ran = run_cli(root, "run", "p7", "--", "tinyengine", check=True)
    assert ran.stdout.strip() == "tinyengine 1.0 tinydep 1.0"
    missing = run_cli(root, "run", "p7", "--", "no-such-command")
    assert missing.returncode == 2 and "no-such-command: command not found in profile p7" in missing.stderr


READER = r"""
import os, sys, time
profile, good, stop = sys.argv[1], set(sys.argv[2:4]), sys.argv[4]
n = bad = 0
while not os.path.exists(stop):
    try:
        real = os.path.realpath(profile, strict=True)
    except OSError:
        bad += 1
        continue
    if real not in good or not os.path.exists(os.path.join(real, ".llmgw", "manifest.json")):
        bad += 1
    n += 1
print(n, bad)
"""

SWITCHER = r"""
import sys
from llmgw_store.roots.profiles import rollback
root, profile, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(count):
    rollback(profile, to=1 + i % 2, root=root)
"""


def test_switching_2000_times_is_atomic_for_readers(built, tmp_path):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "hot", old)
    act(root, "hot", new)
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(root / "profiles" / "hot"), old, new, str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        subprocess.run([sys.executable, "-c", SWITCHER, str(root), "hot", "2000"], check=True, timeout=600)
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    reads, bad = map(int, out.split())
    assert reads > 0 and bad == 0
    switches = json.loads(run_cli(root, "--json", "generations", "hot", check=True).stdout)
    assert [g["number"] for g in switches["generations"]] == [1, 2]


# The switch's own path (roots/switch.py) tells the index of generation 2 before its link exists,
# so a kill leaves nothing to repair; the full function (here through a check) tells it after the
# switch, and the next change repairs the index.
@pytest.mark.parametrize("point, expect_current, expect_repair, extra", [
    ("BEFORE_SWITCH", 1, False, ()), ("AFTER_SWITCH", 2, False, ()),
    ("BEFORE_SWITCH", 1, True, ("--check", "true")), ("AFTER_SWITCH", 2, True, ("--check", "true"))])
def test_sigkill_mid_activation_leaves_old_or_new(built, point, expect_current, expect_repair, extra, tmp_path):
    root, old, new = built["root"], built["old"], built["new"]
    profile = f"k-{point.lower().replace('_', '-')}{'-full' if extra else ''}"
    act(root, profile, old)
    gate = Barrier(tmp_path)
    victim = subprocess.Popen(cli_cmd(root, "activate", profile, new, *extra), env={**os.environ, **gate.env(point)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gate.reached(point, victim)
    link2 = root / "profiles" / f"{profile}-2-link"
    assert link2.is_symlink()  # the new generation exists; the profile is switched after, not before
    assert (os.readlink(root / "profiles" / profile) == link2.name) == (point == "AFTER_SWITCH")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert os.path.realpath(root / "profiles" / profile) == (old if expect_current == 1 else new)
    gens = json.loads(run_cli(root, "--json", "generations", profile, check=True).stdout)
    assert gens["current"] == expect_current
    assert [g["number"] for g in gens["generations"]] == [1, 2]
    assert any("generation 2 was on disk but not in the index" in r for r in gens["index_differs"]) == expect_repair
    # generations only looks; the next change of the profile records what the killed one did not
    assert json.loads(run_cli(root, "--json", "generations", profile, check=True).stdout)["index_differs"] == gens["index_differs"]
    nxt = act(root, profile, old if expect_current == 2 else new)
    assert nxt["generation"] == 3
    assert json.loads(run_cli(root, "--json", "generations", profile, check=True).stdout)["index_differs"] == []
