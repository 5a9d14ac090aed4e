"""Replay protection of cache gc lives on the gc host, not in the cache an attacker writes: an older
roots document put back with the cache's old record, or with that record deleted, or replayed before
any gc saw the newer one, stops the gc before it deletes anything (issue 32)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli
from tests.support.cachegc import cache_gc, fleet, names_in, publish_roots  # noqa: F401  (fixtures)
from tests.support.delta import delta_wheels, push2, template, world  # noqa: F401  (fixtures)


def _move_node_to_b(w, url, a, b):
    """node-1 held a (its first document, returned as bytes with the cache's old record, if any),
    a gc saw that document; then node-1 moved to b, forgot a, and published again; a gc saw that."""
    cache_dir = url[len("file://"):]
    first = publish_roots(w, url, a)
    old_doc = open(f"{cache_dir}/roots/node-1.json", "rb").read()
    assert cache_gc(w, url, "--grace", "1d")["roots"] == {"node-1": 1}
    old_seen = f"{cache_dir}/roots-seen.json"
    saved = open(old_seen, "rb").read() if shutil.os.path.exists(old_seen) else None
    run_cli(w["root"], "activate", "app", b, check=True)
    run_cli(w["root"], "generations", "app", "--forget", "1", check=True)
    second = publish_roots(w, url)
    assert second["keys"] == [b[:32]] and second["seq"] > first["seq"]
    assert cache_gc(w, url, "--grace", "1d")["roots"] == {"node-1": 1}
    return first, second, old_doc, saved


def _refused(w, url, before, *needles):
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "gc stopped, nothing deleted" in errors[0], proc.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    assert names_in(url) == before
    return errors[0]


def test_restoring_an_older_document_with_the_caches_older_record_stops_gc(fleet, tmp_path):
    """A backup restore puts back roots/node-1.json and the cache's roots-seen.json of that time:
    both agree, so a record kept in the cache cannot tell. The gc host's own record can."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    first, second, old_doc, saved = _move_node_to_b(w, url, a, b)
    (cache_dir / "roots" / "node-1.json").write_bytes(old_doc)
    if saved is not None:
        (cache_dir / "roots-seen.json").write_bytes(saved)
    _refused(w, url, names_in(url), f"sequence {first['seq']}", f"older than {second['seq']}",
             "the newest this host has seen of node-1")
    # positive: the node publishes again, the gc goes on and deletes what nobody holds
    publish_roots(w, url)
    done = cache_gc(w, url, "--grace", "0s")
    assert done["deleted_objects"] == [f"{a[:32]}.json"] and f"{b[:32]}.json" in names_in(url)


def test_deleting_the_caches_record_does_not_reset_replay_protection(fleet, tmp_path):
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    first, second, old_doc, _ = _move_node_to_b(w, url, a, b)
    (cache_dir / "roots" / "node-1.json").write_bytes(old_doc)
    (cache_dir / "roots-seen.json").unlink(missing_ok=True)
    _refused(w, url, names_in(url), f"older than {second['seq']}")
    assert not (cache_dir / "roots-seen.json").exists()  # nothing of the record lives in the cache


def test_a_replay_before_any_gc_saw_the_newer_document_stops_gc(fleet, tmp_path):
    """No gc ran yet: no sequence number to compare with. The replayed document was signed before
    b was pushed, and b is not in it: trusting it would delete b, which node-1 runs."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    publish_roots(w, url, a)
    old_doc = (cache_dir / "roots" / "node-1.json").read_bytes()
    push2(w, b, url)  # after the first document
    run_cli(w["root"], "activate", "app", b, check=True)
    run_cli(w["root"], "generations", "app", "--forget", "1", check=True)
    publish_roots(w, url)
    (cache_dir / "roots" / "node-1.json").write_bytes(old_doc)
    before = names_in(url)
    line = _refused(w, url, before, "roots/node-1.json: signed at ", f"{b[:32]}.json was pushed after it")
    assert "a replayed document, or a node that has not published since" in line
    dry = cache_gc(w, url, "--grace", "0s", "--dry-run", check=False)
    assert dry.returncode == 1 and names_in(url) == before
    # positive: within the grace, the same document is what a node that just published would show
    assert cache_gc(w, url, "--grace", "1d")["deleted_objects"] == []
    publish_roots(w, url)
    done = cache_gc(w, url, "--grace", "0s")
    assert done["deleted_objects"] == [f"{a[:32]}.json"] and f"{b[:32]}.json" in names_in(url)


def test_a_cache_rolled_back_as_a_whole_is_named_as_such(fleet, tmp_path):
    """Both nodes' documents are older than this host saw: the cache was restored from a backup."""
    w, (a, b) = fleet, fleet["names"]
    run_cli(w["root"], "keygen", "node-2", "--out", str(w["keys"]), check=True)
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)

    def publish_both():
        for node in ("node-1", "node-2"):
            run_cli(w["root"], "push-roots", "--to", url, "--secret-key", str(w["keys"] / f"{node}.secret"),
                    check=True)

    def gc(*extra, check=True):
        proc = run_cli(w["root"], "--json", "cache", "gc", url, "--keep-from", str(w["keys"] / "node-1.public"),
                       "--keep-from", str(w["keys"] / "node-2.public"), *extra, check=check)
        return json.loads(proc.stdout) if check else proc

    run_cli(w["root"], "activate", "app", a, check=True)
    publish_both()
    backup = tmp_path / "backup"
    shutil.copytree(cache_dir, backup)
    assert gc("--grace", "1d")["roots"] == {"node-1": 1, "node-2": 1}
    publish_both()
    assert gc("--grace", "1d")["roots"] == {"node-1": 1, "node-2": 1}
    shutil.rmtree(cache_dir)
    shutil.copytree(backup, cache_dir)
    before = names_in(url)
    proc = gc("--grace", "0s", check=False)
    assert proc.returncode == 1 and names_in(url) == before, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if "error" in ln][0]
    assert f"cache {url}: the roots documents of every node this host has seen there (node-1, node-2)" in line
    assert "rolled back as a whole" in line and "nothing deleted" in line


