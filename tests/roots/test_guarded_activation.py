"""Guarded activation on a real store: `activate --check` runs a real command in the new environment
and switches only if it passes; `--then-check` switches, checks, and goes back by itself; a hung
check is killed with its children; SIGKILL in the middle leaves the profile consistent; the
recipe's `health` command is the default check. Everything through the installed command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from llmgw_store.core.layout import Layout
from llmgw_store.roots import records
from tests.conftest import build_json, build_store, cli_cmd, real_uv, run_cli, write_recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheels):
    """tinyengine 1.0 resolved before (old: tinydep 1.0) and after (new: tinydep 2.0) tinydep 2.0."""
    tmp = tmp_path_factory.mktemp("guarded")
    t = build_store(tmp, wheels, "2024-02-02", "2024-06-02")
    yield {"root": t["root"], "old": t["paths"][0], "new": t["paths"][1], "index": t["index"], "tmp": tmp}
    t["index"].stop()


def act(root, profile, target, *extra, check=True):
    return run_cli(root, "--json", "activate", profile, str(target), *extra, check=check)


def current_link(root: Path, profile: str) -> str:
    return os.readlink(root / "profiles" / profile)


def generations(root: Path, profile: str) -> dict:
    return json.loads(run_cli(root, "--json", "generations", profile, check=True).stdout)


def switches(root: Path, profile: str) -> list[tuple]:
    """The switches the profile's history records: (from, to, kind)."""
    return [(e.get("from"), e["to"], e["event"]) for e in records.history(Layout.at(root), profile)
            if e["event"] in ("activate", "auto-rollback", "rollback")]


