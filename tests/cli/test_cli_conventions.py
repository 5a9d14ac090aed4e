"""CLI conventions: global options before or after the command (as uv, pixi and nix take them),
`-q`, every error one line (usage errors included), under --json an error document on stdout too,
and one signal guard (SIGINT 130, SIGTERM 143, SIGHUP 129) for click and the fast path alike."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_store, cli_cmd, run_cli
from tests.support.barrier import Barrier

FULL = "import sys; from llmgw_store.cli.main import main; sys.argv[0] = 'llmgw-store'; main()"


@pytest.fixture(scope="module")
def store(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("conventions"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


def full(root: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FULL, "--root", str(root), *args], capture_output=True, text=True,
                          timeout=300, check=False, **kw)


@pytest.mark.parametrize("before, after", [
    (["--json", "list"], ["list", "--json"]),
    (["-v", "--json", "list-profiles"], ["list-profiles", "--json", "-v"]),
    (["--progress", "none", "--json", "doctor"], ["doctor", "--progress=none", "--json"]),
    (["--json", "info", "NAME"], ["info", "NAME", "--json"]),
], ids=lambda a: " ".join(a))
def test_global_options_work_after_the_command(store, before, after):
    root, name = store["root"], store["names"][0]
    want = run_cli(root, *[name if a == "NAME" else a for a in before], check=True)
    got = run_cli(root, *[name if a == "NAME" else a for a in after], check=True)
    assert got.stdout == want.stdout and json.loads(got.stdout) is not None


def test_root_after_the_command_and_the_fast_path(store, tmp_path):
    root, paths = store["root"], store["paths"]
    exe = cli_cmd(root)[0]
    proc = subprocess.run([exe, "activate", "conv", paths[0], "--root", str(root), "--json"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["path"] == paths[0]
    proc = subprocess.run([exe, "rollback", "conv", "--root", str(root)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("llmgw-store: error: ")
    assert "no generation before" in proc.stderr


def test_run_keeps_what_follows_its_command(store):
    root, name = store["root"], store["names"][0]
    proc = run_cli(root, "run", name, "--", "python", "-c", "import sys; print(sys.argv[1:])", "--json", "-v")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['--json', '-v']"


def test_quiet_silences_progress_on_both_paths(store):
    root, paths = store["root"], store["paths"]
    loud = run_cli(root, "activate", "quiet", paths[0])
    assert loud.returncode == 0 and loud.stderr  # a switch says what it does
    for args in (["activate", "quiet", paths[1], "-q"], ["-q", "rollback", "quiet"]):
        proc = run_cli(root, *args)
        assert proc.returncode == 0 and proc.stderr == "" and proc.stdout
    proc = full(root, "activate", "quiet", paths[1], "-q")
    assert proc.returncode == 0 and proc.stderr == ""
    proc = run_cli(root, "-q", "verify", store["names"][0])
    assert proc.returncode == 0 and proc.stderr == ""


USAGE = [
    ["build"], ["--frob", "list"], ["list", "--frob"], ["build", "x.toml", "--progress", "bogus"], ["nosuch"],
    ["activate", "p"], ["rollback", "p", "--to", "x"], ["gc", "--keep", "many"], ["cache", "gc"],
    ["activate", "p", "t", "--check-timeout", "0"],
]


@pytest.mark.parametrize("args", USAGE, ids=" ".join)
def test_usage_errors_are_one_line(tmp_path, args):
    for as_json in (False, True):
        proc = run_cli(tmp_path, *(["--json"] if as_json else []), *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: "), proc.stderr
        assert "Usage:" not in proc.stderr and "Try " not in proc.stderr
        if as_json:
            doc = json.loads(proc.stdout)
            assert doc == {"schema_version": 1, "exit_code": 2,
                           "error": {"kind": "usage", "message": lines[0].removeprefix("llmgw-store: error: ")}}
        else:
            assert proc.stdout == ""


def test_under_json_an_error_is_a_document_on_both_paths(tmp_path):
    missing = tmp_path / "typo"
    for args in (["info", "x"], ["activate", "p", "/x"], ["rollback", "p"]):  # list: nothing to do, exit 0
        fast = run_cli(missing, "--json", *args)
        slow = full(missing, *args, "--json")
        for proc in (fast, slow):
            assert proc.returncode == 2
            doc = json.loads(proc.stdout)
            assert doc["schema_version"] == 1 and doc["exit_code"] == 2 and doc["error"]["kind"] == "no_store"  # a NotFoundError: the root holds no store
            assert proc.stderr == f"llmgw-store: error: {doc['error']['message']}\n"
        assert fast.stdout == slow.stdout and fast.stderr == slow.stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["INT", "TERM", "HUP"])
@pytest.mark.parametrize("how", ["fast", "click"])
def test_signals_end_a_command_as_ctrl_c_does(store, tmp_path, sig, code, how):
    root, paths = store["root"], store["paths"]
    profile = f"sig-{how}-{sig.name.lower()}"
    run_cli(root, "activate", profile, paths[0], check=True)
    gate = Barrier(tmp_path)
    argv = cli_cmd(root, "--json", "activate", profile, paths[1]) if how == "fast" else [
        sys.executable, "-c", FULL, "--root", str(root), "--json", "activate", profile, paths[1]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **gate.env("BEFORE_SWITCH")})
    try:
        gate.reached("BEFORE_SWITCH", proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, (proc.returncode, err)
    assert err.splitlines()[-1] == "llmgw-store: interrupted"
    assert json.loads(out) == {"schema_version": 1, "exit_code": code,
                               "error": {"kind": "interrupted", "message": "interrupted", "signal": sig.name}}
    assert os.path.realpath(root / "profiles" / profile) == paths[0]  # nothing switched
    # The profile's lock went with the process: the next switch takes it at once.
    run_cli(root, "activate", profile, paths[1], "--lock-timeout", "0", check=True)
