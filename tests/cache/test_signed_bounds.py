"""What a compromised builder signs is read bounded: a signed object (format 1 or 2) whose
`.llmgw/contents` or `pyvenv.cfg` is a link to /dev/zero is refused at pull, and a store path here
whose metadata became such a link does not make a later delta pull read forever. Each hostile object
is forged from a genuine one and signed by the test's trusted key; each pull runs under a 2 GiB
address-space limit, so an unbounded read fails the test instead of the machine."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard
from blake3 import blake3

from llmgw_store.cache import signing
from llmgw_store.core.keys import canonical_json
from tests.conftest import build_store, cli_cmd, copy_store, run_cli, run_in_env

AS_LIMIT = 2 << 30


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("bounds"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


@pytest.fixture
def world(template, tmp_path):
    builder = copy_store(template["root"], tmp_path / "builder")
    keys = tmp_path / "keys"
    run_cli(builder, "keygen", "b1", "--out", str(keys), check=True)
    return {"builder": builder, "keys": keys, "names": template["names"], "node": tmp_path / "node", "tmp": tmp_path}


def push(w, name, fmt: int) -> Path:
    cache = w["tmp"] / f"cache{fmt}"
    run_cli(w["builder"], "push", name, "--to", f"file://{cache}", "--format", str(fmt), "--secret-key",
            str(w["keys"] / "b1.secret"), check=True)
    return cache


def pull(w, cache: Path, name: str) -> subprocess.CompletedProcess:
    """The installed command, under an address-space limit (a read of /dev/zero ends in MemoryError)."""
    argv = ["prlimit", f"--as={AS_LIMIT}", "--", *cli_cmd(w["node"], "--json", "pull", name, "--from",
                                                             f"file://{cache}", "--trusted-key",
                                                             str(w["keys"] / "b1.public"))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def sign(w, cache: Path, meta: dict) -> None:
    meta = {k: v for k, v in meta.items() if k != "signatures"}
    signing.sign(meta, str(w["keys"] / "b1.secret"))
    (cache / f"{meta['key']}.json").write_bytes(canonical_json(meta))


def refused(proc, words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and words in lines[-1] and "refusing it" in lines[-1], proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def nothing_registered(w) -> None:
    node = w["node"]
    assert [p.name for p in (node / "store").iterdir() if not p.name.startswith(".")] == []
    assert list((node / "var" / "tmp").iterdir()) == []


# --- format 1: a signed archive ----------------------------------------------------------------------

def forge_v1(w, cache: Path, name: str, edit) -> None:
    """Rewrite the members of A's signed archive with `edit(tarinfo, data) -> [(tarinfo, data)]`,
    then sign it again (the compromised builder's key is the trusted one)."""
    meta = json.loads((cache / f"{name[:32]}.json").read_text())
    archive = cache / meta["archive"]
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive.read_bytes())).read()
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            for ti, d in edit(m, data):
                dst.addfile(ti, io.BytesIO(d) if d is not None else None)
    packed = zstandard.ZstdCompressor().compress(out.getvalue())
    archive.write_bytes(packed)
    import hashlib

    meta["archive_sha256"] = hashlib.sha256(packed).hexdigest()
    meta["archive_size"] = len(packed)
    sign(w, cache, meta)


def as_link(target: str, *suffixes: str):
    def edit(m: tarfile.TarInfo, data):
        if any(m.name.endswith("/" + s) for s in suffixes):
            link = tarfile.TarInfo(m.name)
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, target, 0o777, m.mtime
            return [(link, None)]
        return [(m, data)]
    return edit


def test_format_1_contents_linked_to_dev_zero_is_refused(world):
    """Before: registered, and every later format-2 pull on the node read /dev/zero until it died."""
    a = world["names"][0]
    cache = push(world, a, 1)
    forge_v1(world, cache, a, as_link("/dev/zero", ".llmgw/contents"))  # the content hash leaves it out
    refused(pull(world, cache, a), "contents listing cannot be read as a file")
    nothing_registered(world)


