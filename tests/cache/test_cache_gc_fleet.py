"""Cache gc that a fleet can trust: re-pushed objects are renewed, replayed or planted roots
documents stop the gc before it deletes anything, and a dry run says why each object is kept."""

from __future__ import annotations

import json
import os
import time

import pytest

from llmgw_store.cache import signing
from llmgw_store.core.keys import canonical_json
from tests.conftest import run_cli
from tests.support.cachegc import cache_gc, fleet, names_in, publish_roots  # noqa: F401  (fixtures)
from tests.support.delta import delta_wheels, push2, template, world  # noqa: F401  (fixtures)

DAY = 86400


def _age(cache_dir, key: str, seconds: float) -> None:
    """Make the object `key` (its metadata) look written `seconds` ago."""
    t = time.time() - seconds
    os.utime(cache_dir / f"{key}.json", (t, t))


def test_a_push_of_an_object_already_there_renews_it(fleet, tmp_path):
    """An object pushed two days ago and pushed again now (a rollout of the same build) is young
    again: a gc with a one-day grace keeps it. Before renewal, that gc deleted what was being
    rolled out."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, b)  # node-1 holds b; nobody holds a yet
    _age(cache_dir, a[:32], 2 * DAY)
    dry = cache_gc(w, url, "--grace", "1d", "--dry-run")
    assert dry["deleted_objects"] == [f"{a[:32]}.json"]  # the positive control: old and unrooted, it would go
    again = push2(w, a, url)
    assert again["already_there"] == [a] and again["pushed"] == []
    done = cache_gc(w, url, "--grace", "1d")
    assert done["deleted_objects"] == [] and done["why_kept"][f"{a[:32]}.json"].startswith("younger than the grace")
    assert not list((cache_dir / "pending").iterdir())  # the renewal's marker is gone
    got = run_cli(w["node"], "--json", "pull", a, "--from", url, "--trusted-key", str(w["keys"] / "builder-1.public"))
    assert got.returncode == 0, got.stderr


def test_a_replayed_older_roots_document_stops_gc(fleet, tmp_path):
    """node-1 held a, then moved to b. Its older document (genuinely signed) put back in the cache
    would make the gc delete b, which node-1 runs now: the gc refuses it and deletes nothing."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    first = publish_roots(w, url, a)
    old_doc = (cache_dir / "roots" / "node-1.json").read_bytes()
    assert cache_gc(w, url, "--grace", "1d")["roots"] == {"node-1": 1}  # seen: the first document
    run_cli(w["root"], "activate", "app", b, check=True)
    run_cli(w["root"], "generations", "app", "--forget", "1", check=True)  # no way back to a: not published
    second = publish_roots(w, url)
    assert second["seq"] > first["seq"] and second["keys"] == [b[:32]]
    assert cache_gc(w, url, "--grace", "1d")["roots"] == {"node-1": 1}  # seen: the second
    (cache_dir / "roots" / "node-1.json").write_bytes(old_doc)  # the replay
    before = names_in(url)
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert f"roots/node-1.json: sequence {first['seq']}" in line and f"older than {second['seq']}" in line
    assert "(a replayed or restored document); refusing it (gc stopped, nothing deleted)" in line
    assert names_in(url) == before
    # the node publishes again: the gc goes on, and keeps what the node runs now
    publish_roots(w, url)
    done = cache_gc(w, url, "--grace", "0s")
    assert done["deleted_objects"] == [f"{a[:32]}.json"] and f"{b[:32]}.json" in names_in(url)


@pytest.mark.parametrize("how", ["link", "fifo", "directory", "old-format"])
def test_a_roots_document_that_is_no_signed_file_stops_gc(fleet, tmp_path, how):
    """A roots document that is a link (even to a genuine document), a FIFO, a directory, or one
    without a sequence number: the gc cannot trust what the node holds, so it deletes nothing.
    Before, a link was left out of the listing and the node's paths were deleted."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    doc_path = cache_dir / "roots" / "node-1.json"
    genuine = tmp_path / "elsewhere.json"
    os.replace(doc_path, genuine)
    if how == "link":
        doc_path.symlink_to(genuine)
    elif how == "fifo":
        os.mkfifo(doc_path)
    elif how == "directory":
        doc_path.mkdir()
    else:
        doc = json.loads(genuine.read_text())
        doc = {k: v for k, v in doc.items() if k not in ("seq", "signatures")} | {"format": "llmgw-roots-1"}
        signing.sign(doc, str(w["keys"] / "node-1.secret"))
        doc_path.write_bytes(canonical_json(doc))
    before = names_in(url)
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode == 1 and "roots/node-1.json: " in proc.stderr, proc.stderr
    assert "gc stopped, nothing deleted" in proc.stderr
    if how == "old-format":
        assert "without a sequence number" in proc.stderr and "push-roots" in proc.stderr
    assert names_in(url) == before and f"{a[:32]}.json" in before


def test_dry_run_says_why_each_object_is_kept(fleet, tmp_path):
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    _age(cache_dir, a[:32], 2 * DAY)
    proc = run_cli(w["root"], "cache", "gc", url, "--keep-from", str(w["keys"] / "node-1.public"), "--dry-run",
                   check=True)
    out = proc.stdout.splitlines()
    assert f"keep {a[:32]}.json: held by the roots of node-1" in out
    assert any(ln.startswith(f"keep {b[:32]}.json: younger than the grace (written ") for ln in out), out
    doc = cache_gc(w, url, "--grace", "0s", "--dry-run")
    assert doc["why_kept"] == {f"{a[:32]}.json": "held by the roots of node-1"}
    assert doc["deleted_objects"] == [f"{b[:32]}.json"]
