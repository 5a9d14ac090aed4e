"""Binary-cache gc by published roots, on real backends: it deletes exactly what no trusted roots
document holds, refuses documents it cannot trust, and loses nothing to a push racing it (real
processes, widened windows)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from llmgw_store.cache.backends import backend_for
from tests.conftest import cli_cmd, run_cli, run_in_env
from tests.support.barrier import Barrier
from tests.support.cachegc import cache_gc, fleet, names_in, publish_roots  # noqa: F401  (fleet: a fixture)
from tests.support.caches import cache, s3_server  # noqa: F401  (fixtures: the three real backends)
from tests.support.delta import delta_wheels, push2, template, world  # noqa: F401  (fixtures)


def blobs_of(url: str, key: str) -> set[str]:
    """Every blob object the format-2 object `key` needs."""
    import zstandard

    b = backend_for(url)
    meta = json.loads(b.get(f"{key}.json"))
    plan = json.loads(zstandard.ZstdDecompressor().decompress(b.get(f"blobs/{meta['plan']['digest']}")))
    return {f"blobs/{d}" for d in [meta["content_hash"], meta["plan"]["digest"], meta["manifest"]["digest"],
                                   *(x["d"] for x in plan["blobs"])]}


def test_gc_deletes_exactly_what_no_root_holds(fleet, cache):
    w, (a, b) = fleet, fleet["names"]
    push2(w, a, cache)
    push2(w, b, cache)
    roots = publish_roots(w, cache, a)
    assert roots["keys"] == [a[:32]]
    before = names_in(cache)
    keep = {f"{a[:32]}.json", "roots/node-1.json"} | blobs_of(cache, a[:32])
    assert keep < before and blobs_of(cache, b[:32]) & blobs_of(cache, a[:32])  # some blobs are shared

    young = cache_gc(w, cache)  # default grace (1d): everything is young, nothing goes
    assert young["deleted_objects"] == [] and young["deleted_blobs"] == 0 and names_in(cache) == before
    dry = cache_gc(w, cache, "--grace", "0s", "--dry-run")
    assert dry["deleted_objects"] == [f"{b[:32]}.json"] and dry["deleted_blobs"] == len(before - keep) - 1
    assert names_in(cache) == before
    done = cache_gc(w, cache, "--grace", "0s")
    assert done["deleted_objects"] == [f"{b[:32]}.json"] and done["roots"] == {"node-1": 1}
    assert names_in(cache) == keep  # exactly: what A needs and the roots document
    got = json.loads(run_cli(w["node"], "--json", "pull", a, "--from", cache, "--trusted-key",
                             str(w["keys"] / "builder-1.public"), check=True).stdout)
    assert got["pulled"] == [a] and run_cli(w["node"], "verify").returncode == 0
    gone = run_cli(w["tmp"] / "node2", "pull", b, "--from", cache, "--trusted-key", str(w["keys"] / "builder-1.public"))
    assert gone.returncode == 2 and "no cache has" in gone.stderr


def test_gc_deletes_an_unrooted_monolithic_object_whole(fleet, tmp_path):
    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    run_cli(w["root"], "push", b, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"), "--format", "1",
            check=True)
    publish_roots(w, url, a)
    done = cache_gc(w, url, "--grace", "0s")
    assert done["deleted_objects"] == [f"{b[:32]}.json", f"{b[:32]}.tar.zst"]
    assert names_in(url) == {f"{a[:32]}.json", "roots/node-1.json"} | blobs_of(url, a[:32])


@pytest.mark.parametrize("how", ["untrusted", "tampered", "other-node"])
def test_a_roots_document_it_cannot_trust_stops_gc_before_anything_is_deleted(fleet, tmp_path, how):
    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    if how == "untrusted":  # a key named node-1, but not the one gc trusts
        run_cli(w["root"], "keygen", "node-1", "--out", str(tmp_path / "evil"), check=True)
    if how == "other-node":
        run_cli(w["root"], "keygen", "node-2", "--out", str(w["keys"]), check=True)
    publish_roots(w, url, a, signer="node-2" if how == "other-node" else "node-1",
                  keys=tmp_path / "evil" if how == "untrusted" else None)
    doc_path = tmp_path / "cache" / "roots" / ("node-2.json" if how == "other-node" else "node-1.json")
    if how == "tampered":
        doc = json.loads(doc_path.read_text())
        doc["keys"] = [b[:32]]
        doc_path.write_text(json.dumps(doc))
    if how == "other-node":  # a valid document of node-2, served as node-1's
        doc_path.rename(doc_path.with_name("node-1.json"))
    before = names_in(url)
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode == 1 and "gc stopped, nothing deleted" in proc.stderr, proc.stderr
    assert names_in(url) == before and not list((tmp_path / "cache" / "gc").iterdir())


def test_no_roots_document_stops_gc_unless_allowed(fleet, tmp_path):
    """A cache with no roots document (a wrong URL, roots never published): the gc would delete
    everything past the grace, so it refuses with one line; --allow-no-roots does it."""
    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    before = names_in(url)
    for extra in ((), ("--dry-run",)):
        proc = cache_gc(w, url, "--grace", "0s", *extra, check=False)
        assert proc.returncode == 1, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and "no roots document" in errors[0] and "--allow-no-roots" in errors[0], proc.stderr
        assert names_in(url) == before and not list((tmp_path / "cache" / "gc").iterdir())
    # An empty roots folder is no roots either.
    (tmp_path / "cache" / "roots").mkdir(exist_ok=True)
    assert cache_gc(w, url, "--grace", "0s", check=False).returncode == 1 and names_in(url) == before
    done = cache_gc(w, url, "--grace", "0s", "--allow-no-roots")
    assert sorted(done["deleted_objects"]) == sorted([f"{a[:32]}.json", f"{b[:32]}.json"]) and done["roots"] == {}
    assert names_in(url) == set()


def _race_setup(w, tmp_path):
    """A is in the cache, old enough and unrooted (grace 0s): a gc deletes it, and with it the blobs
    it shares with B — unless a push of B in flight is honoured."""
    url = f"file://{tmp_path / 'cache'}"
    a, b = w["names"]
    push2(w, a, url)
    shared = blobs_of(url, a[:32])
    return url, a, b, shared


def test_a_push_in_flight_keeps_the_blobs_it_will_reference(fleet, tmp_path):
    """The push has written its pending marker and checked for a gc, and is about to skip the
    blobs the cache has: a gc now keeps those blobs. B pulls whole afterwards."""
    w = fleet
    url, a, b, a_blobs = _race_setup(w, tmp_path)
    gate = Barrier(tmp_path)
    pusher = subprocess.Popen(cli_cmd(w["root"], "push", b, "--to", url, "--secret-key",
                                      str(w["keys"] / "builder-1.secret")),
                              env={**os.environ, **gate.env("PUSH_BLOBS_PAUSE")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PUSH_BLOBS_PAUSE", pusher)  # marker written, no gc seen, the cache's blobs trusted
        assert any((tmp_path / "cache" / "pending").glob("*.json"))
        done = cache_gc(w, url, "--grace", "0s", "--allow-no-roots")
        assert done["deleted_objects"] == [f"{a[:32]}.json"]
        gate.go("PUSH_BLOBS_PAUSE")
        assert pusher.wait(120) == 0, pusher.communicate()
    finally:
        pusher.kill()
        pusher.wait()
    got = json.loads(run_cli(w["node"], "--json", "pull", b, "--from", url, "--trusted-key",
                             str(w["keys"] / "builder-1.public"), check=True).stdout)
    assert got["pulled"] == [b] and run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    # The positive control: with no push in flight and no root, the same gc deletes B and every blob.
    again = cache_gc(w, url, "--grace", "0s", "--allow-no-roots")
    assert again["deleted_objects"] == [f"{b[:32]}.json"] and not list((tmp_path / "cache" / "blobs").iterdir())


def test_a_push_during_a_gc_waits_for_it_then_uploads_what_it_deleted(fleet, tmp_path):
    """The gc has decided to delete A's blobs (which B shares) and is about to: a push of B that
    starts now waits for the gc's marker to go, then finds those blobs gone and uploads them."""
    w = fleet
    url, a, b, a_blobs = _race_setup(w, tmp_path)
    gate = Barrier(tmp_path)
    gate.go("PUSH_WAITS_FOR_GC")  # open: the push only says it has started waiting
    gc_proc = subprocess.Popen(cli_cmd(w["root"], "--json", "cache", "gc", url, "--keep-from",
                                       str(w["keys"] / "node-1.public"), "--grace", "0s", "--allow-no-roots"),
                               env={**os.environ, **gate.env("CACHE_GC_PAUSE")},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pusher = None
    try:
        gate.reached("CACHE_GC_PAUSE", gc_proc)  # past its listing, A's blobs doomed, its marker up
        pusher = subprocess.Popen(cli_cmd(w["root"], "--json", "push", b, "--to", url, "--secret-key",
                                          str(w["keys"] / "builder-1.secret")),
                                  env={**os.environ, **gate.env("PUSH_WAITS_FOR_GC")},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        gate.reached("PUSH_WAITS_FOR_GC", pusher)
        gate.go("CACHE_GC_PAUSE")
        out, err = gc_proc.communicate(timeout=120)
        assert gc_proc.returncode == 0, err
        assert json.loads(out)["deleted_objects"] == [f"{a[:32]}.json"]
        _, err = pusher.communicate(timeout=120)
        assert pusher.returncode == 0 and "waiting for the cache gc" in err, err
    finally:
        for proc in (gc_proc, pusher):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert blobs_of(url, b[:32]) <= names_in(url)
    got = json.loads(run_cli(w["node"], "--json", "pull", b, "--from", url, "--trusted-key",
                             str(w["keys"] / "builder-1.public"), check=True).stdout)
    assert got["pulled"] == [b] and run_cli(w["node"], "verify").returncode == 0


@pytest.mark.parametrize("folder", ["blobs", "pending", "gc", "roots"])
def test_gc_refuses_a_cache_folder_that_is_a_link_and_deletes_nothing_outside(fleet, tmp_path, folder):
    """A folder of a file:// cache replaced by a link to a victim directory: gc (root on a node)
    must neither list nor delete through it, whatever the victim's files are named."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = {"0" * 64, "passwd", f"{a[:32]}-1-deadbeef.json", "0123456789abcdef.json", "node-9.json"}
    for n in planted:
        (victim / n).write_text("precious")
        os.utime(victim / n, (1, 1))
    real = cache_dir / folder
    if real.exists():
        for f in real.iterdir():
            f.rename(victim / f.name)
        real.rmdir()
    real.symlink_to(victim)
    before = set(os.listdir(victim))
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode == 1 and "is a link or not a directory" in proc.stderr, proc.stderr
    assert set(os.listdir(victim)) == before and all((victim / n).read_text() == "precious" for n in planted)


def test_gc_never_deletes_a_file_whose_name_it_does_not_write(fleet, tmp_path):
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    publish_roots(w, url, a)
    odd = [cache_dir / "blobs" / ("A" * 64), cache_dir / "blobs" / "notes.txt", cache_dir / "README",
           cache_dir / "pending" / "x.json", cache_dir / "gc" / "old.json"]
    for p in odd:
        p.parent.mkdir(exist_ok=True)
        p.write_text("keep me")
        os.utime(p, (1, 1))
    push2(w, b, url)  # positive: unrooted b goes, odd names stay
    publish_roots(w, url)  # after that push (a document older would stop a gc without grace: test_cache_gc_replay.py)
    done = cache_gc(w, url, "--grace", "0s")
    assert done["deleted_objects"] == [f"{b[:32]}.json"]
    assert all(p.read_text() == "keep me" for p in odd)


def test_push_refuses_to_write_through_a_linked_cache_folder(fleet, tmp_path):
    w, (a, _) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (cache_dir / "blobs").symlink_to(victim)
    proc = run_cli(w["root"], "push", a, "--to", f"file://{cache_dir}", "--secret-key",
                   str(w["keys"] / "builder-1.secret"))
    assert proc.returncode != 0 and "is a link or not a directory" in proc.stderr, proc.stderr
    assert os.listdir(victim) == []
    (cache_dir / "roots").symlink_to(victim)
    proc = run_cli(w["root"], "push-roots", "--to", f"file://{cache_dir}", "--secret-key",
                   str(w["keys"] / "node-1.secret"), "--node", "node-1")
    assert proc.returncode != 0 and os.listdir(victim) == []


def test_a_node_key_cannot_publish_another_nodes_roots(fleet, tmp_path):
    """node-1's key signs a roots document for node-2 (both keys trusted): gc stops; push-roots
    refuses --node other than its key's name, and refuses a .public key."""
    from llmgw_store.cache import signing
    from llmgw_store.core.keys import canonical_json

    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    run_cli(w["root"], "keygen", "node-2", "--out", str(w["keys"]), check=True)
    push2(w, a, url)
    push2(w, b, url)
    assert publish_roots(w, url, a)["node"] == "node-1"  # positive: the node is the key's name
    proc = run_cli(w["root"], "push-roots", "--to", url, "--secret-key", str(w["keys"] / "node-1.secret"),
                   "--node", "node-2")
    assert proc.returncode == 2 and "differs from the secret key's name" in proc.stderr, proc.stderr
    pub = run_cli(w["root"], "push-roots", "--to", url, "--secret-key", str(w["keys"] / "node-1.public"))
    errors = [line for line in pub.stderr.splitlines() if "error:" in line]
    assert pub.returncode == 2 and len(errors) == 1 and "public key" in errors[0], pub.stderr
    doc = {"format": "llmgw-roots-2", "node": "node-2", "time": time.time(), "seq": 1, "keys": []}
    signing.sign(doc, str(w["keys"] / "node-1.secret"))
    (tmp_path / "cache" / "roots" / "node-2.json").write_bytes(canonical_json(doc))
    before = names_in(url)
    proc = run_cli(w["root"], "--json", "cache", "gc", url, "--keep-from", str(w["keys"]), "--grace", "0s")
    assert proc.returncode == 1 and "signed by: node-1" in proc.stderr and "gc stopped" in proc.stderr, proc.stderr
    assert names_in(url) == before
    (tmp_path / "cache" / "roots" / "node-2.json").unlink()  # positive: node-1's own document, both keys trusted
    done = json.loads(run_cli(w["root"], "--json", "cache", "gc", url, "--keep-from", str(w["keys"]), "--grace",
                              "0s", check=True).stdout)
    assert done["roots"] == {"node-1": 1} and done["deleted_objects"] == [f"{b[:32]}.json"]


def test_a_gc_whose_marker_expired_stops_before_deleting(fleet, tmp_path):
    """The gc ran past its marker's expiry (simulated: the marker is rewritten as an hour old while
    the gc is paused before its deletes): a push may have trusted the blobs, so it deletes nothing."""
    w = fleet
    url, a, _, _ = _race_setup(w, tmp_path)
    before = names_in(url)
    gate = Barrier(tmp_path)
    gc_proc = subprocess.Popen(cli_cmd(w["root"], "--json", "cache", "gc", url, "--keep-from",
                                       str(w["keys"] / "node-1.public"), "--grace", "0s", "--allow-no-roots"),
                               env={**os.environ, **gate.env("CACHE_GC_PAUSE")},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("CACHE_GC_PAUSE", gc_proc)  # past its listing, with A doomed
        markers = list((tmp_path / "cache" / "gc").glob("*.json"))
        assert markers
        for m in markers:
            m.write_text(json.dumps({"time": time.time() - 3700, "expires": time.time() - 100}))
        gate.go("CACHE_GC_PAUSE")
        _, err = gc_proc.communicate(timeout=120)
    finally:
        gc_proc.kill()
        gc_proc.wait()
    errors = [line for line in err.splitlines() if "error:" in line]
    assert gc_proc.returncode == 1 and len(errors) == 1 and "stopped deleting" in errors[0], err
    assert names_in(url) == before
    done = cache_gc(w, url, "--grace", "0s", "--allow-no-roots")  # positive: unpaused, it renews and deletes
    assert done["deleted_objects"] == [f"{a[:32]}.json"] and names_in(url) == set()


def test_a_planted_gc_marker_blocks_a_push_only_for_its_lock_timeout(fleet, tmp_path):
    w = fleet
    url, _, b, _ = _race_setup(w, tmp_path)
    planted = tmp_path / "cache" / "gc" / "0123456789abcdef.json"
    planted.parent.mkdir(exist_ok=True)
    planted.write_text(json.dumps({"time": time.time(), "expires": time.time() + 10 ** 9}))
    proc = run_cli(w["root"], "push", b, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"),
                   "--lock-timeout", "1")
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 75 and len(errors) == 1 and "0123456789abcdef.json" in errors[0], proc.stderr
    os.utime(planted, (time.time() - 7200, time.time() - 7200))  # unwritten for 2h: dead, whatever it claims
    run_cli(w["root"], "push", b, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"),
            "--lock-timeout", "1", check=True)
    assert blobs_of(url, b[:32]) <= names_in(url)