def test_a_deleted_document_of_a_node_still_kept_stops_gc(fleet, tmp_path):
    """Deleting node-1's document (another node's still there) would make the gc delete what
    node-1 runs: this host saw it, and node-1's key is still given, so the gc stops. Retired
    (its key no longer given), the gc goes on."""
    w, (a, b) = fleet, fleet["names"]
    run_cli(w["root"], "keygen", "node-2", "--out", str(w["keys"]), check=True)
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)  # node-1 and node-2 (the same store here) hold a
    keep = ["--keep-from", str(w["keys"] / "node-1.public"), "--keep-from", str(w["keys"] / "node-2.public")]
    run_cli(w["root"], "push-roots", "--to", url, "--secret-key", str(w["keys"] / "node-2.secret"), check=True)
    assert run_cli(w["root"], "cache", "gc", url, *keep, "--grace", "1d").returncode == 0  # both seen
    (cache_dir / "roots" / "node-1.json").unlink()
    before = names_in(url)
    proc = run_cli(w["root"], "cache", "gc", url, *keep, "--grace", "0s")
    assert proc.returncode == 1 and names_in(url) == before, proc.stderr
    assert "roots/node-1.json: missing, but this host has seen sequence" in proc.stderr
    assert "gc stopped, nothing deleted" in proc.stderr
    retired = run_cli(w["root"], "--json", "cache", "gc", url, "--keep-from", str(w["keys"] / "node-2.public"),
                      "--grace", "0s")
    assert retired.returncode == 0, retired.stderr
    assert json.loads(retired.stdout)["roots"] == {"node-2": 1}
    assert json.loads(retired.stdout)["deleted_objects"] == [f"{b[:32]}.json"]


@pytest.mark.parametrize("url", ["file://{cache}", "file://{cache}/", "FILE://{cache}/./",
                                 "file://{parent}//{leaf}", "file://{parent}/x/../{leaf}"])
def test_one_cache_spelled_another_way_keeps_its_marks(url, tmp_path):
    from llmgw_store.cache.seen import ANY_CACHE, cache_id

    cache = tmp_path / "gcache"
    spelled = url.format(cache=cache, parent=tmp_path, leaf="gcache")
    assert cache_id(spelled) == cache_id(f"file://{cache}") == f"file://{cache}"
    assert cache_id("https://u:p@Cache.Internal//llmgw/") == "https://cache.internal/llmgw"
    assert cache_id(ANY_CACHE) == ANY_CACHE
    assert cache_id(f"file://{tmp_path}/other") != cache_id(f"file://{cache}")
