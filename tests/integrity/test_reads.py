"""The reads the fast path answers (integrity/reads.py, through cli/fast.py): `list`, `info`, `env` print
what the full click command prints — stdout, stderr and exit code, text and --json — on a real
store; what is not the common case (a refused directory, a malformed row, an index of another
schema, a link for a store path, a target it cannot resolve) goes to the full command; and a read
loads only what a read needs. No timing is asserted (bench/bench_profiles.py measures)."""

from __future__ import annotations

import dataclasses
import os
import re
import sqlite3
from pathlib import Path

import pytest

from tests.cli.test_fastpath_parity import full, traced
from tests.conftest import build_json, run_cli
from tests.roots.test_switch import SWITCH_NEVER, loaded, regular  # noqa: F401  (regular: a fixture)

READ_NEVER = SWITCH_NEVER | {"llmgw_store.integrity.queries", "llmgw_store.app.units", "json"}


@pytest.fixture
def store(tmp_path, root, recipe, index, uv_bin):
    a = build_json(root, recipe, index, uv_bin)["path"]
    b = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"]
    run_cli(root, "activate", "p", a, check=True)
    run_cli(root, "activate", "p", b, check=True)
    run_cli(root, "rollback", "p", check=True)
    conf = tmp_path / "config.toml"
    conf.write_text(f'index_url = "{index.url}"\nuv = "{uv_bin}"\nlock_timeout = 30\n')
    env = {"LLMGW_STORE_CONFIG": str(conf), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run_cli(root, "config", env=env, check=True)  # the full command reads the file once
    return {"a": a, "b": b, "env": env}


def _untimed(stderr: str) -> str:
    """Progress lines without their `[   0.1s]` stamp (the two runs take their own time)."""
    return re.sub(r"^\[ *[0-9.]+s\] ", "[t] ", stderr, flags=re.MULTILINE)


def _both(root: Path, *args: str, env: dict) -> bool:
    """Run `args` both ways; assert they print the same and end alike. Whether the fast path answered."""
    fast, answered = traced(root, *args, env=env)
    slow = full(root, *args, env=env)
    assert (fast.stdout, _untimed(fast.stderr), fast.returncode) == \
           (slow.stdout, _untimed(slow.stderr), slow.returncode), args
    return answered


def _reads(store: dict) -> list[list[str]]:
    a, b = store["a"], store["b"]
    cases = [["list"], ["info", a], ["info", os.path.basename(b)], ["info", os.path.basename(a)[:32]], ["info", "p"],
             ["info", "p@2"], ["-q", "info", "p@1"], ["env", "p"], ["env", "p@1"], ["env", b],
             ["env", os.path.basename(a)[:32]]]
    return cases + [["--json", *c] for c in cases] + [["-v", "list"], ["list", "--json"]]


def test_the_reads_answer_as_the_full_command(root, store):
    for args in _reads(store):
        assert _both(root, *args, env=store["env"]), (args, "the fast path did not answer")
    # What the full command refuses, it refuses: the same line and exit code, from the full command.
    for args in (["info", "nope"], ["info", "p@9"], ["info", "p@x"], ["--json", "info", "q@1"], ["info", ""],
                 ["info", "/elsewhere/" + os.path.basename(store["a"])], ["info", "a" * 32], ["env", "nope"],
                 ["env", "p@9"], ["--json", "env", "q"]):
        assert not _both(root, *args, env=store["env"]), args


def test_what_is_not_the_common_case_goes_to_the_full_command(root, store, tmp_path):
    env = store["env"]
    # No store at the root: `list` says there is nothing to list, `info` that there is no store.
    empty = tmp_path / "nothing"
    assert not _both(empty, "list", env=env)
    assert not _both(empty, "info", "p", env=env)
    # A store path that is a link: the full command says what it finds there.
    name = os.path.basename(store["b"])
    moved = tmp_path / "moved"
    os.rename(store["b"], moved)
    os.symlink(moved, store["b"])
    assert not _both(root, "info", name, env=env)
    assert _both(root, "list", env=env)  # a listing reads no store path
    os.unlink(store["b"])
    os.rename(moved, store["b"])
    # A directory of the store others may write in: refused by both (the full command says so).
    os.chmod(root / "var" / "log", 0o777)
    assert not _both(root, "list", env=env)
    os.chmod(root / "var" / "log", 0o700)
    assert _both(root, "list", env=env)
    # A malformed row: the full `list` skips it and says so.
    db = sqlite3.connect(root / "var" / "db.sqlite")
    with db:
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute("UPDATE paths SET name = '../x' WHERE name = ?", (name,))
    db.close()
    assert not _both(root, "list", env=env)
    assert not _both(root, "info", os.path.basename(store["b"])[:32], env=env)
    # An index of another schema version: the full command says to migrate it.
    db = sqlite3.connect(root / "var" / "db.sqlite")
    db.execute("PRAGMA user_version = 99")
    db.close()
    assert not _both(root, "list", env=env)


@pytest.mark.parametrize("layout", ["editable", "regular"])
def test_a_read_loads_only_what_a_read_needs(root, store, regular, layout):
    where = regular if layout == "regular" else None
    for args in (["list"], ["--json", "list"], ["info", "p"], ["--json", "info", store["a"]],
                 ["info", os.path.basename(store["b"])[:32]], ["env", "p"], ["--json", "env", "p@1"]):
        proc, names = loaded(root, *args, env=store["env"], regular=where)
        assert proc.returncode == 0, proc.stderr
        assert "llmgw_store.integrity.reads" in names, (args, "the fast path's read did not answer")
        assert not names & READ_NEVER, (args, sorted(names & READ_NEVER))


def test_the_reads_agree_with_the_modules_they_stand_in_for():
    from llmgw_store.core import index
    from llmgw_store.core.layout import Layout
    from llmgw_store.integrity import queries, reads

    layout = Layout.at("/R")
    assert reads.DIRS == tuple((str(p.relative_to("/R")) if p != layout.root else "", m) for p, m in layout.dir_modes())
    assert reads.PATH_FIELDS == tuple(f.name for f in dataclasses.fields(queries.PathRow))
    assert reads.BUILD_FIELDS == tuple(f.name for f in dataclasses.fields(index.BuildLogEntry))


def test_env_quotes_as_shlex_does():
    import shlex

    from llmgw_store.integrity.reads import shell_quoted

    for s in ("", "a", "/x/y-1.0_b+c@d%e=f:g,h", "a b", "it's", "$HOME", "a\nb", "é", "*", "-", "'", "\"", "a'b'c"):
        assert shell_quoted(s) == shlex.quote(s), s


# -- generations PROFILE and config (the fast path's listing, issue 33) ---------------------------------


def _generations(store: dict) -> list[list[str]]:
    cases = [["generations", "p"], ["generations", "p", "--history"], ["-q", "generations", "p", "--dry-run"],
             ["generations", "p", "--substituter", "http://127.0.0.1:9/c", "--substitute-only"]]
    return cases + [["--json", *c] for c in cases]


def test_generations_lists_as_the_full_command(root, store):
    env = store["env"]
    for args in _generations(store):
        assert _both(root, *args, env=env), (args, "the fast path did not answer")
    # A deleted generation (its record kept), then collected: cold, with its way back.
    proc, answered = traced(root, "generations", "p", "--delete", "2", env=env)
    assert proc.returncode == 0 and not answered, proc.stderr  # a deletion: the full command's
    assert _both(root, "generations", "p", env=env)
    run_cli(root, "gc", env=env, check=True)
    for args in _generations(store):
        assert _both(root, *args, env=env), (args, "the fast path did not answer")
    # What the full command refuses, it refuses (from the full command).
    for args in (["generations", "q"], ["--json", "generations", "nope"], ["generations", "P"],
                 ["generations", "p-1-link"]):
        assert not _both(root, *args, env=env), args


def test_generations_leaves_what_is_not_the_common_case(root, store):
    env = store["env"]
    profiles = root / "profiles"
    # A history others may read: the full command closes it up (and lists).
    os.chmod(profiles / ".p.history", 0o644)
    assert not _both(root, "generations", "p", "--history", env=env)
    assert _both(root, "generations", "p", "--history", env=env)
    # A torn last line of the history is skipped by both.
    with open(profiles / ".p.history", "ab") as f:
        f.write(b'{"event": "activate", "at": "2026')
    assert _both(root, "--json", "generations", "p", "--history", env=env)
    # A summary that is not the records key's: the full command reads the records themselves.
    summary = profiles / ".p.summary"
    summary.write_bytes(b"0" * 64 + summary.read_bytes()[64:])
    assert not _both(root, "--json", "generations", "p", env=env)
    # The index without a generation the links have: the full command says so on stderr.
    db = sqlite3.connect(root / "var" / "db.sqlite")
    with db:
        db.execute("DELETE FROM generations WHERE profile = 'p' AND number = 2")
    db.close()
    assert not _both(root, "generations", "p", env=env)


def test_config_shows_as_the_full_command(root, store, tmp_path):
    env = store["env"]
    for args in (["config"], ["--json", "config"], ["config", "--progress", "json"], ["-q", "config"],
                 ["--containment", "subreaper", "config"]):
        assert _both(root, *args, env=env), (args, "the fast path did not answer")
    bad = {**env, "LLMGW_STORE_LOCK_TIMEOUT": "x", "LLMGW_STORE_INDEX_URL": "http://u:secret@127.0.0.1:9/simple"}
    assert _both(root, "--json", "config", env=bad)
    none = {**env, "LLMGW_STORE_CONFIG": ""}
    assert _both(root, "config", env=none)
    absent = {**env, "LLMGW_STORE_CONFIG": str(tmp_path / "absent.toml")}
    assert not _both(root, "config", env=absent)  # a file named that is not there: the full command says so
    unknown = tmp_path / "new.toml"
    unknown.write_text('lock_timeout = 3\n')
    assert not _both(root, "config", env={**env, "LLMGW_STORE_CONFIG": str(unknown)})  # parsed once by the full one
    assert _both(root, "config", env={**env, "LLMGW_STORE_CONFIG": str(unknown)})


def test_generations_and_config_load_what_a_read_needs(root, store, regular):
    for args in (["generations", "p"], ["--json", "generations", "p", "--history"]):
        proc, names = loaded(root, *args, env=store["env"], regular=regular)
        assert proc.returncode == 0, proc.stderr
        assert "llmgw_store.integrity.reads" in names, (args, "the fast path's read did not answer")
        assert not names & READ_NEVER, (args, sorted(names & READ_NEVER))
    proc, names = loaded(root, "config", env=store["env"], regular=regular)
    assert proc.returncode == 0 and not names & READ_NEVER and "_sqlite3" not in names, sorted(names & READ_NEVER)


def test_the_listing_agrees_with_the_modules_it_stands_in_for():
    from llmgw_store.integrity import reads
    from llmgw_store.roots import profiles, records

    assert reads.COMES_FROM == profiles.COMES_FROM
    assert reads.HISTORY_MAX_BYTES == records.HISTORY_MAX_BYTES
    assert reads._SHOWN == tuple(records.Shown.__dataclass_fields__)
    for t in (0.0, 1.5, 1700000000.9999996, 1700000000.4999995, 1733356800.000001, 1.9999994):
        assert reads._utc(t) == profiles._time_of(t), t


def test_jsontext_says_an_unterminated_string_is_not_json():
    """Without json.decoder loaded, _json's scanner ends an unterminated string in a SystemError;
    system/jsontext.loads says ValueError, as json.loads does (a torn history line is skipped)."""
    code = ("import sys; from llmgw_store.system import jsontext\n"
            "for text in (b'{\"at\": \"2026', b'\"abc', b'[\"x'):\n"
            "    try:\n        jsontext.loads(text)\n    except ValueError:\n        pass\n"
            "assert 'json.decoder' not in sys.modules; print('ok')")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert proc.stdout == "ok\n", proc.stderr
