"""Content-addressed cache objects (format 2) on real backends: push, pull, delta pulls between two
neighbouring environments, and what a hostile cache or a compromised signer can serve instead."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import zstandard
from blake3 import blake3

from llmgw_store.cache import signing
from llmgw_store.cache.objects import pack_digest
from llmgw_store.core.keys import canonical_json
from tests.conftest import run_cli, run_in_env
from tests.support.barrier import Barrier
from tests.support.caches import cache, s3_server  # noqa: F401  (fixtures: the three real backends)
from tests.support.delta import (  # noqa: F401  (fixtures)
    delta_wheels,
    pull2,
    push2,
    template,
    upgrade_template,
    upgrade_world,
    world,
)


def test_push_and_pull_format_2(world, cache):
    w, (a, _) = world, world["names"]
    r = push2(w, a, cache)
    assert r["pushed"] == [a] and r["bytes_uploaded"] > 0 and r["blobs_uploaded"] > 0
    assert push2(w, a, cache)["already_there"] == [a]
    got = pull2(w, a, cache)
    assert got["pulled"] == [a] and got["path"] == str(w["node"] / "store" / a)
    assert got["bytes_fetched"] > 0 and got["files"] > 10 and got["seconds"] > 0
    assert run_in_env(w["node"] / "store" / a, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    assert run_cli(w["node"], "verify").returncode == 0  # every byte, mode and link as built
    con = sqlite3.connect(w["node"] / "var" / "db.sqlite")
    assert con.execute("SELECT outcome FROM builds").fetchall() == [("substituted",)]


def test_build_substitutes_a_format_2_object(world, template, tmp_path, uv_bin):
    w, (a, _) = world, world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    proc = run_cli(w["node"], "--json", "build", str(template["recipe"]), "--as-of", "2024-02-02", "--index-url",
                   template["index"].url, "--uv", str(uv_bin), "--substituter", url,
                   "--trusted-key", str(w["keys"] / "builder-1.public"), check=True)
    doc = json.loads(proc.stdout)
    assert doc["how"] == "substituted" and Path(doc["path"]).name == a
    assert "resolving" not in proc.stderr and run_cli(w["node"], "verify").returncode == 0


def test_delta_pull_fetches_only_what_changed(world, tmp_path):
    """A node holding the tinydep-1.0 environment pulls the tinydep-2.0 one: the files of
    tinyengine, pip's leftovers and the like are copied from the path it has; only tinydep's pack,
    the changed metadata files and the object's own listing, plan and manifest come over the wire."""
    w, (a, b) = world, world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    first = pull2(w, a, url)
    second = pull2(w, b, url)
    meta_a, meta_b = _meta(w, a), _meta(w, b)
    assert first["bytes_fetched"] == meta_a["blobs_csize"]  # the first pull: everything
    # the second: its listing, plan and manifest, and exactly the blobs holding a file A lacks
    plan_a, plan_b = _plan(w, meta_a), _plan(w, meta_b)
    held_by_a = {m for blob in plan_a["blobs"] for m in (blob["m"] or [blob["d"]])}
    lacking = [blob for blob in plan_b["blobs"] if not set(blob["m"] or [blob["d"]]) <= held_by_a]
    assert lacking and len(lacking) < len(plan_b["blobs"])
    expected = sum(blob["c"] for blob in lacking) + sum(meta_b[p]["csize"] for p in ("listing", "plan", "manifest"))
    assert second["pulled"] == [b] and second["bytes_fetched"] == expected
    assert second["bytes_reused"] >= 1 << 20  # the weights, at least
    assert second["bytes_fetched"] < 0.25 * meta_b["blobs_csize"], (second, meta_b["blobs_csize"])
    assert run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert run_cli(w["node"], "verify").returncode == 0
    # files the two share are one inode (two immutable store paths), the others are the new path's own
    weights_a = next((w["node"] / "store" / a).rglob("weights.bin"))
    weights_b = next((w["node"] / "store" / b).rglob("weights.bin"))
    assert weights_a.stat().st_ino == weights_b.stat().st_ino
    init_b = next(p for p in (w["node"] / "store" / b).rglob("__init__.py") if p.parent.name == "tinydep")
    assert init_b.stat().st_nlink == 1 and "2.0" in init_b.read_text()


