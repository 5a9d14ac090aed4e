"""A binary cache is hostile until checked: nothing from a cache object (its metadata's name, key,
references, sizes; its archive) is used before the metadata is bounded, well-formed, signed by a
trusted key and bound to the key asked for. Each attack is made on real caches (a directory, an
HTTP server, an S3 server on 127.0.0.1) and run through the installed command; each checks the
refusal and that nothing changed outside the store root."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import tarfile
from pathlib import Path

import pytest

from llmgw_store.base.errors import IntegrityError
from llmgw_store.cache import signing
from llmgw_store.cache.backends import backend_for
from tests.conftest import build_store, copy_store, run_cli, run_in_env
from tests.support.caches import cache, push, s3_server  # noqa: F401  (fixtures: the three real backends)

OTHER_KEY = "0" * 32  # a well-formed key no object of the cache has
MiB = 1 << 20


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    """tinyengine 1.0 built as of two dates: two genuine objects with different keys."""
    t = build_store(tmp_path_factory.mktemp("trust"), wheels, "2024-02-02", "2024-03-03")
    yield t
    t["index"].stop()


@pytest.fixture
def world(template, tmp_path):
    """A builder store with keys, a file:// cache holding its first path (signed by builder-1), a
    node root, and a sentinel directory outside every store: `outside/x.owner` is what a lock taken
    under a forged key would replace and remove."""
    root = copy_store(template["root"], tmp_path / "builder")
    keys = tmp_path / "keys"
    run_cli(root, "keygen", "builder-1", "--out", str(keys), check=True)
    run_cli(root, "keygen", "intruder", "--out", str(keys), check=True)
    cache_dir = tmp_path / "cache"
    name = template["names"][0]
    push(root, name, f"file://{cache_dir}", keys / "builder-1.secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.owner").write_text("sentinel")
    (outside / "x").mkdir()
    return {"root": root, "keys": keys, "cache": cache_dir, "name": name, "key": name[:32],
            "node": tmp_path / "node", "outside": outside, "tmp": tmp_path}


def meta_of(w, key=None) -> dict:
    return json.loads((w["cache"] / f"{key or w['key']}.json").read_text())


def publish(w, doc, key=None, signer: str | None = None) -> None:
    """Write `doc` as `<key>.json` into the cache, signed anew by `signer` (a key name) when given."""
    if signer is not None:
        doc = {k: v for k, v in doc.items() if k != "signatures"}
        signing.sign(doc, str(w["keys"] / f"{signer}.secret"))
    (w["cache"] / f"{key or w['key']}.json").write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())


def outside_state(w) -> dict[str, bytes | None]:
    """Every path under the test's directory except the node's root (where the store may write),
    with file contents: what an attack must leave exactly as it was."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(w["tmp"]):
        if Path(dirpath) == w["tmp"] and "node" in dirnames:
            dirnames.remove("node")
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            state[str(p)] = None if p.is_dir() or p.is_symlink() else p.read_bytes()
    return state


def pull(w, target=None, signer="builder-1"):
    return run_cli(w["node"], "pull", target or w["key"], "--from", f"file://{w['cache']}", "--trusted-key",
                   str(w["keys"] / f"{signer}.public"))


def assert_refused_leaving_nothing(w, proc, before, *, words="refusing it") -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and words in lines[0], proc.stderr
    assert lines[0].startswith("llmgw-store: error: ") and "internal error" not in lines[0]
    assert outside_state(w) == before
    assert (w["outside"] / "x.owner").read_text() == "sentinel"
    node = w["node"]
    if (node / "store").exists():
        assert list((node / "store").iterdir()) == [] and list((node / "var" / "tmp").iterdir()) == []
        assert sqlite3.connect(node / "var" / "db.sqlite").execute("SELECT count(*) FROM paths").fetchone()[0] == 0
        assert all(p.suffix in (".lock", ".owner") and p.parent == node / "var" / "locks"
                   for p in (node / "var" / "locks").rglob("*"))


# --- metadata that is not what it claims: nothing of it is used before the checks ---------------

def _unsigned_name(w):
    m = meta_of(w)
    m["name"] = "../../outside/x"
    publish(w, m)


def _unsigned_key(w):
    m = meta_of(w)
    m["key"] = "../../../outside/x"
    publish(w, m)


