"""A push of an object the cache holds already repairs it: a lost blob, garbage metadata, metadata
signed by another key (key rotation), a blob planted or rotted to another size. Real file://
caches, the real CLI; the pull after each repair is the proof."""

from __future__ import annotations

import json
import random

from blake3 import blake3

from tests.conftest import run_cli
from tests.support.caches import push as push1
from tests.support.delta import delta_wheels, pull2, push2, template, world  # noqa: F401  (fixtures)

WEIGHTS = blake3(random.Random(1).randbytes(1 << 20)).hexdigest()  # tinyengine's blob of its own (delta.py)


def _setup(w, tmp_path):
    cache = tmp_path / "cache"
    return cache, f"file://{cache}"


def _push_with(w, name, url, key, *extra):
    return json.loads(run_cli(w["root"], "--json", "push", name, "--to", url, "--secret-key",
                              str(w["keys"] / f"{key}.secret"), *extra, check=True).stdout)


def _pull_fails(w, name, url, key="builder-1"):
    proc = run_cli(w["node"], "pull", name, "--from", url, "--trusted-key", str(w["keys"] / f"{key}.public"))
    return proc.returncode != 0 and proc.stderr.strip().splitlines()[-1]


def test_push_again_uploads_a_blob_the_cache_lost(world, tmp_path):
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    push2(w, a, url)
    (cache / "blobs" / WEIGHTS).unlink()
    assert "lacks blob" in _pull_fails(w, a, url)  # "… (push it again)"
    proc = run_cli(w["root"], "--json", "push", a, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"),
                   check=True)
    again = json.loads(proc.stdout)
    assert again["repaired"] == [a] and again["already_there"] == [] and again["blobs_uploaded"] == 1
    assert "repaired" in proc.stderr and "1 blob missing" in proc.stderr
    assert pull2(w, a, url)["pulled"] == [a]


def test_push_again_rewrites_garbage_metadata(world, tmp_path):
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    push2(w, a, url)
    meta = cache / f"{a[:32]}.json"
    good = meta.read_bytes()
    meta.write_text('{"hello":1}')
    assert _pull_fails(w, a, url)
    again = push2(w, a, url)
    assert again["repaired"] == [a] and again["blobs_uploaded"] == 0  # the blobs were sound: only metadata
    assert meta.read_bytes() == good  # signatures are deterministic: exactly what the first push wrote
    assert pull2(w, a, url)["pulled"] == [a]


def test_push_again_with_a_new_key_signs_with_it(world, tmp_path):
    """docs/fleet.md "Key rotation": push again signed by builder-2 (builder-1's signature stays until
    --drop-signature: tests/cache/test_key_rotation.py), then nodes trust builder-2 only."""
    w, (a, _) = world, world["names"]
    run_cli(w["root"], "keygen", "builder-2", "--out", str(w["keys"]), check=True)
    cache, url = _setup(w, tmp_path)
    push2(w, a, url)
    again = _push_with(w, a, url, "builder-2")
    assert again["repaired"] == [a] and again["blobs_uploaded"] == 0
    doc = json.loads((cache / f"{a[:32]}.json").read_text())
    assert [s["key"] for s in doc["signatures"]] == ["builder-1", "builder-2"]
    _push_with(w, a, url, "builder-2", "--drop-signature", "builder-1")
    assert _pull_fails(w, a, url, "builder-1")  # builder-1 alone no longer signs it
    proc = run_cli(w["node"], "--json", "pull", a, "--from", url, "--trusted-key", str(w["keys"] / "builder-2.public"),
                   check=True)
    assert json.loads(proc.stdout)["pulled"] == [a]