def _files(tree: Path) -> dict[str, str]:
    """digest -> path of the non-empty files of a store path's listing."""
    from llmgw_store.cache.objects import read_listing

    return {e.digest: e.path for e in read_listing((tree / ".llmgw" / "contents").read_bytes())
            if e.kind in "fx" and e.size}


def test_a_minor_upgrade_fetches_about_what_changed(upgrade_world, tmp_path):
    """A node holding the environment with tinydep 1.0 pulls the one with 2.0, where one model
    directory of ten (and the version) changed: the blobs fetched hold at most 1.5x the changed
    files' compressed size (each file compressed alone, as push does) — with packs of a whole
    package it was the whole package."""
    w, (a, b) = upgrade_world, upgrade_world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    pull2(w, a, url)
    got = pull2(w, b, url)
    meta_b = _meta(w, b)
    held, new = _files(w["node"] / "store" / a), _files(w["node"] / "store" / b)
    changed = {d: p for d, p in new.items() if d not in held}
    zc = zstandard.ZstdCompressor(level=3)
    changed_csize = sum(len(zc.compress((w["node"] / "store" / b / p).read_bytes())) for p in changed.values())
    package = sum((w["node"] / "store" / b / p).stat().st_size for p in new.values() if "/tinydep/models/" in p)
    assert package > 900 << 10 and 0 < len(changed) < 0.2 * len(new)  # a small part changed
    blobs = got["bytes_fetched"] - sum(meta_b[p]["csize"] for p in ("listing", "plan", "manifest"))
    assert 0 < blobs <= 1.5 * changed_csize, (blobs, changed_csize, meta_b["blobs_csize"])
    assert got["bytes_reused"] >= package * 0.8
    assert run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert run_cli(w["node"], "verify").returncode == 0


def test_a_delta_pull_links_stamped_files_without_reading_them(world, tmp_path):
    """The first pull stamps every inode it wrote (core/stamps.py); the delta pull links the
    unchanged files to them without reading them again (bytes_reused_stamped), and stamps the
    new path's files in turn, so a third pull of a neighbour reads none of them either."""
    w, (a, b) = world, world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    first = pull2(w, a, url)
    con = sqlite3.connect(w["node"] / "var" / "db.sqlite")
    assert first["bytes_reused_stamped"] == 0 and con.execute("SELECT count(*) FROM inode_stamps").fetchone()[0] > 10
    second = pull2(w, b, url)
    assert second["bytes_reused_stamped"] >= 1 << 20  # the weights, at least
    assert second["bytes_reused_stamped"] <= second["bytes_reused"]
    assert run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert run_cli(w["node"], "verify").returncode == 0
    weights_b = next((w["node"] / "store" / b).rglob("weights.bin"))
    st = weights_b.stat()
    assert con.execute("SELECT ctime_ns FROM inode_stamps WHERE dev = ? AND ino = ?",
                       (st.st_dev, st.st_ino)).fetchone() == (st.st_ctime_ns,)  # renewed after its links


def test_a_stamped_file_tampered_in_place_is_read_and_fetched(world, tmp_path):
    """A file of a pulled path changed in place after its stamp, its mode, size and mtime put back
    (so every cheap check of the sharing rule passes): its ctime moved, so the delta pull reads
    it, finds it does not hash right and fetches the blob; the new path has the signed bytes in an
    inode of its own."""
    import os

    w, (a, b) = world, world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    pull2(w, a, url)
    victim = next((w["node"] / "store" / a).rglob("weights.bin"))
    before = victim.stat()
    good = victim.read_bytes()
    victim.chmod(0o644)
    with open(victim, "r+b") as f:
        f.write(b"\xff" * 64)  # same size
    victim.chmod(0o444)
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = victim.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_mode, after.st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_mode, before.st_ino)
    got = pull2(w, b, url)
    assert 0 < got["bytes_reused"] < 1 << 20 and got["bytes_fetched"] > 1 << 19  # the weights fetched, not reused
    weights_b = next((w["node"] / "store" / b).rglob("weights.bin"))
    assert weights_b.read_bytes() == good and weights_b.stat().st_ino != victim.stat().st_ino
    assert run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"


