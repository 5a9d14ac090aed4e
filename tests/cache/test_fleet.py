"""Binary caches on real backends (a directory, an HTTP server on 127.0.0.1): push, pull,
substitution on build, signatures, tampering."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, run_cli, run_in_env
from tests.support.barrier import Barrier
from tests.support.caches import cache, push, s3_server  # noqa: F401  (fixtures: the three real backends)
from tests.support.object_server import ObjectServer


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("fleet"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def builder(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "builder")
    keys = tmp_path / "keys"
    run_cli(root, "keygen", "builder-1", "--out", str(keys), check=True)
    run_cli(root, "keygen", "intruder", "--out", str(keys), check=True)
    return root, Path(template["paths"][0]).name, keys


def test_push_then_pull_into_another_store(builder, cache, tmp_path):
    root, name, keys = builder
    assert push(root, name, cache, keys / "builder-1.secret")["pushed"] == [name]
    assert push(root, name, cache, keys / "builder-1.secret")["already_there"] == [name]
    node = tmp_path / "node"  # another root: the environment is relocatable
    r = json.loads(run_cli(node, "--json", "pull", name, "--from", cache, "--trusted-key",
                           str(keys / "builder-1.public"), check=True).stdout)
    assert r["pulled"] == [name] and r["path"] == str(node / "store" / name)
    assert run_in_env(node / "store" / name, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    assert run_cli(node, "verify").returncode == 0
    con = sqlite3.connect(node / "var" / "db.sqlite")
    assert con.execute("SELECT outcome FROM builds").fetchall() == [("substituted",)]
    again = json.loads(run_cli(node, "--json", "pull", name, "--from", cache, "--trusted-key",
                               str(keys / "builder-1.public"), check=True).stdout)
    assert again["pulled"] == [] and again["already_present"] == [name]


def test_build_substitutes_from_the_cache_instead_of_building(builder, cache, template, tmp_path, uv_bin):
    root, name, keys = builder
    push(root, name, cache, keys / "builder-1.secret")
    node = tmp_path / "node"
    proc = run_cli(node, "--json", "build", str(template["recipe"]), "--as-of", "2024-02-02", "--index-url",
                   template["index"].url, "--uv", str(uv_bin), "--substituter", cache,
                   "--trusted-key", str(keys / "builder-1.public"), check=True)
    doc = json.loads(proc.stdout)
    assert doc["how"] == "substituted" and Path(doc["path"]).name == name
    assert "substituted" in proc.stderr and "resolving" not in proc.stderr


@pytest.mark.parametrize("problem", ["untrusted", "tampered-archive", "tampered-metadata", "unsigned"])
def test_refused_objects_register_nothing(builder, tmp_path, problem):
    root, name, keys = builder
    cache_dir = tmp_path / "cache"
    secret = keys / ("intruder.secret" if problem == "untrusted" else "builder-1.secret")
    push(root, name, f"file://{cache_dir}", secret)
    key = name[:32]
    meta_path = cache_dir / f"{key}.json"
    meta = json.loads(meta_path.read_text())
    if problem == "tampered-archive":
        data = bytearray((cache_dir / meta["archive"]).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (cache_dir / meta["archive"]).write_bytes(bytes(data))
    elif problem == "tampered-metadata":
        meta["content_hash"] = "0" * 64
        meta_path.write_text(json.dumps(meta))
    elif problem == "unsigned":
        meta["signatures"] = []
        meta_path.write_text(json.dumps(meta))
    node = tmp_path / "node"
    proc = run_cli(node, "pull", key, "--from", f"file://{cache_dir}", "--trusted-key", str(keys / "builder-1.public"))
    assert proc.returncode == 1 and "refusing it" in proc.stderr, proc.stderr
    if problem != "tampered-archive":  # refused on its metadata alone: the store is not even opened
        assert not node.exists()
        return
    assert list((node / "store").iterdir()) == [] and list((node / "var" / "tmp").iterdir()) == []
    assert sqlite3.connect(node / "var" / "db.sqlite").execute("SELECT count(*) FROM paths").fetchone()[0] == 0


def test_pull_needs_a_trusted_key_and_an_existing_object(builder, tmp_path):
    root, name, keys = builder
    node = tmp_path / "node"
    proc = run_cli(node, "pull", name, "--from", f"file://{tmp_path / 'empty'}", "--trusted-key",
                   str(keys / "builder-1.public"))
    assert proc.returncode == 2 and f"no cache has {name[:32]}" in proc.stderr


def test_read_only_http_cache_refuses_push(builder):
    root, name, keys = builder
    srv = ObjectServer(writable=False)
    try:
        proc = run_cli(root, "push", name, "--to", srv.url, "--secret-key", str(keys / "builder-1.secret"))
        assert proc.returncode == 1 and "HTTP 405" in proc.stderr
    finally:
        srv.stop()


def test_environment_whose_interpreter_is_missing_here_is_refused(tmp_path):
    from llmgw_store.base.errors import UsageError
    from llmgw_store.cache.pull import _check_relocatable

    env = tmp_path / "env"
    env.mkdir()
    (env / "pyvenv.cfg").write_text("home = /nonexistent/python/bin\nversion_info = 3.12.7\n")
    with pytest.raises(UsageError, match="its interpreter /nonexistent/python/bin does not exist on this machine"):
        _check_relocatable(env, "x")
    (env / "pyvenv.cfg").write_text(f"home = {Path(__import__('sys').executable).parent}\n")
    _check_relocatable(env, "x")  # an interpreter that exists here: accepted


def test_signed_archive_that_writes_through_a_symlink_is_refused(builder, tmp_path):
    """Even a trusted signer's archive may not write outside the tree (defence in depth)."""
    import hashlib
    import io
    import tarfile

    import zstandard

    from llmgw_store.cache import signing
    from llmgw_store.core.keys import canonical_json

    root, name, keys = builder
    key = name[:32]
    outside = tmp_path / "outside"
    outside.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo(name)
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        link = tarfile.TarInfo(f"{name}/escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tf.addfile(link)
        evil = tarfile.TarInfo(f"{name}/escape/pwned")
        evil.size = 2
        tf.addfile(evil, io.BytesIO(b"hi"))
    archive = zstandard.ZstdCompressor().compress(buf.getvalue())
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{key}.tar.zst").write_bytes(archive)
    meta = {"name": name, "key": key, "content_hash": "0" * 64, "archive": f"{key}.tar.zst",
            "archive_sha256": hashlib.sha256(archive).hexdigest(), "archive_size": len(archive),
            "size": 2, "files": 3, "references": []}
    signing.sign(meta, str(keys / "builder-1.secret"))
    (cache / f"{key}.json").write_bytes(canonical_json(meta))
    proc = run_cli(tmp_path / "node", "pull", key, "--from", f"file://{cache}", "--trusted-key",
                   str(keys / "builder-1.public"))
    assert proc.returncode == 1 and "(a write through a link)" in proc.stderr
    assert list(outside.iterdir()) == []


def test_gc_racing_a_push_keeps_the_path_being_pushed(builder, tmp_path):
    """push holds what it archives as a temp root: a gc that runs meanwhile (the path is unrooted
    otherwise) keeps it, and the pushed object is whole. The positive control: once the push is
    done, the same gc deletes the path."""
    import subprocess

    from tests.conftest import cli_cmd

    root, name, keys = builder
    cache = f"file://{tmp_path / 'cache'}"
    gate = Barrier(tmp_path)
    pusher = subprocess.Popen(cli_cmd(root, "push", name, "--to", cache, "--secret-key", str(keys / "builder-1.secret")),
                              env={**os.environ, **gate.env("PUSH_PAUSE")}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PUSH_PAUSE", pusher)  # its temp root holds the path
        gc = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
        assert name not in [d["name"] for d in gc["deleted"]]
        assert (root / "store" / name).is_dir()
    finally:
        pusher.kill()
        pusher.wait()
    gc = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert name in [d["name"] for d in gc["deleted"]]


# --- the documented builder's and node's config files ask for one key ----------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The settings that enter a key (with the recipe, the host's interpreter and platform, the as-of).
KEY_SETTINGS = ("index_url", "uv", "python_preference")


def _toml_after(doc: Path, words: str) -> str:
    """The first ```toml block after `words` in `doc`, as the page shows it."""
    text = doc.read_text()
    at = text.index(words)
    start = text.index("```toml\n", at) + len("```toml\n")
    return text[start:text.index("```", start)]


def _documented_configs() -> dict[str, str]:
    ops = DOCS / "operations.md"
    return {"builder": _toml_after(ops, "The builder, which resolves, builds and pushes"),
            "node": _toml_after(ops, "A fleet node, which only fetches what the builder pushed"),
            "fleet.md node": _toml_after(DOCS / "fleet.md", "As the config file of a node")}


def test_the_documented_builder_and_node_files_give_one_key_on_one_host(tmp_path):
    """Each file as the docs show it (its root, caches and key file replaced by the command line and
    the environment, which win over a file): the key each computes for one pinned recipe on this
    host. A node file that sets a key's setting otherwise than the builder's asks for another key."""
    import tomllib

    from tests.support.recipes import write_recipe

    files = _documented_configs()
    settings = {who: tomllib.loads(text) for who, text in files.items()}
    for s in KEY_SETTINGS:
        assert len({repr(v.get(s)) for v in settings.values()}) == 1, (s, {w: v.get(s) for w, v in settings.items()})
    recipe = write_recipe(tmp_path, 'version = "1.0"\nas_of = "2024-02-02T00:00:00Z"')
    run_cli(tmp_path / "k", "keygen", "builder-1", "--out", str(tmp_path / "keys"), check=True)
    (tmp_path / "empty-cache").mkdir()
    env = {"LLMGW_STORE_SUBSTITUTE_ONLY": "1", "LLMGW_STORE_SUBSTITUTERS": f"file://{tmp_path / 'empty-cache'}",
           "LLMGW_STORE_TRUSTED_KEYS": str(tmp_path / "keys" / "builder-1.public"),
           "LLMGW_STORE_PYTHON_PREFERENCE": "", "LLMGW_STORE_INDEX_URL": "", "LLMGW_STORE_UV": "",
           "LLMGW_STORE_OFFLINE": "1"}
    keys = {}
    for i, (who, text) in enumerate(files.items()):
        conf = tmp_path / f"config-{i}.toml"
        conf.write_text(text.replace("/etc/llmgw-store/builder-1.public", str(tmp_path / "keys" / "builder-1.public")))
        conf.chmod(0o644)
        # An empty cache: the substitute-only miss says the key and its inputs (nothing is built).
        proc = run_cli(tmp_path / f"root-{i}", "--config", str(conf), "--json", "build", str(recipe), env=env)
        assert proc.returncode == 66, (who, proc.stderr)
        err = json.loads(proc.stdout)["error"]
        keys[who] = (err["key"], err["inputs"]["index_url"], err["inputs"]["python"])
    assert len(set(map(repr, keys.values()))) == 1, keys
