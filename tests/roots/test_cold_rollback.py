"""Cold generations on a real store: a deleted generation keeps its record beside the links; after a
real `gc` took its store path, `rollback --to N` brings it back from the record — rebuilt offline
from uv's cache and the locked hashes (the index stopped), or from the recorded index, or pulled
from a binary cache — with the recorded content hash, then switches. Records that were tampered
with are refused before anything is built or switched."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from blake3 import blake3

from llmgw_store.core.keys import canonical_json
from tests.conftest import build_store, copy_store, real_uv, run_cli, run_in_env


def act(root, profile, target, *extra):
    return json.loads(run_cli(root, "--json", "activate", profile, str(target), *extra, check=True).stdout)


def generations(root: Path, profile: str) -> dict:
    return json.loads(run_cli(root, "--json", "generations", profile, check=True).stdout)


def content_hash(root: Path, name: str) -> str | None:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    try:
        row = con.execute("SELECT content_hash FROM paths WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None
    finally:
        con.close()


def make_cold(t: dict) -> dict:
    """Profile p: generation 1 (old), 2 (new, current); generation 1 deleted and its path collected."""
    root, (old, new) = t["root"], t["paths"]
    act(root, "p", old)
    act(root, "p", new)
    recorded = content_hash(root, Path(old).name)
    deleted = json.loads(run_cli(root, "--json", "generations", "p", "--delete", "1", check=True).stdout)
    assert deleted["deleted"] == [1] and (root / "profiles" / ".p-1.record").is_file()
    gc = json.loads(run_cli(root, "--json", "gc", check=True).stdout)
    assert [d["name"] for d in gc["deleted"]] == [Path(old).name] and not Path(old).exists()
    return {"root": root, "old": old, "new": new, "hash": recorded, "index": t["index"]}


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheels):
    """A store with old and new (unrooted), and its running index."""
    t = build_store(tmp_path_factory.mktemp("cold"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


@pytest.fixture(scope="module")
def template(built, tmp_path_factory):
    root = copy_store(built["root"], tmp_path_factory.mktemp("cold-template") / "root")
    paths = [str(root / "store" / Path(p).name) for p in built["paths"]]
    return make_cold({"root": root, "paths": paths, "index": built["index"]})


@pytest.fixture
def warm(built, tmp_path):
    """A private copy of the store with old and new and no profile."""
    root = copy_store(built["root"], tmp_path / "root")
    old, new = (str(root / "store" / Path(p).name) for p in built["paths"])
    return {"root": root, "old": old, "new": new}


@pytest.fixture
def cold(template, tmp_path):
    """A private copy of the template store (generation 1 of p is cold)."""
    root = copy_store(template["root"], tmp_path / "root")
    old, new = (str(root / "store" / Path(p).name) for p in (template["old"], template["new"]))
    return {**template, "root": root, "old": old, "new": new}


def rollback(root, *args, check=True):
    return run_cli(root, "--json", "rollback", "p", *args, "--uv", str(real_uv()), check=check)


def test_deleted_then_collected_generation_is_cold_and_listed(cold):
    root, old = cold["root"], cold["old"]
    gens = generations(root, "p")["generations"]
    assert [(g["number"], g["state"], g["linked"], g["record"], g["current"]) for g in gens] == [
        (1, "cold", False, True, False), (2, "hot", True, True, True)]
    assert gens[0]["name"] == Path(old).name and gens[0]["version"] == "1.0"
    text = run_cli(root, "generations", "p", check=True).stdout.splitlines()
    assert "  cold  tinyengine 1.0 (cpu)  " in text[0] and "  hot   tinyengine 1.0 (cpu)  " in text[1]
    proc = run_cli(root, "rollback", "p")  # no --to: the previous generation still in the store; there is none
    assert proc.returncode == 2 and "has no generation before 2 to roll back to" in proc.stderr


def test_cold_generation_is_rebuilt_offline_with_the_recorded_content_hash(tmp_path, wheels):
    t = build_store(tmp_path, wheels, "2024-02-02", "2024-06-02")
    c = make_cold(t)
    root, old = c["root"], c["old"]
    t["index"].stop()  # offline: uv's cache and the locked hashes only
    proc = rollback(root, "--to", "1")
    r = json.loads(proc.stdout)
    assert (r["generation"], r["previous"], r["changed"], r["rebuilt"]) == (1, 2, True, "built")
    assert "trying again with" not in proc.stderr and "resolving" not in proc.stderr
    assert os.readlink(root / "profiles" / "p") == "p-1-link"
    assert os.readlink(root / "profiles" / "p-1-link") == f"../store/{Path(old).name}"
    assert content_hash(root, Path(old).name) == c["hash"]
    assert run_in_env(Path(old), "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    assert run_cli(root, "verify", old).returncode == 0
    gens = generations(root, "p")
    assert [(g["number"], g["state"], g["linked"]) for g in gens["generations"]] == [(1, "hot", True), (2, "hot", True)]
    assert gens["history"][-1]["event"] == "rollback" and gens["history"][-1]["cold"] is True
    # hot again: a second rollback is a plain switch
    assert json.loads(rollback(root, "--to", "2").stdout)["rebuilt"] is None


def test_without_uvs_cache_it_is_rebuilt_from_the_recorded_index(cold):
    root, old = cold["root"], cold["old"]
    shutil.rmtree(root / "cache" / "uv")
    (root / "cache" / "uv").mkdir(mode=0o700)
    proc = rollback(root, "--to", "1")
    assert json.loads(proc.stdout)["rebuilt"] == "built" and "trying again with" in proc.stderr
    assert content_hash(root, Path(old).name) == cold["hash"]


def test_cold_generation_is_pulled_from_a_binary_cache(tmp_path, wheels):
    t = build_store(tmp_path, wheels, "2024-02-02", "2024-06-02")
    root, old = t["root"], t["paths"][0]
    keys, cache = tmp_path / "keys", f"file://{tmp_path / 'cache'}"
    run_cli(root, "keygen", "builder", "--out", str(keys), check=True)
    run_cli(root, "push", old, "--to", cache, "--secret-key", str(keys / "builder.secret"), check=True)
    c = make_cold(t)
    t["index"].stop()
    shutil.rmtree(root / "cache" / "uv")  # nothing to rebuild from: it has to come from the cache
    proc = rollback(root, "--to", "1", "--substituter", cache, "--trusted-key", str(keys / "builder.public"))
    assert json.loads(proc.stdout)["rebuilt"] == "substituted"
    assert content_hash(root, Path(old).name) == c["hash"] and os.readlink(root / "profiles" / "p") == "p-1-link"


def _edit(record: Path, change, keyed: bool = False) -> None:
    """Change a record as an attacker who also recomputes its digests would: unkeyed (who can write
    profiles/ but not read var/), or `keyed` with the store's records key (to reach the checks
    behind the key)."""
    doc = json.loads(record.read_text())
    change(doc)
    if doc.get("lock") is not None:
        doc["lock_blake3"] = blake3(doc["lock"].encode()).hexdigest()
    body = {k: v for k, v in doc.items() if k != "digest"}
    if keyed:
        key = (record.parent.parent / "var" / "records.key").read_bytes()
        doc["digest"] = blake3(canonical_json(body), key=key).hexdigest()
    else:
        doc["digest"] = blake3(canonical_json(body)).hexdigest()
    record.write_text(json.dumps(doc))


def _evil_lock(doc) -> None:
    """F3: arbitrary code under the existing key — a direct reference in the lock."""
    doc["lock"] = "tinyengine @ file:///tmp/evil.whl \\\n    --hash=sha256:" + "ab" * 32 + "\n"


def _other_hash(doc) -> None:
    lock = doc["lock"]
    start = lock.index("sha256:") + len("sha256:")
    doc["lock"] = lock[:start] + ("0" if lock[start] != "0" else "1") + lock[start + 1:]


TAMPERING = {
    # the lock's text alone changed: its digest no longer matches
    "lock-hash": (lambda p: p.write_text(p.read_text().replace("--hash=sha256:", "--hash=sha256:0", 1)),
                  "its digest does not match its contents under the store's records key"),
    "name-traversal": (lambda p: _edit(p, lambda d: d.update(name="../../../etc/cron.d/x"), keyed=True),
                       "'../../../etc/cron.d/x' is not a store path name"),
    "inputs": (lambda p: _edit(p, lambda d: d["inputs"].update(as_of="2024-06-02T00:00:00Z"), keyed=True),
               "its inputs do not hash to its key (they were changed)"),
    "digest": (lambda p: p.write_text(p.read_text().replace('"created": "', '"created": "1', 1)),
               "its digest does not match its contents under the store's records key"),
    # F3: resealed with the unkeyed digests, the forged lock is refused before any field is used
    "forged-lock-unkeyed": (lambda p: _edit(p, _evil_lock),
                            "its digest does not match its contents under the store's records key"),
    "inputs-unkeyed": (lambda p: _edit(p, lambda d: d["inputs"].update(as_of="2024-06-02T00:00:00Z")),
                       "its digest does not match its contents under the store's records key"),
    # F3, behind the key: a lock installs only from the index
    "forged-lock-keyed": (lambda p: _edit(p, _evil_lock, keyed=True),
                          "its lock has a line that is not a pinned requirement with hashes from the index"),
    "index-option-keyed": (lambda p: _edit(p, lambda d: d.update(lock="--index-url http://evil/simple\n" + d["lock"]),
                                           keyed=True),
                           "its lock has a line that is not a pinned requirement"),
    # F4: a record others can write, or that has a second name, is not used
    "group-writable": (lambda p: p.chmod(0o664), "is writable by group or others (mode 664)"),
    "world-writable": (lambda p: p.chmod(0o666), "is writable by group or others (mode 666)"),
    "hard-link": (lambda p: os.link(p, p.with_name("elsewhere")), "has 2 hard links"),
    "symlink": (lambda p: (p.rename(p.with_name("elsewhere")), p.symlink_to("elsewhere")),
                "cannot be read as a record"),
    "huge": (lambda p: os.truncate(p, 64 << 20), "is larger than"),
    "not-json": (lambda p: p.write_text("{"), "not JSON"),
    "other-generation": (lambda p: _edit(p, lambda d: d.update(generation=2), keyed=True),
                         "it names profile 'p' generation 2"),
}


@pytest.mark.parametrize("how", sorted(TAMPERING))
def test_a_tampered_record_is_refused_before_anything_is_built(cold, how):
    root, old = cold["root"], cold["old"]
    tamper, message = TAMPERING[how]
    tamper(root / "profiles" / ".p-1.record")
    proc = rollback(root, "--to", "1", check=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("llmgw-store: error: ")  # refused first thing
    assert os.readlink(root / "profiles" / "p") == "p-2-link" and not (root / "profiles" / "p-1-link").exists()
    assert not Path(old).exists() and content_hash(root, Path(old).name) is None
    listed = generations(root, "p")
    assert [g["number"] for g in listed["generations"]] == [2] and len(listed["records_refused"]) == 1


def test_a_record_whose_lock_was_changed_consistently_never_becomes_a_store_path(cold):
    """Digests recomputed with the store's own key (a thief of var/), so only the rebuild can tell: uv
    refuses the wheel whose hash the lock no longer names, offline and online alike; nothing is
    registered, nothing switched."""
    root, old = cold["root"], cold["old"]
    _edit(root / "profiles" / ".p-1.record", _other_hash, keyed=True)
    proc = rollback(root, "--to", "1", check=False)
    assert proc.returncode == 1 and "uv pip install failed" in proc.stderr
    assert os.readlink(root / "profiles" / "p") == "p-2-link" and not (root / "profiles" / "p-1-link").exists()
    assert not Path(old).exists() and content_hash(root, Path(old).name) is None


def test_a_rebuild_with_another_content_hash_does_not_print_the_hash_a_forger_needs(cold):
    root, old = cold["root"], cold["old"]
    _edit(root / "profiles" / ".p-1.record", lambda d: d.update(content_hash="0" * 64), keyed=True)
    proc = rollback(root, "--to", "1", check=False)
    assert proc.returncode == 1 and "gives a content hash other than the recorded one" in proc.stderr, proc.stderr
    assert cold["hash"] not in proc.stderr, proc.stderr
    assert os.readlink(root / "profiles" / "p") == "p-2-link" and content_hash(root, Path(old).name) is None
    verbose = run_cli(root, "-v", "rollback", "p", "--to", "1", "--uv", str(real_uv()))
    assert verbose.returncode == 1 and f"rebuilt: {cold['hash']}" in verbose.stderr


def test_records_key_is_private_and_made_by_the_store(cold):
    key = cold["root"] / "var" / "records.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and len(key.read_bytes()) == 32
    key.chmod(0o644)  # a key others could read is no secret: no record is trusted
    proc = rollback(cold["root"], "--to", "1", check=False)
    assert proc.returncode == 1 and "is not the store owner's private 32-byte file" in proc.stderr


def test_a_deleted_generation_whose_path_is_still_there_is_switched_to_without_a_rebuild(warm):
    # L7: only the link went; the recorded path is present and registered with the recorded content
    # hash, so it is relinked and switched to — no rebuild, not even a lock needed (none recorded).
    root, old, new = warm["root"], warm["old"], warm["new"]
    act(root, "p", old)
    act(root, "p", new)
    run_cli(root, "generations", "p", "--delete", "1", check=True)
    _edit(root / "profiles" / ".p-1.record", lambda d: d.update(lock=None, lock_format=None, lock_blake3=None),
          keyed=True)
    proc = run_cli(root, "--json", "rollback", "p", "--to", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["generation"] == 1 and out["rebuilt"] is None and "bringing it back" not in proc.stderr
    assert os.readlink(root / "profiles" / "p") == "p-1-link" and os.path.realpath(root / "profiles" / "p") == old


def test_forget_removes_the_record_and_the_way_back(cold):
    root = cold["root"]
    out = json.loads(run_cli(root, "--json", "generations", "p", "--forget", "1", check=True).stdout)
    assert out["forgotten"] == [1] and out["deleted"] == []
    assert not (root / "profiles" / ".p-1.record").exists()
    proc = rollback(root, "--to", "1", check=False)
    assert proc.returncode == 2 and "profile 'p' has no generation 1 (it has: 2)" in proc.stderr
    proc = run_cli(root, "generations", "p", "--forget", "2")
    assert proc.returncode == 2 and "refusing to forget generation 2 of 'p': it is the current one" in proc.stderr


def test_records_are_bounded_and_hot_ones_always_kept(warm):
    root, old, new = warm["root"], warm["old"], warm["new"]
    for target in (old, new, old, new):
        act(root, "b", target)
    run_cli(root, "generations", "b", "--delete", "1", "--delete", "2", check=True)
    def records() -> list[str]:
        return sorted(p.name for p in (root / "profiles").glob(".b-*.record"))
    assert records() == [".b-1.record", ".b-2.record", ".b-3.record", ".b-4.record"]
    assert act(root, "b", old, "--keep-records", "3")["generation"] == 5
    assert records() == [".b-3.record", ".b-4.record", ".b-5.record"]  # the oldest cold ones went
    out = json.loads(run_cli(root, "--json", "generations", "b", "--keep-records", "1", check=True).stdout)
    assert out["records_dropped"] == [] and records() == [".b-3.record", ".b-4.record", ".b-5.record"]


def test_deleting_a_generation_made_before_records_writes_its_record_first(warm):
    root, old, new = warm["root"], warm["old"], warm["new"]
    act(root, "q", old)
    act(root, "q", new)
    (root / "profiles" / ".q-1.record").unlink()  # as an llmgw-store without records left it
    run_cli(root, "generations", "q", "--delete", "1", check=True)
    gens = generations(root, "q")["generations"]
    assert [(g["number"], g["linked"], g["record"], g["state"]) for g in gens] == [(1, False, True, "hot"),
                                                                                   (2, True, True, "hot")]
    doc = json.loads((root / "profiles" / ".q-1.record").read_text())
    assert doc["name"] == Path(old).name and doc["activation"] == {"kind": "recorded-on-delete"}
    assert "--hash=sha256:" in doc["lock"] and doc["lock_format"] == "requirements.lock"


def test_a_record_holds_what_rebuilds_the_generation(warm):
    root, old = warm["root"], warm["old"]
    act(root, "r", old)
    doc = json.loads((root / "profiles" / ".r-1.record").read_text())
    manifest = json.loads((Path(old) / ".llmgw" / "manifest.json").read_text())
    assert doc["lock"] == manifest["lock"] and doc["inputs"] == manifest["inputs"]
    assert doc["content_hash"] == content_hash(root, Path(old).name) and doc["key"] == manifest["key"]
    assert doc["inputs"]["build"]["requirements"] == ["tinyengine=={version}".replace("{version}", "1.0")]
    assert doc["by"]["uid"] == os.getuid() and doc["activation"]["kind"] == "activate"
    assert oct((root / "profiles" / ".r-1.record").stat().st_mode & 0o777) == "0o600"  # the owner's: check output


def _doc_blocks(*sections: str) -> list[str]:
    """The ```sh blocks of these sections of docs/profiles.md, in order."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "profiles.md").read_text()
    blocks = []
    for section in sections:
        body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        blocks += re.findall(r"```sh\n(.*?)```", body, re.DOTALL)
    return blocks


def test_the_docs_walk_through_runs_as_written(warm):
    import subprocess
    import sys

    root, old, new = warm["root"], warm["old"], warm["new"]
    blocks = _doc_blocks("Guarded activation", "Cold generations")
    assert len(blocks) == 3
    # Names, not paths: a process whose environment holds a store path keeps it from gc (it looks in use).
    env = {**os.environ, "LLMGW_STORE_ROOT": str(root), "OLD": Path(old).name, "NEW": Path(new).name,
           "LLMGW_STORE_UV": str(real_uv()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    recorded = content_hash(root, Path(new).name)
    outputs = []
    for block in blocks:
        proc = subprocess.run(["bash", "-eu", "-o", "pipefail", "-c", block], check=False, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (block, proc.stdout, proc.stderr)
        outputs.append(proc.stdout)
    assert "exit 1" in outputs[0] and "exit 1, back at the previous generation" in outputs[1]
    assert os.readlink(root / "profiles" / "tiny") == "tiny-1-link"
    assert os.path.realpath(root / "profiles" / "tiny") == new and content_hash(root, Path(new).name) == recorded
    assert any(line.lstrip().startswith("1  ") and "  cold  " in line for line in outputs[2].splitlines())
    assert "tiny: generation 2 -> 1" in outputs[2] and "(cold: built)" in outputs[2]