def test_format_1_pyvenv_cfg_linked_to_dev_zero_is_refused(world):
    """pyvenv.cfg is in the listing: the compromised signer lists it as a link, hashes and signs."""
    a = world["names"][0]
    cache = push(world, a, 1)

    def edit(m, data):
        if m.name.endswith("/.llmgw/contents"):
            lines = [ln for ln in data.decode().split("\n") if ln]
            lines = [("l\t0\t/dev/zero\tpyvenv.cfg" if ln.endswith("\tpyvenv.cfg") else ln) for ln in lines]
            data = ("\n".join(lines) + "\n").encode()
            edit.content_hash = blake3(data).hexdigest()
            m.size = len(data)
        return as_link("/dev/zero", "pyvenv.cfg")(m, data)
    forge_v1(world, cache, a, edit)
    meta = json.loads((cache / f"{a[:32]}.json").read_text())
    # the manifest inside still names the old hash: fix that too, as a compromised builder would
    forge_v1(world, cache, a, lambda m, d: [(_manifest_hash(m, d, edit.content_hash))] if m.name.endswith(
        "/.llmgw/manifest.json") else [(m, d)])
    meta = json.loads((cache / f"{a[:32]}.json").read_text())
    meta["content_hash"] = edit.content_hash
    sign(world, cache, meta)
    refused(pull(world, cache, a), "pyvenv.cfg is not a regular file")
    nothing_registered(world)


def _manifest_hash(m: tarfile.TarInfo, data: bytes, content_hash: str):
    doc = json.loads(data)
    doc["content_hash"] = content_hash
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    m.size = len(data)
    return m, data


# --- format 2: signed blobs ----------------------------------------------------------------------------

def _blob(cache: Path, digest: str) -> Path:
    return cache / "blobs" / digest


def _put(cache: Path, data: bytes) -> dict:
    packed = zstandard.ZstdCompressor().compress(data)
    d = blake3(data).hexdigest()
    _blob(cache, d).write_bytes(packed)
    return {"digest": d, "size": len(data), "csize": len(packed)}


def test_format_2_pyvenv_cfg_linked_to_dev_zero_is_refused(world):
    """The listing makes pyvenv.cfg a link to /dev/zero (its bytes kept under another name, so the
    plan still adds up), the manifest names the new hash, all signed: before, the pull read
    /dev/zero while checking the interpreter, until it died."""
    a = world["names"][0]
    cache = push(world, a, 2)
    meta = json.loads((cache / f"{a[:32]}.json").read_text())
    dctx = zstandard.ZstdDecompressor()
    listing = dctx.decompress(_blob(cache, meta["content_hash"]).read_bytes()).decode()
    lines = [ln for ln in listing.split("\n") if ln]
    cfg = next(ln for ln in lines if ln.endswith("\tpyvenv.cfg"))
    _, size, digest, _ = cfg.split("\t")
    lines = [("l\t0\t/dev/zero\tpyvenv.cfg" if ln == cfg else ln) for ln in lines]
    lines.append(f"f\t{size}\t{digest}\tzz-pyvenv-bytes")
    new = ("\n".join(lines) + "\n").encode()
    ref = _put(cache, new)
    doc = json.loads(dctx.decompress(_blob(cache, meta["manifest"]["digest"]).read_bytes()))
    doc["content_hash"] = ref["digest"]
    mref = _put(cache, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    meta["content_hash"] = ref["digest"]
    meta["listing"] = {"size": ref["size"], "csize": ref["csize"]}
    meta["manifest"] = mref
    meta["files"] = len(lines)
    sign(world, cache, meta)
    refused(pull(world, cache, a), "pyvenv.cfg is not a regular file")
    nothing_registered(world)


def test_a_local_path_whose_contents_became_a_link_does_not_stall_a_delta_pull(world):
    """A store path here (registered before this check existed, or edited by root) whose
    `.llmgw/contents` is now a link to /dev/zero: a delta pull skips it as a source."""
    a, b = world["names"]
    cache = push(world, a, 2)
    push(world, b, 2)
    assert pull(world, cache, a).returncode == 0
    meta_dir = world["node"] / "store" / a / ".llmgw"
    meta_dir.chmod(0o755)
    (meta_dir / "contents").unlink()
    (meta_dir / "contents").symlink_to("/dev/zero")
    meta_dir.chmod(0o555)
    proc = pull(world, cache, b)
    assert proc.returncode == 0, proc.stderr
    assert run_in_env(world["node"] / "store" / b, "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert json.loads(proc.stdout)["bytes_reused"] == 0  # nothing taken from the path it could not read
    assert run_cli(world["node"], "verify", str(world["node"] / "store" / b)).returncode == 0
    assert run_cli(world["node"], "verify", str(world["node"] / "store" / a)).returncode == 1  # named


def test_genuine_objects_of_both_formats_still_pull(world, template):
    a, b = world["names"]
    assert pull(world, push(world, a, 1), a).returncode == 0
    assert pull(world, push(world, b, 2), b).returncode == 0
    assert run_cli(world["node"], "verify").returncode == 0
    assert os.path.isdir(world["node"] / "store" / a) and os.path.isdir(world["node"] / "store" / b)