def test_an_intact_object_is_renewed_not_uploaded(world, tmp_path):
    """The positive case beside the repairs: nothing to repair, nothing uploaded but the small blobs."""
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    push2(w, a, url)
    meta = cache / f"{a[:32]}.json"
    before, weights = meta.read_bytes(), (cache / "blobs" / WEIGHTS).stat()
    proc = run_cli(w["root"], "--json", "push", a, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"),
                   check=True)
    again = json.loads(proc.stdout)
    assert again["already_there"] == [a] and again["repaired"] == [] and again["blobs_uploaded"] == 0
    assert "renewed" in proc.stderr and "repaired" not in proc.stderr
    assert meta.read_bytes() == before
    assert (cache / "blobs" / WEIGHTS).stat().st_mtime_ns == weights.st_mtime_ns  # not written again
    assert not list((cache / "pending").iterdir())


def test_a_blob_planted_before_the_first_push_is_overwritten(world, tmp_path):
    """A cache writer plants bytes under a predictable blob name (the blake3 of a public wheel's
    file) before the builder's first push: its size is not the size this push uploads."""
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / WEIGHTS).write_bytes(b"garbage\n")
    first = push2(w, a, url)
    assert first["pushed"] == [a] and first["blobs_uploaded"] > 1
    assert (cache / "blobs" / WEIGHTS).read_bytes() != b"garbage\n"
    assert pull2(w, a, url)["pulled"] == [a]


def test_a_blob_rotted_to_another_size_is_replaced_on_push_again(world, tmp_path):
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    push2(w, a, url)
    blob = cache / "blobs" / WEIGHTS
    blob.write_bytes(blob.read_bytes()[:-100])
    assert _pull_fails(w, a, url)
    proc = run_cli(w["root"], "--json", "push", a, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"),
                   check=True)
    assert json.loads(proc.stdout)["repaired"] == [a] and "1 blob of the wrong size" in proc.stderr
    assert pull2(w, a, url)["pulled"] == [a]


def test_same_size_corruption_needs_rewrite_blobs(world, tmp_path):
    """What the size check cannot see (docs/fleet.md): a blob of the right size and the wrong bytes.
    Pulls refuse it by digest; `push --rewrite-blobs` uploads every blob again."""
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    push2(w, a, url)
    blob = cache / "blobs" / WEIGHTS
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert _pull_fails(w, a, url)
    assert push2(w, a, url)["already_there"] == [a]  # the documented limit
    again = _push_with(w, a, url, "builder-1", "--rewrite-blobs")
    assert again["repaired"] == [a] and again["blobs_uploaded"] >= 2
    assert pull2(w, a, url)["pulled"] == [a]


def test_format_1_push_again_restores_a_lost_archive(world, tmp_path):
    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    secret = w["keys"] / "builder-1.secret"
    assert push1(w["root"], a, url, secret)["pushed"] == [a]
    assert push1(w["root"], a, url, secret)["already_there"] == [a]  # positive: intact, renewed
    (cache / f"{a[:32]}.tar.zst").unlink()
    assert _pull_fails(w, a, url)
    assert push1(w["root"], a, url, secret)["repaired"] == [a]
    assert pull2(w, a, url)["pulled"] == [a]


def test_a_sound_blob_of_another_size_is_kept(world, tmp_path):
    """The positive case beside the planted blob: a valid frame of the right bytes that another zstd
    (here with a checksum) wrote, at another size than this push's, is kept as it is: objects signed
    with its size need it."""
    import zstandard

    w, (a, _) = world, world["names"]
    cache, url = _setup(w, tmp_path)
    (cache / "blobs").mkdir(parents=True)
    data = random.Random(1).randbytes(1 << 20)
    other = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)  # a checksummed frame
    assert len(other) != len(zstandard.ZstdCompressor(level=3).compress(data))  # another size than push's
    (cache / "blobs" / WEIGHTS).write_bytes(other)
    first = push2(w, a, url)
    assert first["pushed"] == [a] and first["bytes_shared"] >= len(other)
    assert (cache / "blobs" / WEIGHTS).read_bytes() == other
    assert pull2(w, a, url)["pulled"] == [a]
    assert push2(w, a, url)["already_there"] == [a]  # and a push again renews it
