"""One rebuild from a record (build/rebuild.py) and one proof of a recorded lock
(build/lockproof.py): a cold rollback, `verify --repair` and `build --check` agree on what a
manifest's lock is. Before, repair's copy of the proof skipped the lock format: a manifest that
named another listed file of `.llmgw/` as its "lock" (its text hashes to that file's listed digest)
was installed from, by repair alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, real_uv, run_cli


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("rebuild"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


def _another_file_as_the_lock(path: Path) -> None:
    """The manifest's lock becomes `.llmgw/requirements.in` (listed, and its text matches its
    listed digest): only the lock format tells that it is no lock."""
    meta = path / ".llmgw"
    doc = json.loads((meta / "manifest.json").read_text())
    doc["lock_format"], doc["lock"] = "requirements.in", (meta / "requirements.in").read_text()
    os.chmod(meta, 0o755)
    os.chmod(meta / "manifest.json", 0o644)
    (meta / "manifest.json").write_text(json.dumps(doc))
    os.chmod(meta / "manifest.json", 0o444)
    os.chmod(meta, 0o555)


def test_the_three_rebuilds_refuse_a_lock_of_another_format(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    path = root / "store" / template["names"][0]
    _another_file_as_the_lock(path)
    bin_dir = path / "bin"
    os.chmod(bin_dir, 0o755)
    (bin_dir / "planted").write_text("x")  # damaged: verify has something to repair

    # repair: the lock is not proved, so it resolves again (same date, same index) and must still
    # give the recorded bytes; it never installs from requirements.in.
    env = {"LLMGW_STORE_INDEX_URL": template["index"].url}
    proc = run_cli(root, "--json", "verify", "--repair", "--uv", str(real_uv()), path.name, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "(resolving again)" in proc.stderr and "and lock" not in proc.stderr
    assert json.loads(proc.stdout)["paths"][0]["repair"]["identical"] is True

    # check: the same proof, strict.
    _another_file_as_the_lock(path)  # the repair put the built manifest back
    proc = run_cli(root, "build", str(template["recipe"]), "--check", "--as-of", "2024-02-02",
                   "--uv", str(real_uv()), env=env)
    assert proc.returncode == 1 and "cannot be proved (its manifest records no lock)" in proc.stderr

    # a record made now holds no lock (the generation could then only come from a cache).
    proc = run_cli(root, "activate", "p", path.name)
    assert proc.returncode == 0 and "no lock proved by its manifest" in proc.stderr
    record = json.loads((root / "profiles" / ".p-1.record").read_text())
    assert record["lock"] is None and record["lock_format"] is None


def test_recorded_inputs_that_do_not_hash_to_the_key_are_never_rebuilt_from(template, tmp_path):
    """The index's row for a path is the record a repair rebuilds from: its inputs must hash to
    the key (an edited row would otherwise build something else under that key)."""
    import sqlite3

    root = copy_store(template["root"], tmp_path / "root")
    name = template["names"][0]
    path = root / "store" / name
    con = sqlite3.connect(root / "var" / "db.sqlite")
    inputs = json.loads(con.execute("SELECT inputs FROM paths WHERE name = ?", (name,)).fetchone()[0])
    inputs["build"]["requirements"] = ["tinyengine==1.0", "tinydep==2.0"]
    con.execute("UPDATE paths SET inputs = ? WHERE name = ?", (json.dumps(inputs), name))
    con.commit()
    con.close()
    os.chmod(path / "bin", 0o755)
    (path / "bin" / "planted").write_text("x")
    proc = run_cli(root, "verify", "--repair", "--uv", str(real_uv()), name,
                   env={"LLMGW_STORE_INDEX_URL": template["index"].url})
    assert proc.returncode == 1
    assert f"the recorded inputs of {name} do not hash to its key" in proc.stderr
    assert (path / "bin" / "planted").exists()  # nothing swapped in