def wait_for(predicate, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


FAILING = "python -c \"print('loading engine'); print('CUDA error: no kernel image'); raise SystemExit(3)\""


def test_a_failing_check_leaves_the_profile_untouched(built):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g1", old)
    before = sorted(os.listdir(root / "profiles"))
    proc = act(root, "g1", new, "--check", FAILING, check=False)
    assert proc.returncode == 1 and json.loads(proc.stdout)["error"]["kind"] == "command"  # --json: the error
    err = proc.stderr.strip().splitlines()[-1]
    assert err == ("llmgw-store: error: the check `python -c 'print('\"'\"'loading engine'\"'\"'); print('\"'\"'CUDA "
                   "error: no kernel image'\"'\"'); raise SystemExit(3)'` failed (exit 3); profile g1 left at "
                   "generation 1: nothing switched; its last lines: loading engine | CUDA error: no kernel image")
    # same link target, no new generation, no new record: the directory is as it was but for the history
    assert current_link(root, "g1") == "g1-1-link" and os.path.realpath(root / "profiles" / "g1") == old
    assert sorted(os.listdir(root / "profiles")) == before
    gens = generations(root, "g1")
    assert [g["number"] for g in gens["generations"]] == [1]
    event = gens["history"][-1]
    assert event["event"] == "check-failed" and event["name"] == Path(new).name and event["current"] == 1
    assert event["check"]["exit"] == 3 and event["check"]["result"] == "failed"
    assert event["by"]["uid"] == os.getuid() and event["by"]["user"]
    assert switches(root, "g1") == [(None, 1, "activate")]


def test_a_passing_check_runs_in_the_new_environment_then_switches(built):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g2", old)
    # `tinyengine` is found in the new environment's bin/ (PATH), and reports that environment's tinydep;
    # the shell also shows VIRTUAL_ENV is the new store path.
    r = json.loads(act(root, "g2", new, "--check", 'sh -c \'echo "venv=$VIRTUAL_ENV"; tinyengine\'').stdout)
    assert (r["generation"], r["previous"], r["changed"]) == (2, 1, True)
    assert r["check"]["result"] == "passed" and r["check"]["mode"] == "before"
    assert r["check"]["tail"] == f"venv={new}\ntinyengine 1.0 tinydep 2.0"
    assert current_link(root, "g2") == "g2-2-link"
    g = generations(root, "g2")["generations"][-1]
    assert (g["number"], g["current"], g["state"], g["record"], g["check"]["result"]) == (2, True, "hot", True, "passed")


def test_a_check_that_hangs_is_killed_with_its_children_at_the_timeout(built, tmp_path):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g3", old)
    pids = tmp_path / "pids"
    hang = (f"python -c \"import os, subprocess, time; c = subprocess.Popen(['sleep', '600']); "
            f"open('{pids}', 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(600)\"")
    proc = act(root, "g3", new, "--check", hang, "--check-timeout", "3", check=False)
    assert proc.returncode == 1
    assert "timed out after 3s (killed with its children); profile g3 left at generation 1" in proc.stderr
    check_pid, child_pid = map(int, pids.read_text().split())
    wait_for(lambda: not alive(check_pid) and not alive(child_pid), "the check and its child die")
    assert current_link(root, "g3") == "g3-1-link"
    assert generations(root, "g3")["history"][-1]["check"]["timed_out"] is True


def test_then_check_switches_first_and_rolls_back_by_itself(built, tmp_path):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g4", old)
    seen = tmp_path / "seen"
    # The check sees the profile already switched (a service restart would start the new engine).
    check = f"sh -c 'readlink {root / 'profiles' / 'g4'} > {seen}; echo engine refused to start; exit 1'"
    proc = act(root, "g4", new, "--check", check, "--then-check", check=False)
    assert proc.returncode == 1
    assert seen.read_text().strip() == "g4-2-link"
    assert ("failed (exit 1); profile g4 was switched to generation 2 and rolled back to generation 1; its last "
            "lines: engine refused to start") in proc.stderr
    assert current_link(root, "g4") == "g4-1-link" and os.path.realpath(root / "profiles" / "g4") == old
    gens = generations(root, "g4")
    two = gens["generations"][1]
    assert (two["number"], two["current"], two["rolled_back_to"], two["check"]["mode"]) == (2, False, 1, "after")
    assert [e["event"] for e in gens["history"]][-2:] == ["activate", "auto-rollback"]
    assert switches(root, "g4") == [(None, 1, "activate"), (1, 2, "activate"), (2, 1, "auto-rollback")]


def test_then_check_that_passes_keeps_the_new_generation(built):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g5", old)
    r = json.loads(act(root, "g5", new, "--check", "tinyengine", "--then-check").stdout)
    assert r["generation"] == 2 and r["check"]["result"] == "passed" and r["check"]["mode"] == "after"
    assert current_link(root, "g5") == "g5-2-link"
    assert generations(root, "g5")["history"][-1]["event"] == "check-passed"


def test_then_check_needs_a_generation_to_go_back_to(built):
    proc = act(built["root"], "g6", built["old"], "--check", "true", "--then-check", check=False)
    assert proc.returncode == 2 and "--then-check needs a generation to go back to" in proc.stderr
    assert not (built["root"] / "profiles" / "g6").is_symlink()


def test_sigkill_during_then_check_leaves_old_or_new_and_kills_the_check(built, tmp_path):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g7", old)
    started = tmp_path / "started"
    check = f"python -c \"import os, time; open('{started}', 'w').write(str(os.getpid())); time.sleep(600)\""
    victim = subprocess.Popen(cli_cmd(root, "activate", "g7", new, "--check", check, "--then-check"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: started.exists() and started.read_text(), "the check starts")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    wait_for(lambda: not alive(int(started.read_text())), "the check dies with the activation")
    # The profile is at a complete generation (here the new one: it was switched before the check).
    assert os.path.realpath(root / "profiles" / "g7") in (old, new)
    gens = generations(root, "g7")
    assert [g["number"] for g in gens["generations"]] == [1, 2]
    assert gens["generations"][1]["check"]["result"] == "pending"  # its check never finished
    # The lock died with the process: the profile can be changed again at once, and the next change
    # says the check was abandoned.
    back = json.loads(run_cli(root, "--json", "rollback", "g7", "--to", "1", check=True).stdout)
    assert back["generation"] == 1 and os.path.realpath(root / "profiles" / "g7") == old
    gens = generations(root, "g7")
    assert gens["generations"][1]["check"]["result"] == "abandoned"
    assert [e["event"] for e in gens["history"]][-2:] == ["check-abandoned", "rollback"]


def test_interrupting_then_check_rolls_back(built, tmp_path):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g8", old)
    started = tmp_path / "started"
    check = f"sh -c 'echo $$ > {started}; sleep 600'"
    victim = subprocess.Popen(cli_cmd(root, "activate", "g8", new, "--check", check, "--then-check"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: started.exists() and started.read_text().strip(), "the check starts")
    victim.send_signal(signal.SIGINT)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 130 and "interrupted" in err
    assert current_link(root, "g8") == "g8-1-link"
    assert generations(root, "g8")["history"][-1]["event"] == "auto-rollback"
    wait_for(lambda: not alive(int(started.read_text())), "the check dies")


def test_the_recipes_health_command_is_the_default_check(built, tmp_path):
    root, index, old = built["root"], built["index"], built["old"]
    sick = write_recipe(tmp_path, 'version = "1.0"\nhealth = ["python", "-c", "print(\'no GPU\'); raise SystemExit(4)"]',
                        name="sick.toml")
    well = write_recipe(tmp_path, 'version = "1.0"\nhealth = ["tinyengine"]', name="well.toml")
    sick_path = build_json(root, sick, index, real_uv(), "--as-of", "2024-02-02")["path"]
    well_path = build_json(root, well, index, real_uv(), "--as-of", "2024-02-02")["path"]
    # `health` is a recipe field, in the key of the recipes that have it; a recipe without it keeps its key
    assert len({sick_path, well_path, old}) == 3
    manifest = json.loads((Path(old) / ".llmgw" / "manifest.json").read_text())
    assert "health" not in manifest["inputs"]["build"]
    act(root, "g9", old)
    proc = act(root, "g9", sick_path, check=False)
    assert proc.returncode == 1 and "the check `python -c" in proc.stderr and "its last lines: no GPU" in proc.stderr
    assert current_link(root, "g9") == "g9-1-link"
    r = json.loads(act(root, "g9", well_path).stdout)
    assert r["generation"] == 2 and r["check"]["argv"] == ["tinyengine"] and r["check"]["result"] == "passed"
    # --no-check skips the recipe's command; --check replaces it
    assert json.loads(act(root, "g9", sick_path, "--no-check").stdout)["check"] is None
    assert json.loads(act(root, "g9", well_path, "--check", "true").stdout)["check"]["argv"] == ["true"]


def test_bad_check_arguments_are_usage_errors(built):
    root, old = built["root"], built["old"]
    for args, message in [
        (["--check", "'unterminated"], "No closing quotation"),
        (["--check", ""], "a check is a command and its arguments"),
        (["--check", "true", "--no-check"], "--no-check and --check exclude each other"),
        (["--then-check"], "--then-check needs a check"),
    ]:
        proc = act(root, "g10", old, *args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    assert not (root / "profiles" / "g10").is_symlink()


def test_a_check_command_that_does_not_exist_fails_the_check(built):
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g11", old)
    proc = act(root, "g11", new, "--check", "no-such-health-probe", check=False)
    assert proc.returncode == 1 and "failed (exit 127)" in proc.stderr and "no-such-health-probe" in proc.stderr
    assert current_link(root, "g11") == "g11-1-link"


def test_a_check_child_that_left_the_group_with_setsid_does_not_outlive_the_check(built, tmp_path):
    # F1: setsid puts the sleep out of the check's process group; the keeper (a child subreaper)
    # still finds it among its descendants and kills it when the check ends.
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g12", old)
    pid = tmp_path / "pid"
    r = json.loads(act(root, "g12", new, "--check", f"sh -c 'setsid sleep 300 & echo $! > {pid}; exit 0'").stdout)
    assert r["check"]["result"] == "passed" and current_link(root, "g12") == "g12-2-link"
    wait_for(lambda: not alive(int(pid.read_text())), "the setsid sleep dies with the check", seconds=10)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_or_sighup_during_then_check_rolls_back(built, tmp_path, sig, code):
    # F2: a service manager stopping the activation (SIGTERM), or its terminal going (SIGHUP), is an
    # interruption like ^C: the profile goes back before the process exits.
    root, old, new = built["root"], built["old"], built["new"]
    profile = f"g13{sig.name.lower()}"
    act(root, profile, old)
    started = tmp_path / "started"
    check = f"sh -c 'echo $$ > {started}; sleep 600'"
    victim = subprocess.Popen(cli_cmd(root, "activate", profile, new, "--check", check, "--then-check"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: started.exists() and started.read_text().strip(), "the check starts")
    victim.send_signal(sig)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == code, err
    assert current_link(root, profile) == f"{profile}-1-link"
    gens = generations(root, profile)
    assert gens["history"][-1]["event"] == "auto-rollback" and gens["generations"][1]["check"]["result"] == "interrupted"
    wait_for(lambda: not alive(int(started.read_text())), "the check dies")


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-inf", "0", "86401"])
def test_a_check_timeout_out_of_range_is_refused_before_anything_changes(built, value):
    # L1: inf and nan used to pass `> 0` and crash after the switch.
    root, old, new = built["root"], built["old"], built["new"]
    profile = "g14" + value.replace("-", "m").replace("+", "")
    act(root, profile, old)
    before = sorted(os.listdir(root / "profiles"))
    proc = act(root, profile, new, "--check", "true", "--then-check", "--check-timeout", value, check=False)
    assert proc.returncode == 2 and "--check-timeout" in proc.stderr and "86400" in proc.stderr, proc.stderr
    assert sorted(os.listdir(root / "profiles")) == before and current_link(root, profile) == f"{profile}-1-link"
    ok = json.loads(act(root, profile, new, "--check", "true", "--check-timeout", "86400").stdout)  # the bound
    assert ok["generation"] == 2


def test_control_characters_of_a_check_never_reach_the_terminal(built):
    # L2/L3: the check's output (an OSC sequence that retitles or worse) and its arguments (a newline
    # that forges a line of the history) are shown escaped.
    root, old, new = built["root"], built["old"], built["new"]
    act(root, "g15", old)
    osc = "python -c \"import sys; sys.stdout.write('\\x1b]0;owned\\x07\\x1b[2J boom\\n'); raise SystemExit(5)\""
    proc = act(root, "g15", new, "--check", osc, check=False)
    assert proc.returncode == 1 and "boom" in proc.stderr
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr, repr(proc.stderr)
    forged = "true 'x\ngeneration 99 passed by root'"
    act(root, "g15", new, "--check", forged)
    text = run_cli(root, "generations", "g15", "--history", check=True).stdout
    assert "\ngeneration 99 passed by root" not in text and "\x1b" not in text, text
    assert "generation 99 passed by root" in text  # shown, escaped
