"""cache gc keeps what a release points at: the object a current release pointer names, and the
keys of its history (a fleet-wide rollback by `release set` to an older key still finds it), once
the pointer checks out against the keys gc is given. A pointer that fails its checks stops the gc,
deleting nothing, with one line. The marks gc keeps (roots and releases) are the host's one record,
ROOT/var/seen.json (cache/seen.py)."""

from __future__ import annotations

import json

from tests.conftest import run_cli
from tests.support.cachegc import cache_gc, fleet, names_in, publish_roots  # noqa: F401  (fixtures)
from tests.support.delta import delta_wheels, push2, template, world  # noqa: F401  (fixtures)


def _set(w, release, target, url):
    return json.loads(run_cli(w["root"], "--json", "release", "set", release, target, "--to", url, "--secret-key",
                              str(w["keys"] / "builder-1.secret"), check=True).stdout)


def _builder(w):
    return ("--trusted-key", str(w["keys"] / "builder-1.public"))


def _stopped(w, url, *extra):
    before = names_in(url)
    proc = cache_gc(w, url, *_builder(w), "--grace", "0s", *extra, check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "gc stopped, nothing deleted" in errors[0], proc.stderr
    assert names_in(url) == before
    return errors[0]


def test_an_object_only_a_release_names_survives_cache_gc(fleet, tmp_path):
    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)  # node-1 runs a; only the release names b
    first = _set(w, "prod", b, url)
    dry = cache_gc(w, url, *_builder(w), "--grace", "0s", "--dry-run")
    assert dry["why_kept"][f"{b[:32]}.json"] == "held by release prod" and dry["deleted_objects"] == []
    done = cache_gc(w, url, *_builder(w), "--grace", "0s")
    assert done["deleted_objects"] == [] and f"{b[:32]}.json" in names_in(url)

    # The release moves to a: b stays, in its history, for a fleet-wide rollback (release set prod b).
    _set(w, "prod", a, url)
    done = cache_gc(w, url, *_builder(w), "--grace", "0s", "--dry-run")
    assert done["why_kept"][f"{b[:32]}.json"] == "held by release prod (an earlier pointer, for rollback)"
    assert done["deleted_objects"] == []
    assert cache_gc(w, url, *_builder(w), "--grace", "0s")["deleted_objects"] == []

    # The one record of marks on this host, var/seen.json: roots per cache, releases per release
    # (whichever cache served them: "*").
    marks = json.loads((w["root"] / "var" / "seen.json").read_text())["marks"]
    assert set(marks[url]) == {"roots"} and marks["*"]["release"]["prod"]["seq"] > first["seq"]
    assert not (w["root"] / "var" / "cache-gc").exists()


def test_without_the_release_the_object_goes(fleet, tmp_path):
    """The positive control: the same cache with no release pointer; b, named by nothing, is deleted."""
    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    assert cache_gc(w, url, *_builder(w), "--grace", "0s")["deleted_objects"] == [f"{b[:32]}.json"]


def test_a_tampered_release_pointer_stops_cache_gc(fleet, tmp_path):
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    _set(w, "prod", b, url)
    pointer = cache_dir / "releases" / "prod.json"
    genuine = pointer.read_bytes()
    doc = json.loads(genuine)
    doc["version"] = "9.9"  # any field changed: the signature no longer holds
    pointer.write_text(json.dumps(doc))
    line = _stopped(w, url)
    assert "releases/prod.json" in line and "signature" in line, line
    _stopped(w, url, "--dry-run")

    # Signed, but by a key gc was not given (the builder's key is not among --keep-from): it stops too.
    pointer.write_bytes(genuine)
    before = names_in(url)
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode == 1 and names_in(url) == before, proc.stderr
    assert "releases/prod.json" in proc.stderr and "not signed by a trusted key" in proc.stderr
    # positive: the genuine pointer, its signer's key given: the gc goes on
    assert cache_gc(w, url, *_builder(w), "--grace", "0s")["deleted_objects"] == []


def test_a_replayed_release_pointer_stops_cache_gc(fleet, tmp_path):
    """An older pointer put back (a backup restored) after this host saw the newer one: trusting it
    would drop the newer key from what gc keeps."""
    w, (a, b) = fleet, fleet["names"]
    cache_dir = tmp_path / "cache"
    url = f"file://{cache_dir}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    _set(w, "prod", a, url)
    old = (cache_dir / "releases" / "prod.json").read_bytes()
    newer = _set(w, "prod", b, url)
    assert cache_gc(w, url, *_builder(w), "--grace", "1d")["deleted_objects"] == []  # this host sees the newer
    (cache_dir / "releases" / "prod.json").write_bytes(old)
    line = _stopped(w, url)
    assert "releases/prod.json" in line and f"older than {newer['seq']}" in line, line


def test_two_gcs_at_once_never_lower_a_mark_nor_delete_on_a_stale_view(fleet, tmp_path):
    """gc A has read node-1's first document (a held, b doomed) and waits before its deletes; node-1
    moves to b and publishes again; gc B records that newer document and deletes a. A, let go, finds
    under the record's lock that its document is older than the mark: it stops, deleting nothing
    (b, which node-1 runs now, stays), and the mark stays at the newer document."""
    import os
    import subprocess

    from tests.conftest import cli_cmd
    from tests.support.barrier import Barrier

    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    gate = Barrier(tmp_path)
    first = subprocess.Popen(cli_cmd(w["root"], "--json", "cache", "gc", url, "--keep-from",
                                     str(w["keys"] / "node-1.public"), "--grace", "0s"),
                             env={**os.environ, **gate.env("CACHE_GC_PAUSE")},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("CACHE_GC_PAUSE", first)  # its view: node-1 holds a; b doomed
        run_cli(w["root"], "activate", "app", b, check=True)
        run_cli(w["root"], "generations", "app", "--forget", "1", check=True)
        newer = publish_roots(w, url)
        assert newer["keys"] == [b[:32]]
        assert cache_gc(w, url, "--grace", "0s")["deleted_objects"] == [f"{a[:32]}.json"]
        before = names_in(url)
        gate.go("CACHE_GC_PAUSE")
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 1, err
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert len(errors) == 1 and f"older than {newer['seq']}" in errors[0], err
    assert "gc stopped, nothing deleted" in errors[0]
    assert names_in(url) == before and f"{b[:32]}.json" in before
    marks = json.loads((w["root"] / "var" / "seen.json").read_text())["marks"][url]
    assert marks["roots"]["node-1"]["seq"] == newer["seq"]


def test_a_damaged_record_of_marks_stops_cache_gc(fleet, tmp_path):
    """The host's one record is read bounded; one that does not parse stops the gc before anything
    is deleted (a lost record would let a replay through), with one line saying how to start over."""
    w, (a, b) = fleet, fleet["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    publish_roots(w, url, a)
    assert cache_gc(w, url, "--grace", "1d")["deleted_objects"] == []
    record = w["root"] / "var" / "seen.json"
    record.write_text("{not json")
    before = names_in(url)
    proc = cache_gc(w, url, "--grace", "0s", check=False)
    assert proc.returncode != 0 and names_in(url) == before, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "not a record of the signed documents seen; move it away" in errors[0], proc.stderr
    record.unlink()  # positive: moved away, the record starts over and the gc goes on
    assert cache_gc(w, url, "--grace", "0s")["deleted_objects"] == [f"{b[:32]}.json"]
