"""The console script's fast path (cli/fast.py) answers exactly what the full click command answers.

Each divergence the fast path once had is a test here (issue 24): the index URL from its environment
variable, a --root that is a link, an index restored in place, LLMGW_STORE_PROGRESS, escaping of
progress and error lines, the exit code of SIGTERM, and " (check passed)". Whether the fast path
answered is read from `python -X importtime` (click in the import log: the full command did).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_json, cli_cmd, run_cli, start_index, write_recipe
from tests.support.barrier import Barrier


def traced(root: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, bool]:
    """One run of the installed command: (the process, whether the fast path answered it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *cli_cmd(root, *args)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300, check=False)
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    proc.stderr = "".join(ln + "\n" for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    return proc, "click" not in loaded


def full(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The same command through the click app alone (never the fast path)."""
    code = "import sys; from llmgw_store.cli.main import main; sys.argv[0] = 'llmgw-store'; main()"
    return subprocess.run([sys.executable, "-c", code, "--root", str(root), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, check=False)


def test_the_index_url_from_its_variable_is_an_input_of_the_hit(root, recipe, index, uv_bin, wheels):
    """LLMGW_STORE_INDEX_URL is read by the fast path as click reads it: a memo entry made for
    another index URL is never the answer."""
    from llmgw_store.build import memo as buildmemo

    built = build_json(root, recipe, index, uv_bin, env={"LLMGW_STORE_INDEX_URL": index.url})
    argv = ("--json", "build", str(recipe), "--uv", str(uv_bin))
    proc, fast = traced(root, *argv, env={"LLMGW_STORE_INDEX_URL": index.url})
    assert proc.returncode == 0 and fast and json.loads(proc.stdout)["path"] == built["path"]
    # An entry saying what the default index (PyPI) gave, as a build with no variable would have written.
    pypi = buildmemo.memo_key(str(recipe), recipe.read_bytes(), {
        "version": None, "variant": None, "as_of": None, "index_url": "https://pypi.org/simple", "uv": str(uv_bin),
        "python_preference": "only-system"})
    [entry] = (root / "var" / "memo").iterdir()
    shutil.copy2(entry, entry.with_name(pypi))
    other = start_index(wheels)
    try:
        env = {"LLMGW_STORE_INDEX_URL": other.url}  # another index: another key
        want = json.loads(full(root, *argv, env=env).stdout)
        assert want["key"] != built["key"]
        proc, _ = traced(root, *argv, env=env)
        assert proc.returncode == 0 and json.loads(proc.stdout)["key"] == want["key"]
        proc, fast = traced(root, *argv, env=env)
        assert fast and json.loads(proc.stdout)["path"] == want["path"]
    finally:
        other.stop()


def test_a_root_that_is_a_link_is_refused_as_the_full_command_refuses_it(tmp_path, root, recipe, index, uv_bin):
    built = build_json(root, recipe, index, uv_bin)
    link = tmp_path / "root-link"
    link.symlink_to(root)
    argv = ("build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    want = full(link, *argv)
    assert want.returncode == 2 and "symlink" in want.stderr
    proc, _ = traced(link, *argv)
    assert (proc.returncode, proc.stdout, proc.stderr) == (want.returncode, want.stdout, want.stderr)
    assert traced(root, *argv) [0].stdout == built["path"] + "\n"


def test_an_index_restored_in_place_is_another_index(root, recipe, index, uv_bin):
    """The memo is bound to the index it was written against (its epoch), not to the file's inode:
    an older index copied over the live one is another index, and the answer is the full command's."""
    build_json(root, recipe, index, uv_bin)
    db = root / "var" / "db.sqlite"
    older = root.parent / "older.sqlite"
    shutil.copy2(db, older)  # knows `first` only
    run_cli(root, "doctor", "--rebuild-index", check=True)  # a new index file
    later = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")
    argv = ("--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), "--as-of", "2024-06-02")
    proc, fast = traced(root, *argv)
    assert fast and json.loads(proc.stdout)["path"] == later["path"]
    # The older index is copied into the live file (same inode); `later` is unregistered there, and
    # changed since: the full command refuses it.
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    with open(db, "r+b") as f:
        f.write(older.read_bytes())
        f.truncate()
    target = Path(later["path"]) / "bin" / "tinyengine"
    target.parent.chmod(0o755)
    target.chmod(0o755)
    target.write_text(target.read_text() + "\n# changed\n")
    want = full(root, *argv)
    assert want.returncode == 1 and "does not match its manifest" in want.stderr
    proc, fast = traced(root, *argv)
    assert not fast and (proc.returncode, proc.stdout) == (want.returncode, want.stdout)


@pytest.fixture
def two(root, recipe, index, uv_bin):
    """Two store paths and a profile `p` at the first."""
    a = build_json(root, recipe, index, uv_bin)["path"]
    b = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"]
    run_cli(root, "activate", "p", a, check=True)
    return a, b


def test_progress_follows_llmgw_store_progress_on_the_fast_path(root, recipe, index, uv_bin, two):
    a, b = two
    for mode in ("json", "none"):
        env = {"LLMGW_STORE_PROGRESS": mode}
        proc, fast = traced(root, "activate", "p", b, env=env)
        assert proc.returncode == 0 and fast
        lines = proc.stderr.splitlines()
        if mode == "json":
            assert lines and all(json.loads(line)["msg"] for line in lines)
        else:
            assert lines == []
        run_cli(root, "rollback", "p", check=True)
        proc, fast = traced(root, "-v", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), env=env)
        assert proc.returncode == 0 and fast and proc.stdout == a + "\n"
        if mode == "json":
            assert [json.loads(line)["msg"] for line in proc.stderr.splitlines()]
        else:
            assert proc.stderr == ""


def test_progress_and_error_lines_are_escaped_as_the_full_command_escapes_them(tmp_path, root, index, uv_bin):
    """A recipe's health command (shown in a progress line and in the error) with a terminal escape
    sequence in it: the sequence is shown escaped, never sent to the terminal, by both paths alike."""
    import re

    hostile = write_recipe(tmp_path, 'version = "1.0"\nhealth = ["python", "-c", "raise SystemExit(3)", '
                                     '"\\u001b]0;owned\\u0007"]', name="hostile.toml")
    path = build_json(root, hostile, index, uv_bin)["path"]

    def shown(stderr: str) -> list[str]:
        # timestamps and durations aside
        return [re.sub(r"[0-9]+\.[0-9]+s\b", "Ts", line) for line in stderr.splitlines()]

    want = full(root, "activate", "p", path)
    proc, fast = traced(root, "activate", "p", path)
    assert fast and want.returncode == proc.returncode == 1
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr and "\\x1b]0;owned" in proc.stderr
    assert shown(proc.stderr) == shown(want.stderr)


def test_sigterm_ends_a_switch_with_143_on_both_paths(tmp_path, root, two):
    a, b = two
    gate = Barrier(tmp_path)
    for how in ("fast", "click"):
        argv = cli_cmd(root, "activate", "p", b) if how == "fast" else [
            sys.executable, "-c", "import sys; from llmgw_store.cli.main import main; main()", "--root", str(root),
            "activate", "p", b]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **gate.env("BEFORE_SWITCH")})
        try:
            gate.reached("BEFORE_SWITCH", proc)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 143, (how, proc.returncode, err)
        assert err.splitlines()[-1] == "llmgw-store: interrupted" and out == ""
        assert os.path.realpath(root / "profiles" / "p") == a
        gate.reset("BEFORE_SWITCH")