def test_an_object_pushed_with_the_packs_of_before_still_pulls(upgrade_world, tmp_path, monkeypatch):
    """Format compatibility: objects pushed by the code before content-defined packs (4 MiB packs
    closed in listing order) pull with this code, and a node holding one reuses its files."""
    from llmgw_store.cache import objects
    from llmgw_store.cache.push import push

    w, (a, b) = upgrade_world, upgrade_world["names"]
    url = f"file://{tmp_path / 'cache'}"
    with monkeypatch.context() as m:
        m.setattr(objects, "PACK_TARGET", 4 << 20)
        m.setattr(objects, "PACK_AVG", 1 << 62)  # no file ends a pack: the plan of before
        push([a], url, str(w["keys"] / "builder-1.secret"), root=w["root"])
    plan_a = _plan(w, _meta(w, a))
    assert max(len(blob["m"] or ()) for blob in plan_a["blobs"]) > 100  # the library in one pack
    push2(w, b, url)
    assert pull2(w, a, url)["pulled"] == [a]
    got = pull2(w, b, url)
    assert got["pulled"] == [b] and got["bytes_reused"] > 900 << 10
    assert run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert run_cli(w["node"], "verify").returncode == 0


def test_a_local_file_that_was_tampered_with_is_fetched_not_copied(world, tmp_path):
    w, (a, b) = world, world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    push2(w, b, url)
    pull2(w, a, url)
    victim = w["node"] / "store" / a / "bin" / "tinyengine"
    victim.chmod(0o755)
    victim.write_text("#!/bin/sh\necho owned\n")
    got = pull2(w, b, url)
    assert run_in_env(w["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert got["pulled"] == [b]


# --- what a hostile cache or a compromised signer serves --------------------------------------

def _cache(w):
    return w["tmp"] / "cache"


def _meta(w, name):
    return json.loads((_cache(w) / f"{name[:32]}.json").read_text())


def _blob(w, digest):
    return _cache(w) / "blobs" / digest


def _plan(w, meta):
    return json.loads(zstandard.ZstdDecompressor().decompress(_blob(w, meta["plan"]["digest"]).read_bytes()))


def _single_file_blob(w, meta):
    """The largest blob of one file (the 1 MiB file; small files may be packs of one too)."""
    plan = _plan(w, meta)
    return max((b for b in plan["blobs"] if b["m"] is None), key=lambda b: b["c"]), plan


def _resign(w, meta):
    meta = {k: v for k, v in meta.items() if k != "signatures"}
    signing.sign(meta, str(w["keys"] / "builder-1.secret"))
    (_cache(w) / f"{meta['key']}.json").write_bytes(canonical_json(meta))


def _put_blob(w, data: bytes) -> dict:
    packed = zstandard.ZstdCompressor().compress(data)
    d = blake3(data).hexdigest()
    _blob(w, d).write_bytes(packed)
    return {"digest": d, "size": len(data), "csize": len(packed)}


def _forge_listing(w, meta, edit):
    """A compromised signer's object: the listing changed by `edit`, and signed again."""
    listing = zstandard.ZstdDecompressor().decompress(_blob(w, meta["content_hash"]).read_bytes()).decode()
    new = edit(listing).encode()
    ref = _put_blob(w, new)
    meta["content_hash"] = ref["digest"]
    meta["listing"] = {"size": ref["size"], "csize": ref["csize"]}
    meta["files"] = new.count(b"\n")
    _resign(w, meta)


def _swap_blob_bytes(w, meta):
    blob, _ = _single_file_blob(w, meta)
    p = _blob(w, blob["d"])
    raw = bytearray(zstandard.ZstdDecompressor().decompress(p.read_bytes()))
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(zstandard.ZstdCompressor().compress(bytes(raw)))


def _swap_pack_member(w, meta):
    _, plan = _single_file_blob(w, meta)
    pack = next(b for b in plan["blobs"] if b["m"])
    assert pack["d"] == pack_digest(pack["m"])
    p = _blob(w, pack["d"])
    original = zstandard.ZstdDecompressor().decompress(p.read_bytes())
    for at in range(min(len(original), 64)):  # one flipped byte whose pack still fits the signed size
        raw = bytearray(original)
        raw[at] ^= 0x01
        forged = zstandard.ZstdCompressor(level=19).compress(bytes(raw))
        if len(forged) <= pack["c"]:
            break
    assert len(forged) <= pack["c"]  # within the signed size: the member digests must catch it
    p.write_bytes(forged)


def _blob_longer_than_signed(w, meta):
    blob, _ = _single_file_blob(w, meta)
    p = _blob(w, blob["d"])
    raw = zstandard.ZstdDecompressor().decompress(p.read_bytes())
    longer = zstandard.ZstdCompressor(level=19).compress(raw + b"\0" * (64 << 20))
    assert len(longer) <= blob["c"] + 8192
    p.write_bytes(longer[: blob["c"]] if len(longer) > blob["c"] else longer)
    if len(longer) <= blob["c"]:
        return
    # a bomb that fits the signed compressed size: a zstd frame of zeros, far larger inflated
    p.write_bytes(zstandard.ZstdCompressor(level=19).compress(b"\0" * (256 << 20))[: blob["c"]])


def _blob_compressed_larger_than_signed(w, meta):
    blob, _ = _single_file_blob(w, meta)
    p = _blob(w, blob["d"])
    p.write_bytes(p.read_bytes() + b"\0" * 4096)


def _blob_missing(w, meta):
    blob, _ = _single_file_blob(w, meta)
    _blob(w, blob["d"]).unlink()


def _path_with_dotdot(w, meta):
    _forge_listing(w, meta, lambda t: t + f"f\t2\t{blake3(b'hi').hexdigest()}\t../../../outside/pwned\n")


def _absolute_path(w, meta):
    _forge_listing(w, meta, lambda t: t + f"f\t2\t{blake3(b'hi').hexdigest()}\t/{w['outside']}/pwned\n")


def _through_a_symlink(w, meta):
    """`escape` -> outside, then `escape/pwned`: a file below a link of the object itself."""
    def edit(t):
        return t + f"l\t0\t{w['outside']}\tzzescape\nf\t2\t{blake3(b'hi').hexdigest()}\tzzescape/pwned\n"
    _forge_listing(w, meta, edit)


def _device(w, meta):
    _forge_listing(w, meta, lambda t: t + "o\t0\t\tzzdevice\n")


def _unknown_format(w, meta):
    meta["format"] = 3
    _resign(w, meta)


@pytest.mark.parametrize("attack, words", [
    (_swap_blob_bytes, "do not hash to their signed digest"),
    (_swap_pack_member, "do not hash to their signed digest"),
    (_blob_longer_than_signed, "its signed size"),
    (_blob_compressed_larger_than_signed, "serves more than"),
    (_blob_missing, "lacks blob"),
    (_path_with_dotdot, "'..' component"),
    (_absolute_path, "absolute"),
    (_through_a_symlink, "below something that is not a directory"),
    (_device, "only files, directories and links"),
    (_unknown_format, "upgrade llmgw-store"),
])
def test_hostile_objects_are_refused_leaving_nothing(world, attack, words):
    w, (a, _) = world, world["names"]
    push2(w, a, f"file://{_cache(w)}")
    attack(w, _meta(w, a))
    proc = pull2(w, a[:32], f"file://{_cache(w)}", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and words in lines[-1] and "internal error" not in proc.stderr, proc.stderr
    assert list(w["outside"].iterdir()) == []
    node = w["node"]
    if (node / "store").exists():
        assert list((node / "store").iterdir()) == [] and list((node / "var" / "tmp").iterdir()) == []
        assert sqlite3.connect(node / "var" / "db.sqlite").execute("SELECT count(*) FROM paths").fetchone()[0] == 0


def test_untrusted_signer_of_a_format_2_object_is_refused(world):
    w, (a, _) = world, world["names"]
    push2(w, a, f"file://{_cache(w)}")
    meta = {k: v for k, v in _meta(w, a).items() if k != "signatures"}
    signing.sign(meta, str(w["keys"] / "intruder.secret"))
    (_cache(w) / f"{a[:32]}.json").write_bytes(canonical_json(meta))
    proc = pull2(w, a, f"file://{_cache(w)}", check=False)
    assert proc.returncode == 1 and "not signed by a trusted key" in proc.stderr
    assert not Path(w["node"] / "store" / a).exists()


def test_a_streamed_blob_stops_at_its_signed_size_and_a_declared_size_is_checked_first(tmp_path):
    """The two ways a blob is inflated, on a real directory cache: streamed (large files) stops
    producing past the signed size, 1 MiB at a time; in one call (packs, small files) a frame
    declaring another size is refused before zstd allocates it."""
    from llmgw_store.base.errors import IntegrityError
    from llmgw_store.cache.backends import FileBackend
    from llmgw_store.cache.tree_fetch import BlobRef, _inflate, inflate_whole

    (tmp_path / "blobs").mkdir()
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (512 << 20))
    digest = "b" * 64
    (tmp_path / "blobs" / digest).write_bytes(bomb)
    backend = FileBackend(tmp_path)
    seen = []
    with pytest.raises(IntegrityError, match="inflates past its signed size"):
        _inflate(backend, BlobRef(digest, 4 << 20, len(bomb)), lambda d: seen.append(len(d)), "x.json")
    assert sum(seen) <= 4 << 20 and max(seen) <= 1 << 20
    with pytest.raises(IntegrityError, match="inflates past its signed size"):
        inflate_whole(backend, BlobRef(digest, 4 << 20, len(bomb)), "x.json")
    ok = zstandard.ZstdCompressor().compress(b"hello")
    (tmp_path / "blobs" / digest).write_bytes(ok)
    assert inflate_whole(backend, BlobRef(digest, 5, len(ok)), "x.json") == (b"hello", len(ok))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_pull_leaves_no_scratch_tree_behind(world, tmp_path, sig):
    """SIGTERM: the pull cleans up as on ^C and exits 143. SIGKILL: it cannot, and the next pull
    removes the pull-<pid>-* tree of the dead pid. A pull then succeeds (the positive case)."""
    import os
    import signal
    import subprocess

    from tests.conftest import cli_cmd

    a, _ = world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(world, a, url)
    run_cli(world["node"], "verify")  # creates the node's store
    tmp = world["node"] / "var" / "tmp"
    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cli_cmd(world["node"], "pull", a, "--from", url, "--trusted-key",
                                    str(world["keys"] / "builder-1.public")),
                            env={**os.environ, **gate.env("PULL_PAUSE")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PULL_PAUSE", proc)
        assert any(p.name.startswith(f"pull-{proc.pid}-") for p in tmp.iterdir())  # its scratch tree exists
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    if sig == "SIGTERM":
        assert proc.returncode == 143 and "interrupted" in err, err
        assert not [p for p in tmp.iterdir() if p.name.startswith("pull-")]
    else:
        assert [p for p in tmp.iterdir() if p.name.startswith(f"pull-{proc.pid}-")]
    got = pull2(world, a, url)
    assert got["pulled"] == [a] and not [p for p in tmp.iterdir() if p.name.startswith("pull-")]
    if sig == "SIGKILL":  # moved to the trash by the next pull's sweep (a rename), deleted by gc
        assert [p for p in (world["node"] / "var" / "trash").iterdir() if p.name.startswith(f"pull-{proc.pid}-")]


def test_a_pull_stopped_by_sigterm_keeps_what_it_fetched_for_the_next(world, tmp_path):
    """A pull stopped by SIGTERM once its first blob (the 1 MiB file: largest first, one worker)
    is written and checked exits 143 and keeps its partial tree as `resume-<key>`; the next pull
    takes that file (hashed again) instead of fetching it, and its scratch goes to the trash."""
    import os
    import signal
    import subprocess

    from tests.conftest import cli_cmd

    a, _ = world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(world, a, url)
    run_cli(world["node"], "verify")  # creates the node's store
    tmp = world["node"] / "var" / "tmp"
    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cli_cmd(world["node"], "pull", a, "--from", url, "--trusted-key",
                                    str(world["keys"] / "builder-1.public")),
                            env={**os.environ, **gate.env("PULL_BLOB_WRITTEN"), "LLMGW_STORE_PULL_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PULL_BLOB_WRITTEN", proc)
        proc.send_signal(signal.SIGTERM)
        gate.go("PULL_BLOB_WRITTEN")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143 and "the next pull of it resumes" in err, err
    assert [p.name for p in tmp.iterdir()] == [f"resume-{a[:32]}"]
    got = pull2(world, a, url)
    assert got["pulled"] == [a] and got["bytes_resumed"] >= 1 << 20
    assert got["bytes_fetched"] < _meta(world, a)["blobs_csize"] - (1 << 19)  # the 1 MiB file was not fetched again
    assert list(tmp.iterdir()) == []
    # what it did not take went to the trash with its scratch, for gc to delete
    assert [p for p in (world["node"] / "var" / "trash").iterdir() if p.name.startswith("pull-")]
    assert run_cli(world["node"], "verify").returncode == 0
    assert run_cli(world["node"], "gc").returncode == 0 and list((world["node"] / "var" / "trash").iterdir()) == []


def test_a_pull_reports_its_bytes_as_json_progress(world, tmp_path):
    """`--progress json` covers a pull: its transfer is a step of the one reporter (base/report.py),
    {"step": "pulling NAME", "done", "total", "unit": "B", "detail": "N/M files"}, not text lines of
    its own. The pull is held after its first blob until the reporter's interval has passed, so the
    next blob's update is shown."""
    import os
    import subprocess
    import time

    from tests.conftest import cli_cmd

    a, _ = world["names"]
    url = f"file://{tmp_path / 'cache'}"
    push2(world, a, url)
    run_cli(world["node"], "verify")  # creates the node's store
    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cli_cmd(world["node"], "--progress=json", "pull", a, "--from", url, "--trusted-key",
                                    str(world["keys"] / "builder-1.public")),
                            env={**os.environ, **gate.env("PULL_BLOB_WRITTEN"), "LLMGW_STORE_PULL_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PULL_BLOB_WRITTEN", proc)
        # Not a race: the step began before the barrier, and what must pass is the reporter's
        # interval (1 s) on the clock both processes read.
        held = time.monotonic()
        while time.monotonic() < held + 1.5:
            time.sleep(0.05)
        gate.go("PULL_BLOB_WRITTEN")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in err.splitlines()]
    size = _meta(world, a)["size"]
    steps = [e for e in events if e.get("step") == f"pulling {a}"]
    assert steps and all(e["unit"] == "B" and e["total"] == size for e in steps), events
    assert steps[-1].get("end") and steps[-1]["done"] == size, steps
    assert any(e.get("detail", "").endswith(" files") for e in steps), steps
    assert not any("msg" in e and e["msg"].startswith(f"pulling {a}:") for e in events)  # no text line of its own
