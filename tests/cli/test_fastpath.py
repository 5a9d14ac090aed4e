"""The cache-hit fast path (cli/fast.py, build/memo.py) and the use stamps (core/uses.py).

Each test runs the installed command under `python -X importtime`: click in the import log means
the full command answered (the fast path fell through), no click means the build memo did.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import cli_cmd, run_cli, start_index, write_recipe


def hit(root: Path, recipe: Path, index, uv: Path, *extra: str, env: dict | None = None) -> tuple[dict, bool]:
    """(the JSON document, whether the fast path answered) of one `build`."""
    argv = [sys.executable, "-X", "importtime", *cli_cmd(root, "--json", "build", str(recipe), "--index-url",
                                                         index.url, "--uv", str(uv), *extra)]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return json.loads(proc.stdout), "click" not in loaded


def memo_files(root: Path) -> list[Path]:
    return sorted((root / "var" / "memo").iterdir())


def test_second_build_is_answered_before_click_with_the_same_document(root, recipe, index, uv_bin):
    first, fast = hit(root, recipe, index, uv_bin)
    assert first["how"] == "built" and not fast
    # The build's steps, and one figure for the whole build: the steps add up to `seconds`.
    assert {"plan", "venv", "resolve", "install", "bytecode", "hash, verify, register"} <= set(first["steps"])
    assert sum(first["steps"].values()) == pytest.approx(first["seconds"], abs=0.01)
    [entry] = memo_files(root)
    st = entry.lstat()
    assert oct(st.st_mode & 0o777) == "0o600" and st.st_uid == os.geteuid()
    slow_hit = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                       "--lock-timeout", "5", check=True)  # an option the fast path ignores on a hit
    again, fast = hit(root, recipe, index, uv_bin)
    assert fast and again["how"] == "hit" and again["cache_hit"] is True
    slow = json.loads(slow_hit.stdout)
    for doc in (again, slow):
        assert set(doc) == set(first)
        assert {k: v for k, v in doc.items() if k not in ("how", "seconds", "steps", "cache_hit")} == \
               {k: v for k, v in first.items() if k not in ("how", "seconds", "steps", "cache_hit")}
    # Plain output: the path alone.
    out = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), check=True)
    assert out.stdout == first["path"] + "\n"


def test_what_enters_the_key_misses_the_memo(tmp_path, root, recipe, index, uv_bin, wheels):
    base, _ = hit(root, recipe, index, uv_bin)
    assert hit(root, recipe, index, uv_bin)[1]
    # The recipe's bytes: a comment is enough to miss (the full command then finds the same key).
    recipe.write_text(recipe.read_text() + "# a comment\n")
    doc, fast = hit(root, recipe, index, uv_bin)
    assert not fast and doc["path"] == base["path"] and doc["how"] == "hit"
    assert hit(root, recipe, index, uv_bin)[1]
    # --as-of and --variant (spelt out, even when it names the default) and --version.
    doc, fast = hit(root, recipe, index, uv_bin, "--as-of", "2024-06-02")
    assert not fast and doc["how"] == "built" and doc["path"] != base["path"]
    assert hit(root, recipe, index, uv_bin, "--as-of", "2024-06-02")[1]
    doc, fast = hit(root, recipe, index, uv_bin, "--variant", "cpu")
    assert not fast and doc["path"] == base["path"]
    doc, fast = hit(root, recipe, index, uv_bin, "--version", "1.1")
    assert not fast and doc["version"] == "1.1"
    # The uv binary: another path, then the same path with another mtime.
    uv_copy = tmp_path / "uv-copy"
    shutil.copy2(uv_bin, uv_copy)
    doc, fast = hit(root, recipe, index, uv_copy)
    assert not fast and doc["path"] == base["path"]
    assert hit(root, recipe, index, uv_copy)[1]
    os.utime(uv_copy, (time.time() - 100, time.time() - 100))
    assert not hit(root, recipe, index, uv_copy)[1]
    # The same uv through LLMGW_STORE_UV is the same option: still a hit.
    # The index URL.
    other = start_index(wheels)
    try:
        doc, fast = hit(root, recipe, other, uv_bin)
        assert not fast and doc["how"] == "built" and doc["path"] != base["path"]
    finally:
        other.stop()
    # The python preference (through its environment variable, as click reads it).
    doc, fast = hit(root, recipe, index, uv_bin, env={"LLMGW_STORE_PYTHON_PREFERENCE": "system"})
    assert not fast


def test_a_collected_path_misses_and_is_built_again(root, recipe, index, uv_bin):
    first, _ = hit(root, recipe, index, uv_bin)
    assert hit(root, recipe, index, uv_bin)[1]
    run_cli(root, "gc", check=True)  # nothing roots it
    assert not Path(first["path"]).exists()
    doc, fast = hit(root, recipe, index, uv_bin)
    assert not fast and doc["how"] == "built" and doc["path"] == first["path"]


@pytest.mark.parametrize("tamper", ["garbage", "huge", "symlink", "other-owner", "group-readable", "wrong-name",
                                    "bad-dep"])
def test_a_tampered_memo_is_ignored(tmp_path, root, recipe, index, uv_bin, tamper):
    first, _ = hit(root, recipe, index, uv_bin)
    [entry] = memo_files(root)
    text = entry.read_text()
    if tamper == "garbage":
        entry.write_bytes(os.urandom(300))
    elif tamper == "huge":
        entry.write_text(text + "x" * 100_000)
    elif tamper == "symlink":
        planted = tmp_path / "planted"
        planted.write_text(text)
        planted.chmod(0o600)
        entry.unlink()
        entry.symlink_to(planted)
    elif tamper == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(entry, 65534, 65534)
    elif tamper == "group-readable":
        entry.chmod(0o640)
    elif tamper == "wrong-name":
        entry.write_text(text.replace(f"name={first['name']}", "name=../../etc"))
    elif tamper == "bad-dep":
        entry.write_text(text.replace("dep=", "dep=1:2:3 ", 1))
    doc, fast = hit(root, recipe, index, uv_bin)
    assert not fast and doc["path"] == first["path"] and doc["how"] == "hit"
    if tamper in ("garbage", "huge", "wrong-name", "bad-dep", "group-readable"):
        # The full command wrote a good entry over it: the next hit is fast again.
        assert hit(root, recipe, index, uv_bin)[1]


def test_memo_read_refuses_expired_and_stale_entries(root, recipe, index, uv_bin, tmp_path):
    from llmgw_store.build import memo as buildmemo

    first, _ = hit(root, recipe, index, uv_bin)
    fields = {f: str(first["uv_version" if f == "uv" else f]) for f in buildmemo.FIELDS}  # the memo's `uv`
    dep = tmp_path / "dep"
    dep.write_text("a")
    digest = "ab" * 32
    assert buildmemo.write(str(root), digest, fields, [str(dep)], expires=time.time() + 60)
    assert buildmemo.read(str(root), digest)["name"] == first["name"]
    dep.write_text("bb")  # another size: the fact it stood for may have changed
    assert buildmemo.read(str(root), digest) is None
    assert buildmemo.write(str(root), digest, fields, [str(dep)], expires=time.time() - 1)
    assert buildmemo.read(str(root), digest) is None
    # A value that would add a line is never written.
    assert not buildmemo.write(str(root), digest, {**fields, "engine": "x\nname=y"}, [])


def test_latest_version_entry_expires_with_the_latest_memo(tmp_path, root, index, uv_bin):
    recipe = write_recipe(tmp_path)  # no version: the latest release, asked once an hour
    doc, _ = hit(root, recipe, index, uv_bin)
    assert doc["version"] == "1.1"
    [entry] = memo_files(root)
    expires = float(dict(line.split("=", 1) for line in entry.read_text().splitlines()[1:])["expires"])
    con = sqlite3.connect(root / "var" / "db.sqlite")
    [(fetched,)] = con.execute("SELECT fetched FROM latest").fetchall()
    assert expires == pytest.approx(fetched + 3600.0)
    assert hit(root, recipe, index, uv_bin)[1]


def test_a_hit_records_its_use_for_gc_without_writing_the_index(root, recipe, index, uv_bin):
    first, _ = hit(root, recipe, index, uv_bin)
    con = sqlite3.connect(root / "var" / "db.sqlite")
    con.execute("UPDATE paths SET last_used = '2025-01-01T00:00:00Z' WHERE name = ?", (first["name"],))
    con.commit()
    assert hit(root, recipe, index, uv_bin)[1]
    stamp = root / "var" / "used" / first["name"]
    assert stamp.is_file()
    [(last,)] = con.execute("SELECT last_used FROM paths WHERE name = ?", (first["name"],)).fetchall()
    assert last == "2025-01-01T00:00:00Z"  # the hit wrote nothing to the index
    run_cli(root, "gc", "--dry-run", check=True)  # opens the index read-write: the stamps are folded in
    [(last,)] = con.execute("SELECT last_used FROM paths WHERE name = ?", (first["name"],)).fetchall()
    assert last > "2026-" and not stamp.exists()


def test_uses_fold_ignores_what_is_not_a_stamp(root, recipe, index, uv_bin, tmp_path):
    from llmgw_store.core import uses

    first, _ = hit(root, recipe, index, uv_bin)
    used = root / "var" / "used"
    used.mkdir(exist_ok=True)
    (used / "not-a-store-name").write_text("")
    target = tmp_path / "elsewhere"
    target.write_text("")
    (used / first["name"]).symlink_to(target)
    assert uses.collect(str(root)) == {}
    assert target.exists() and (used / "not-a-store-name").exists()


def test_fast_path_constants_agree_with_the_library():
    from llmgw_store.build import memo as buildmemo
    from llmgw_store.core import keys
    from llmgw_store.system.host import platform_facts

    assert buildmemo.KEY_SCHEMA == keys.SCHEMA_VERSION
    facts = platform_facts()
    assert buildmemo.host_facts() == f"{facts['os']}|{facts['machine']}|{facts['libc']}"
    for name in ("a" * 32 + "-x-1-cpu", "../etc", "a" * 32 + "-x/y", "a" * 32 + "-"):
        assert buildmemo.is_store_name(name) == keys.is_store_name(name), name


def test_fast_parse_leaves_what_it_does_not_know_to_click():
    from llmgw_store.cli.handlers import absolute
    from llmgw_store.cli.spec import parse

    assert parse(["build", "r.toml"]).given["recipe"] == "r.toml"
    assert parse(["--root=x", "--json", "build", "--as-of=2024-01-01", "r.toml", "--substituter", "s"]).given["as_of"] \
        == "2024-01-01"
    for argv in (["build"], ["build", "--help", "r.toml"], ["gc"], ["list", "x"], ["info"], ["env", "a", "b"], ["build", "r.toml", "--version", "1",
                 "--version", "2"], ["--frob", "build", "r.toml"], ["build", "a.toml", "b.toml"],
                 ["build", "r.toml", "--python-preference", "bogus"], ["build", "r.toml", "--lock-timeout", "-1"],
                 ["build", "r.toml", "--uv"]):
        assert parse(argv) is None, argv
    assert absolute("/a/./b//c/") == str(Path("/a/./b//c/").absolute())
    assert absolute("x/../y") == str(Path("x/../y").absolute())


def _run_traced(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, bool]:
    proc = subprocess.run([sys.executable, "-X", "importtime", *cli_cmd(root, *args)], capture_output=True, text=True, check=False,
                          timeout=120)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, "click" in loaded


def test_activate_and_rollback_run_without_click_and_say_what_click_says(root, recipe, index, uv_bin):
    from click.testing import CliRunner

    from llmgw_store.cli.main import cli

    a, _ = hit(root, recipe, index, uv_bin)
    b, _ = hit(root, recipe, index, uv_bin, "--as-of", "2024-06-02")
    proc, clicked = _run_traced(root, "--json", "activate", "p", a["path"])
    assert proc.returncode == 0 and not clicked
    doc = json.loads(proc.stdout)
    assert (doc["changed"], doc["generation"], doc["path"], doc["profile"]) == (True, 1, a["path"], "p")
    proc, clicked = _run_traced(root, "activate", "p", b["path"], "--lock-timeout", "5")
    assert proc.returncode == 0 and not clicked and proc.stdout == f"p: generation 2 -> {b['path']}\n"
    proc, clicked = _run_traced(root, "rollback", "p")
    assert proc.returncode == 0 and not clicked and proc.stdout == f"p: generation 2 -> 1 ({a['path']})\n"
    assert os.path.realpath(root / "profiles" / "p") == a["path"]
    # The same command through click prints the same.
    same = CliRunner().invoke(cli, ["--root", str(root), "activate", "p", a["path"]])
    proc, clicked = _run_traced(root, "activate", "p", a["path"])
    assert not clicked and proc.stdout == same.stdout == f"p: already at generation 1 -> {a['path']}\n"
    # Errors: one line and click's exit codes, still without click.
    proc, clicked = _run_traced(root, "rollback", "p", "--to", "9")
    assert proc.returncode == 2 and not clicked and proc.stderr.startswith("llmgw-store: error: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    proc, clicked = _run_traced(root, "activate", "../p", a["path"])
    assert proc.returncode == 2 and not clicked
    # What the fast path does not take is click's: a bad --to is a usage error with click's text.
    proc, clicked = _run_traced(root, "rollback", "p", "--to", "x")
    assert proc.returncode == 2 and clicked and "is not a valid integer" in proc.stderr