def test_the_check_that_ran_is_said_on_the_fast_path(tmp_path, root, index, uv_bin):
    healthy = write_recipe(tmp_path, 'version = "1.0"\nhealth = ["tinyengine"]', name="healthy.toml")
    a = build_json(root, healthy, index, uv_bin)["path"]
    b = build_json(root, healthy, index, uv_bin, "--as-of", "2024-06-02")["path"]
    run_cli(root, "activate", "p", a, check=True)
    proc, fast = traced(root, "activate", "p", b)
    assert proc.returncode == 0 and fast and proc.stdout == f"p: generation 2 -> {b} (check passed)\n"
    want = full(root, "activate", "p", a)
    assert want.stdout == f"p: generation 3 -> {a} (check passed)\n"


def test_verify_answers_as_the_full_command(root, two):
    """`verify` without --repair runs the library's verify from the fast path (no click): the same
    lines, document, progress and exit code as the click command, for an intact store and a damaged one."""
    import re

    a, b = two

    def both(*args: str) -> tuple[int, bool]:
        proc, fast = traced(root, *args)
        want = full(root, *args)
        untimed = [re.sub(r"\[ *[0-9.]+s\] ", "", s) for s in (proc.stderr, want.stderr)]
        assert (proc.stdout, untimed[0], proc.returncode) == (want.stdout, untimed[1], want.returncode), args
        return proc.returncode, fast

    for args in (["verify"], ["--json", "verify"], ["-v", "verify", "p"], ["verify", a, "p@1"], ["verify", "nope"]):
        code, fast = both(*args)
        assert fast and code == (2 if "nope" in args else 0), (args, code)
    victim = Path(b) / "bin" / "tinyengine"
    victim.parent.chmod(0o755)
    victim.chmod(0o755)
    victim.write_text(victim.read_text() + "# changed\n")
    for args in (["verify"], ["--json", "verify", b]):
        code, fast = both(*args)
        assert fast and code == 1, (args, code)
