"""A check's output (which may carry a token it printed) is the store owner's alone: generation
records and the profile's history are 0600 (an older store's 0644 ones are closed up on their next
use), another local user cannot read them, and the owner still sees the output (`generations
--history`, the failing activation's error)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import copy_store, run_cli
from tests.support.users import as_user, second_user, shared_dir, shared_template

SECRET = "tok_3f9a1c0ffee"  # what a check might print: a bearer token, a URL with credentials
READ = """
import sys
for p in sys.argv[1:]:
    try:
        open(p).read()
        print(p, "read")
    except OSError as exc:
        print(p, type(exc).__name__)
"""


@pytest.fixture(scope="module")
def intruder():
    yield from second_user("llmgwco")


@pytest.fixture(scope="module")
def template(wheels):
    """tinyengine 1.0 as of two dates (tinydep 1.0, then 2.0): neighbouring environments A and B."""
    yield from shared_template(wheels, "2024-02-02", "2024-06-02")


@pytest.fixture
def store(template):
    d = shared_dir()
    root = copy_store(template["root"], d / "root")
    yield {"root": root, "paths": template["paths"]}
    shutil.rmtree(d, ignore_errors=True)


def check_printing(secret: str, code: int) -> str:
    return f"python -c \"print('connecting with {secret}'); raise SystemExit({code})\""


def test_check_output_is_readable_only_by_the_stores_owner(store, intruder):
    root, (old, new) = store["root"], store["paths"]
    run_cli(root, "activate", "p", old, "--check", check_printing(SECRET, 0), check=True)  # passed: in the record
    failed = run_cli(root, "activate", "p", new, "--check", check_printing(SECRET, 3))  # failed: in the history
    assert failed.returncode == 1 and SECRET in failed.stderr  # the owner, who ran it, sees it
    profiles = root / "profiles"
    record, history = profiles / ".p-1.record", profiles / ".p.history"
    assert SECRET in record.read_text() and SECRET in history.read_text()
    for f in (record, history):
        assert f.stat().st_mode & 0o777 == 0o600 and f.stat().st_uid == os.geteuid()
    out = as_user(intruder, READ, str(record), str(history)).stdout
    assert f"{record} PermissionError" in out and f"{history} PermissionError" in out
    # the owner reads it back through the store
    events = json.loads(run_cli(root, "--json", "generations", "p", "--history", check=True).stdout)["history"]
    assert any(SECRET in json.dumps(e) for e in events)


def test_records_an_older_store_left_readable_are_closed_up(store, intruder):
    root, (old, new) = store["root"], store["paths"]
    run_cli(root, "activate", "q", old, "--check", check_printing(SECRET, 0), check=True)
    record, history = root / "profiles" / ".q-1.record", root / "profiles" / ".q.history"
    record.chmod(0o644)  # as llmgw-store wrote them before
    history.chmod(0o644)
    run_cli(root, "generations", "q", "--history", check=True)  # reading them as the owner
    run_cli(root, "activate", "q", new, check=True)  # appending to the history
    for f in (record, history):
        assert f.stat().st_mode & 0o777 == 0o600, f
    out = as_user(intruder, READ, str(record), str(history)).stdout
    assert "read" not in out.replace("PermissionError", "")
