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