def _signed_name_outside(w):
    m = meta_of(w)
    m["name"] = "../../outside/x"
    publish(w, m, signer="builder-1")  # even a trusted signer cannot name a path outside the store


def _signed_reference_outside(w):
    m = meta_of(w)
    m["references"] = ["../x"]
    publish(w, m, signer="builder-1")


def _cycle(signer):
    def make(w):
        """A -> B -> A, each object well-formed and signed by `signer`."""
        a = meta_of(w)
        b_key = OTHER_KEY
        b = dict(a, key=b_key, name=b_key + a["name"][32:], archive=f"{b_key}.tar.zst", references=[a["name"]])
        a["references"] = [b["name"]]
        publish(w, a, signer=signer)
        publish(w, b, key=b_key, signer=signer)
    return make


def _missing_archive(w):
    (w["cache"] / f"{w['key']}.tar.zst").unlink()


def _big_metadata(w):
    with open(w["cache"] / f"{w['key']}.json", "wb") as f:
        f.write(b"[" + b"0," * (5 * MiB // 2) + b"0]")  # 5 MiB of valid JSON


def _archive_larger_than_signed(w):
    m = meta_of(w)
    m["archive_size"] -= 1  # the archive's sha256 is still the signed one: only the bound stops it
    publish(w, m, signer="builder-1")


def _shape(value):
    def make(w):
        publish(w, value if isinstance(value, bytes) else json.dumps(value).encode())
    return make


def _signatures(value):
    def make(w):
        m = meta_of(w)
        m["signatures"] = value
        publish(w, m)
    return make


def _field(field, value):
    def make(w):
        m = meta_of(w)
        m[field] = value
        publish(w, m, signer="builder-1")
    return make


ATTACKS = {
    "unsigned-name-outside": _unsigned_name,
    "unsigned-key-outside": _unsigned_key,
    "signed-name-outside": _signed_name_outside,
    "signed-reference-outside": _signed_reference_outside,
    "cycle-signed-by-intruder": _cycle("intruder"),
    "cycle-signed-by-trusted-key": _cycle("builder-1"),
    "metadata-null": _shape(None),
    "metadata-list": _shape([1, 2]),
    "metadata-string": _shape("x"),
    "metadata-deeply-nested": _shape(b"[" * 100_000 + b"]" * 100_000),
    "metadata-not-json": _shape(b"\xff\xfe{"),
    "signatures-string": _signatures("abc"),
    "signatures-list-of-ints": _signatures([1, 2]),
    "signatures-key-not-a-string": _signatures([{"key": 1, "sig": "x"}]),
    "signatures-too-many": _signatures([{"key": "intruder", "sig": "x"}] * 1000),
    "size-negative": _field("size", -1),
    "size-not-an-int": _field("archive_size", "12"),
    "archive-named-elsewhere": _field("archive", "../builder/var/db.sqlite"),
    "missing-archive": _missing_archive,
    "metadata-5-MiB": _big_metadata,
    "archive-larger-than-signed": _archive_larger_than_signed,
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_pull_refuses_hostile_objects_and_touches_nothing_outside(world, attack):
    ATTACKS[attack](world)
    before = outside_state(world)
    assert_refused_leaving_nothing(world, pull(world), before)


def test_signed_object_served_under_another_keys_name_is_refused(world):
    for suffix in ("json", "tar.zst"):
        os.link(world["cache"] / f"{world['key']}.{suffix}", world["cache"] / f"{OTHER_KEY}.{suffix}")
    before = outside_state(world)
    assert_refused_leaving_nothing(world, pull(world, OTHER_KEY), before, words="signed for")
    # ... and asked by its own key, the same object is pulled (the positive case).
    proc = pull(world)
    assert proc.returncode == 0 and proc.stdout.strip() == str(world["node"] / "store" / world["name"]), proc.stderr


def test_present_path_is_still_checked_and_reported_by_its_local_name(world):
    assert pull(world).returncode == 0
    m = meta_of(world)
    m["name"] = world["key"] + "-elsewhere"  # unsigned change: must not be printed, nor accepted
    publish(world, m)
    before = outside_state(world)
    proc = pull(world)
    assert proc.returncode == 1 and "not signed by a trusted key" in proc.stderr and "elsewhere" not in proc.stderr
    assert outside_state(world) == before
    m["name"] = world["name"]
    publish(world, m, signer="builder-1")
    proc = run_cli(world["node"], "--json", "pull", world["key"], "--from", f"file://{world['cache']}",
                   "--trusted-key", str(world["keys"] / "builder-1.public"), check=True)
    doc = json.loads(proc.stdout)
    assert doc["already_present"] == [world["name"]] and doc["path"] == str(world["node"] / "store" / world["name"])


def test_pull_by_name_must_get_that_name(world):
    proc = pull(world, world["key"] + "-tinyengine-9.9-cpu")
    assert proc.returncode == 1 and "signed for" in proc.stderr and "refusing it" in proc.stderr


def test_signed_archive_that_unpacks_past_its_signed_size_is_refused(world):
    """A zstd bomb under a trusted signature: 8 MiB of zeros, signed as 0 bytes in 1 entry."""
    import zstandard

    name, key = world["name"], world["key"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo(name)
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        big = tarfile.TarInfo(f"{name}/zeros")
        big.size = 8 * MiB
        tf.addfile(big, io.BytesIO(bytes(big.size)))
    archive = zstandard.ZstdCompressor().compress(buf.getvalue())
    (world["cache"] / f"{key}.tar.zst").write_bytes(archive)
    m = dict(meta_of(world), archive_sha256=hashlib.sha256(archive).hexdigest(), archive_size=len(archive),
             size=0, files=1)
    publish(world, m, signer="builder-1")
    before = outside_state(world)
    assert_refused_leaving_nothing(world, pull(world), before, words="would take the archive past")


def test_genuine_object_and_its_reference_are_pulled(world, template):
    """The positive case for references: an object that references another signed object brings it
    along, references first."""
    second = template["names"][1]
    push(world["root"], second, f"file://{world['cache']}", world["keys"] / "builder-1.secret")
    m = meta_of(world)
    m["references"] = [second]
    publish(world, m, signer="builder-1")
    proc = run_cli(world["node"], "--json", "pull", world["name"], "--from", f"file://{world['cache']}",
                   "--trusted-key", str(world["keys"] / "builder-1.public"), check=True)
    doc = json.loads(proc.stdout)
    assert doc["pulled"] == [second, world["name"]] and doc["path"] == str(world["node"] / "store" / world["name"])
    assert run_in_env(world["node"] / "store" / world["name"], "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    con = sqlite3.connect(world["node"] / "var" / "db.sqlite")
    assert con.execute("SELECT reference FROM refs WHERE referrer = ?", (world["name"],)).fetchall() == [(second,)]


# --- build --substituter: a hostile cache is passed over, the node builds ---------------------

def _served_object_of_another_key(w, template):
    """The genuine, validly signed second object, served under the first one's key."""
    second = template["names"][1]
    push(w["root"], second, f"file://{w['cache']}", w["keys"] / "builder-1.secret")
    os.replace(w["cache"] / f"{second[:32]}.json", w["cache"] / f"{w['key']}.json")


SUBSTITUTER_ATTACKS = {
    "another-keys-object": _served_object_of_another_key,
    "unsigned-name-outside": lambda w, t: _unsigned_name(w),
    "metadata-null": lambda w, t: _shape(None)(w),
    "metadata-list": lambda w, t: _shape([1])(w),
    "metadata-string": lambda w, t: _shape("x")(w),
    "signatures-string": lambda w, t: _signatures("abc")(w),
    "missing-archive": lambda w, t: _missing_archive(w),
    "metadata-5-MiB": lambda w, t: _big_metadata(w),
}


@pytest.mark.parametrize("attack", SUBSTITUTER_ATTACKS)
def test_build_passes_a_hostile_cache_over_and_builds(world, template, uv_bin, attack):
    SUBSTITUTER_ATTACKS[attack](world, template)
    before = outside_state(world)
    proc = run_cli(world["node"], "--json", "build", str(template["recipe"]), "--as-of", "2024-02-02",
                   "--index-url", template["index"].url, "--uv", str(uv_bin), "--substituter",
                   f"file://{world['cache']}", "--trusted-key", str(world["keys"] / "builder-1.public"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["how"] == "built" and Path(doc["path"]).name == world["name"]
    about_cache = [line for line in proc.stderr.splitlines() if "cache file://" in line]
    assert len(about_cache) == 1 and "refusing it" in about_cache[0], proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert outside_state(world) == before
    assert (world["outside"] / "x.owner").read_text() == "sentinel"


# --- backends: every get is bounded, on every backend -----------------------------------------

CAPPED_GET = """
import json, sys, tracemalloc
from llmgw_store.cache.backends import backend_for
from llmgw_store.base.errors import IntegrityError
b = backend_for(sys.argv[1])
b.get("absent.json", max_bytes=1)  # imports and first connection before measuring
tracemalloc.start()
try:
    b.get("big.json", max_bytes=1 << 20)
    outcome = "read"
except IntegrityError as exc:
    outcome = str(exc)
print(json.dumps({"outcome": outcome, "peak": tracemalloc.get_traced_memory()[1]}))
"""


def test_backends_stop_reading_past_the_cap(cache):
    """5 MiB under a 1 MiB cap is refused without being read whole: the reading process (not the
    server) peaks near the cap. An object within its cap is read whole; a download past its cap
    leaves no file."""
    import subprocess
    import sys

    b = backend_for(cache)
    big = os.urandom(5 * MiB)
    b.put("big.json", big)
    b.put("small.json", b'{"a": 1}')
    probe = subprocess.run([sys.executable, "-c", CAPPED_GET, cache], capture_output=True, text=True,
                           timeout=120, check=True)
    doc = json.loads(probe.stdout)
    assert "more than 1048576 bytes" in doc["outcome"] and doc["peak"] < 3 * MiB, doc
    assert b.get("small.json", max_bytes=MiB) == b'{"a": 1}'
    assert b.get("absent.json", max_bytes=MiB) is None
    dest = Path(os.environ.get("TMPDIR", "/tmp")) / f"trust-dl-{os.getpid()}"
    with pytest.raises(IntegrityError, match="more than"):
        b.download("big.json", dest, max_bytes=len(big) - 1)
    assert not dest.exists()
    try:
        assert b.download("big.json", dest, max_bytes=len(big)) == hashlib.sha256(big).hexdigest()
        assert dest.read_bytes() == big
    finally:
        dest.unlink(missing_ok=True)
    assert b.download("absent.tar.zst", dest, max_bytes=10) is None and not dest.exists()


def _serve_once(body_writer, headers: dict[str, str]):
    """An HTTP server on 127.0.0.1 whose `/cache/big.json` is written by `body_writer(wfile)`."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if not self.path.endswith("/big.json"):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            try:
                body_writer(self.wfile)
            except OSError:
                pass  # the reader hung up: what is expected

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/cache"


def _capped_get(url: str) -> dict:
    import subprocess
    import sys

    return json.loads(subprocess.run([sys.executable, "-c", CAPPED_GET, url], capture_output=True, text=True,
                                     timeout=120, check=True).stdout)


def test_http_body_without_a_length_stops_at_the_cap():
    """A server that declares no length (chunked) is read only up to the cap, then refused."""

    def endless(wfile) -> None:
        chunk = b"0" * 65536
        for _ in range(80):  # 5 MiB
            wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        wfile.write(b"0\r\n\r\n")

    srv, url = _serve_once(endless, {"Transfer-Encoding": "chunked"})
    try:
        doc = _capped_get(url)
        assert "more than 1048576 bytes" in doc["outcome"] and doc["peak"] < 3 * MiB, doc
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_gzip_bomb_is_not_inflated():
    """64 MiB of zeros sent gzip-encoded (64 KiB on the wire): taken raw, never inflated."""
    import gzip

    bomb = gzip.compress(bytes(64 * MiB), compresslevel=9)
    srv, url = _serve_once(lambda wfile: wfile.write(bomb),
                           {"Content-Encoding": "gzip", "Content-Length": str(len(bomb))})
    try:
        doc = _capped_get(url)
        assert doc["outcome"] == "read" and doc["peak"] < 3 * MiB, doc
    finally:
        srv.shutdown()
        srv.server_close()


def test_file_cache_object_that_is_a_link_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not for the cache")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "k.json").symlink_to(secret)
    with pytest.raises(IntegrityError, match="not a regular file"):
        backend_for(f"file://{tmp_path / 'cache'}").get("k.json", max_bytes=MiB)


def _serve_script(script):
    """An HTTP/1.1 server on 127.0.0.1 where `script(handler)` answers every GET (a list of the
    paths asked is kept in `srv.asked`, the connections opened in `srv.connections`)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            srv.connections += 1

        def do_GET(self) -> None:
            srv.asked.append(self.path)
            script(self)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads, srv.asked, srv.connections = True, [], 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/cache"


def _answer(h, body: bytes, *, status: int = 200, close: bool = False, extra: dict | None = None) -> None:
    h.send_response(status)
    h.send_header("Content-Length", str(len(body)))
    for k, v in (extra or {}).items():
        h.send_header(k, v)
    if close:
        h.send_header("Connection", "close")
        h.close_connection = True
    h.end_headers()
    h.wfile.write(body)


def test_http_reads_reuse_a_connection_and_survive_the_server_closing_it():
    """Plain-http reads keep one connection alive per thread; a server that closes it between two
    reads (an idle timeout) costs a reconnect, not a failure; an absent object is None."""
    def script(h):
        if h.path.endswith("/absent.json"):
            return _answer(h, b"not here", status=404)
        _answer(h, h.path.encode(), close=h.path.endswith("/c.json"))

    srv, url = _serve_script(script)
    try:
        b = backend_for(url)
        assert [b.get(f"{n}.json", max_bytes=MiB) for n in "abc"] == [f"/cache/{n}.json".encode() for n in "abc"]
        assert srv.connections == 1  # a, b and c on one connection
        assert b.get("d.json", max_bytes=MiB) == b"/cache/d.json"  # after the server closed it
        assert b.get("absent.json", max_bytes=MiB) is None
        assert b.get("e.json", max_bytes=MiB) == b"/cache/e.json"
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_redirect_is_followed_and_a_cut_body_is_an_error():
    from llmgw_store.base.errors import NetworkError

    def script(h):
        if h.path.endswith("/moved.json"):
            return _answer(h, b"", status=302, extra={"Location": "/cache/there.json"})
        if h.path.endswith("/cut.json"):  # declares 1 MiB, sends 10 bytes and hangs up
            h.send_response(200)
            h.send_header("Content-Length", str(MiB))
            h.end_headers()
            h.wfile.write(b"0123456789")
            h.close_connection = True
            return
        _answer(h, b'{"there": 1}')

    from llmgw_store.app.retry import RetryPolicy

    srv, url = _serve_script(script)
    try:
        # A body cut short is worth another attempt (it is resumed), and an error once none is left:
        # two attempts here; under the default policy each one's 10 bytes count as progress, and
        # the request would be retried until its 300 s deadline.
        b = backend_for(url, RetryPolicy(attempts=2))
        assert b.get("moved.json", max_bytes=MiB) == b'{"there": 1}'
        with pytest.raises(NetworkError, match=r"cut\.json.*gave up after 2 attempts"):
            b.get("cut.json", max_bytes=2 * MiB)
        with pytest.raises(IntegrityError, match="more than"):  # declared past the cap: refused, not read
            b.get("cut.json", max_bytes=1000)
        assert b.get("after.json", max_bytes=MiB) == b'{"there": 1}'
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_push_into_a_file_cache_never_opens_a_name_planted_before_it(tmp_path):
    """A cache directory others can write (a shared NFS export) may hold a FIFO or a link at the
    name a push writes its temporary file under: the push makes its own new file (O_EXCL, a name
    nobody can guess), so it neither hangs on a FIFO nor writes through a link; the object lands."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    (cache / "releases").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    code = (
        "import os, sys, threading\n"
        "from pathlib import Path\n"
        "from llmgw_store.cache.backends.file import FileBackend\n"
        "d = Path(sys.argv[1])\n"
        "ident = f'.obj.{os.getpid()}.{threading.get_ident()}.tmp'\n"
        "os.mkfifo(d / 'releases' / ident)\n"  # the name the old code opened, O_WRONLY: it blocked here
        "os.symlink(sys.argv[2], d / 'releases' / ('.obj2' + ident[4:]))\n"
        "FileBackend(d).put('releases/obj', b'payload')\n"
        "FileBackend(d).put('releases/obj2', b'payload2')\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(cache), str(victim)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
    assert (cache / "releases" / "obj").read_bytes() == b"payload"
    assert (cache / "releases" / "obj2").read_bytes() == b"payload2"
    assert victim.read_bytes() == b"keep"
