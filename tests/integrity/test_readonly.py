"""Commands that only look (list, info, stats, verify, generations, list-profiles) open the store
read-only: on a root that holds no store they say so and create nothing; on a store they change
no file of it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, run_cli

LOOKING = [("list",), ("stats",), ("verify",), ("list-profiles",), ("generations", "p"), ("info", "p")]


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("ro"), wheels, "2024-02-02")
    run_cli(t["root"], "activate", "p", t["paths"][0], check=True)
    yield t
    t["index"].stop()


# A root with no store yet: list, stats and verify have nothing to do (exit 0: a timer installed
# before the first build must not fail); the others name something that is not there (exit 2).
NOTHING_TO_DO = {"list", "stats", "verify"}


@pytest.mark.parametrize("args", LOOKING, ids=lambda a: a[0])
def test_looking_at_a_missing_root_creates_nothing(tmp_path, args):
    root = tmp_path / "nothing-here"
    proc = run_cli(root, *args)
    assert proc.returncode == (0 if args[0] in NOTHING_TO_DO else 2), proc.stderr
    assert proc.stderr.count("\n") == 1 and "no store at" in proc.stderr
    assert not root.exists()


# SQLite reads a WAL database through its shared-memory index (-shm, with an empty -wal beside
# it), which it creates on open even read-only so that readers and a concurrent writer agree; those
# two files carry no data of the store, and their directory's mtime moves with them.
SQLITE_READER_FILES = {"var/db.sqlite-shm", "var/db.sqlite-wal"}
# verify records its outcome for the metrics (core/oplog.py, var/ops/verify.json): the one file a
# look writes, outside everything the store holds.
OUTCOMES = "var/ops"


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under the root: kind, size, mtime and, for files, their bytes' digest."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if rel in SQLITE_READER_FILES or rel == OUTCOMES or rel.startswith(OUTCOMES + "/"):
                continue
            st = os.lstat(p)
            digest = None
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            mtime = None if rel == os.path.dirname(next(iter(SQLITE_READER_FILES))) else st.st_mtime_ns
            out[rel] = (st.st_mode, st.st_size, mtime, digest)
    return out


def test_looking_changes_no_file_of_the_store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    before = _snapshot(root)
    for args in LOOKING:
        proc = run_cli(root, "--json", *args)
        assert proc.returncode == 0, (args, proc.stderr)
        json.loads(proc.stdout)
    assert _snapshot(root) == before
