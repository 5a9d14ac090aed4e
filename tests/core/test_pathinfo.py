"""One type for what is known of a store path (core/pathinfo.StorePathInfo): the manifest it writes
(with its format) and reads (every older manifest too), the index row and the cache metadata made
from it, and the checks at its parse edge. Real builds, the real CLI, real SQLite."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw_store.core import manifest
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.keys import canonical_json
from llmgw_store.core.local_store import Store
from llmgw_store.core.pathinfo import MANIFEST_FORMAT, REQUIRED, StorePathInfo
from tests.conftest import build_store, copy_store, run_cli


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("pathinfo"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    return root, root / "store" / template["names"][0]


def _rewrite_manifest(path: Path, doc: dict) -> None:
    """Replace a store path's manifest as an older llmgw-store (or a forger) left it."""
    meta = path / manifest.MANIFEST_DIR
    os.chmod(meta, stat.S_IMODE(os.lstat(meta).st_mode) | stat.S_IWUSR)
    (path / manifest.MANIFEST).unlink()
    (path / manifest.MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.chmod(path / manifest.MANIFEST, 0o444)
    os.chmod(meta, 0o555)


def _forget(root: Path, name: str) -> None:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    con.execute("DELETE FROM paths WHERE name = ?", (name,))
    con.commit()
    con.close()


def test_a_build_writes_the_manifest_format_and_reads_it_back_whole(store):
    root, path = store
    doc = manifest.read(path)
    assert doc["format"] == MANIFEST_FORMAT
    info = StorePathInfo.from_manifest(doc, path.name)
    assert info.to_manifest() == doc  # the recipe's fields (requirements, lock, ...) kept as written
    assert {"requirements", "binary"} <= set(info.extra)
    with Store.open(root, readonly=True) as s:
        row = s.index.path_by_name(path.name)
        assert row == RegisteredPath.of(info, created=row.created, last_used=row.last_used)
        assert StorePathInfo.from_row(row, s.index.references(path.name)).inputs == doc["inputs"]


def test_a_manifest_without_a_format_is_format_1_and_still_registered(store):
    """Every store made before the `format` field has manifests without it: they are adopted
    (doctor, a lost index, a crash between rename and registration) as they always were."""
    root, path = store
    with Store.open(root, readonly=True) as s:
        before = s.index.path_by_name(path.name)
    old = {k: v for k, v in manifest.read(path).items() if k != "format"}
    _rewrite_manifest(path, old)
    _forget(root, path.name)
    with Store.open(root) as s:
        assert s.index.path_by_name(path.name) is None
        assert s.adopt(path.name) is None
        after = s.index.path_by_name(path.name)
    assert replace(after, created=before.created, last_used=before.last_used) == before
    assert manifest.read(path) == old  # read, never rewritten


def test_a_manifest_of_a_later_format_is_not_registered(store):
    root, path = store
    doc = manifest.read(path)
    _rewrite_manifest(path, {**doc, "format": MANIFEST_FORMAT + 1})
    _forget(root, path.name)
    with Store.open(root) as s:
        why = s.adopt(path.name)
        assert why is not None and f"format {MANIFEST_FORMAT + 1}" in why
        assert s.index.path_by_name(path.name) is None


def _valid() -> dict:
    key = "0" * 32
    return {"name": f"{key}-e-1.0-cpu", "key": key, "engine": "e", "version": "1.0", "variant": "cpu",
            "content_hash": "a" * 64, "size": 10, "files": 3, "build_seconds": 1.5, "installed": "2024-01-01T00:00:00Z",
            "inputs": {"as_of": "2024-01-01", "uv": "0.9.0", "python": {"version": "3.11.7"}}, "references": [],
            "requirements": ["x==1"]}


@pytest.mark.parametrize("change, why", [
    ({"name": "../../etc-e-1.0-cpu"}, "names another store path"),
    ({"key": "1" * 32}, "names another store path"),
    ({"size": -1}, "size is not a count"),
    ({"size": 1 << 60}, "size is not a count"),
    ({"files": True}, "files is not a count"),
    ({"files": "3"}, "files is not a count"),
    ({"content_hash": "A" * 64}, "content hash is not 64 hex digits"),
    ({"content_hash": ["a" * 64]}, "content hash is not 64 hex digits"),
    ({"engine": {"x": 1}}, "engine is not a string"),
    ({"variant": "v" * 201}, "variant is not a string"),
    ({"installed": None}, "installed is not a string"),
    ({"build_seconds": "1"}, "build_seconds is not a number"),
    ({"inputs": "{}"}, "inputs are not a JSON object"),
    ({"format": 3}, "format 3"),
    ({"format": True}, "format True"),
])
def test_a_hostile_manifest_is_refused_at_the_parse_edge(change, why):
    doc = _valid()
    name = doc["name"]
    with pytest.raises(ValueError, match=why):
        StorePathInfo.from_manifest({**doc, **change}, name)


@pytest.mark.parametrize("field", REQUIRED)
def test_a_manifest_lacking_a_field_says_which(field):
    doc = _valid()
    with pytest.raises(ValueError, match=f"its manifest lacks {field}"):
        StorePathInfo.from_manifest({k: v for k, v in doc.items() if k != field})


def test_a_valid_manifest_makes_every_shape():
    doc = _valid()
    info = StorePathInfo.from_manifest(doc, doc["name"])
    assert (info.as_of, info.uv_version, info.python) == ("2024-01-01", "0.9.0", "3.11.7")
    assert info.to_manifest() == {**doc, "format": MANIFEST_FORMAT}
    row = RegisteredPath.of(info)
    assert (row.created, row.last_used, row.inputs) == (doc["installed"], doc["installed"], doc["inputs"])
    with pytest.raises(ValueError, match="not a store path name of its key"):
        StorePathInfo.from_manifest({**doc, "name": "../" + doc["name"]})  # no name asked: its own is checked
    # Not a list of store path names: None, and the caller reads them from pyvenv.cfg.
    assert StorePathInfo.from_manifest({**doc, "references": ["../x"]}).references is None
    # A record has no sizes: no manifest, no row is made from it.
    with pytest.raises(ValueError):
        RegisteredPath.of(replace(info, size=None))


def test_the_cache_fields_are_the_bytes_push_signed_before():
    """What cache/push signs of a path is unchanged by the type: the object a node pushed before
    it is the object it pushes now (an unchanged object is renewed, not rewritten), and a cache
    pushed by an older llmgw-store is pulled (tests/cache/test_fleet.py pulls them)."""
    info = StorePathInfo.from_manifest({**_valid(), "references": [f"{'1' * 32}-py-3.11-cpu"]})
    assert canonical_json(info.cache_fields()) == (
        b'{"content_hash":"' + b"a" * 64 + b'","files":3,"inputs":{"as_of":"2024-01-01","python":{"version":"3.11.7"},'
        b'"uv":"0.9.0"},"key":"' + b"0" * 32 + b'","name":"' + b"0" * 32 + b'-e-1.0-cpu","references":["'
        + b"1" * 32 + b'-py-3.11-cpu"],"size":10}')


def test_an_index_row_whose_inputs_are_damaged_is_listed(store):
    """The index keeps the inputs as JSON text: one that is not an object reads as {} (a rebuild
    checks inputs against the key before using them), and `list` still answers."""
    root, path = store
    con = sqlite3.connect(root / "var" / "db.sqlite")
    con.execute("UPDATE paths SET inputs = ? WHERE name = ?", ("{not json", path.name))
    con.commit()
    con.close()
    proc = run_cli(root, "--json", "list")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["paths"]
    assert row["name"] == path.name and row["inputs"] == {}


def _signed() -> dict:
    doc = _valid()
    return {k: doc[k] for k in ("name", "key", "inputs", "content_hash", "size", "files", "references")}


@pytest.mark.parametrize("change, why", [
    ({"key": "1" * 32}, "signed for another key"),
    ({"name": "1" * 32 + "-e-1.0-cpu"}, "not a store path name of that key"),
    ({"name": "0" * 32 + "-../x"}, "not a store path name of that key"),
    ({"references": ["../x"]}, "references are not a list"),
    ({"references": [f"{'1' * 32}-py-3.11-cpu"] * 65}, "references are not a list of at most 64"),
    ({"content_hash": "g" * 64}, "content hash is not 64 hex digits"),
    ({"size": 1 << 43}, "sizes are not between"),
    ({"files": -1}, "sizes are not between"),
])
def test_signed_cache_fields_are_bound_to_what_was_asked(change, why):
    """cache/pull.py reads both object formats' path fields through StorePathInfo.from_cache_fields,
    after the signature (the fields' types are checked before it)."""
    doc = _signed()
    assert StorePathInfo.from_cache_fields(doc, doc["key"], doc["name"]).cache_fields() == doc
    with pytest.raises(ValueError, match=why):
        StorePathInfo.from_cache_fields({**doc, **change}, doc["key"], None)


def test_a_cache_object_asked_by_name_is_that_name():
    doc = _signed()
    with pytest.raises(ValueError, match="not " + "0" * 32 + "-e-2.0-cpu"):
        StorePathInfo.from_cache_fields(doc, doc["key"], "0" * 32 + "-e-2.0-cpu")
