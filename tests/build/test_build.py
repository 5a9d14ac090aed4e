"""End-to-end builds against the loopback index, with the real uv and the installed command."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import sys
from pathlib import Path

from tests.conftest import PYTHON, build_json, run_cli, run_in_env, write_recipe


def registered(root: Path) -> list[dict]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM paths WHERE engine != 'uv'")]


def build_log(root: Path) -> list[dict]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM builds ORDER BY id")]


def test_build_resolves_as_of_the_release_day_and_registers(root, recipe, index, uv_bin):
    doc = build_json(root, recipe, index, uv_bin)
    path = Path(doc["path"])
    assert doc["cache_hit"] is False and doc["how"] == "built"
    # tinyengine 1.0 was published 2024-02-01: asOf is a day later, before tinydep 2.0 (2024-06-01).
    assert doc["as_of"] == "2024-02-02T00:00:00Z"
    assert run_in_env(path, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    lock = (path / ".llmgw" / "requirements.lock").read_text()
    assert "tinydep==1.0" in lock and "--hash=sha256:" in lock
    # The name is <32-char nix base32 key>-<engine>-<version>-<variant>.
    assert path.parent == root / "store" and path.name == f"{doc['key']}-tinyengine-1.0-cpu"
    # Frozen: no write bit anywhere under the path.
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames + ["."]:
            st = os.lstat(os.path.join(dirpath, n))
            assert stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o222, os.path.join(dirpath, n)
    manifest = json.loads((path / ".llmgw" / "manifest.json").read_text())
    assert manifest["key"] == doc["key"] and manifest["exclude_newer"] == "2024-02-02T00:00:00Z"
    assert manifest["inputs"]["uv"] == doc["uv_version"] == "0.13.9"
    [row] = registered(root)
    assert row["name"] == path.name and row["content_hash"] == manifest["content_hash"]
    assert row["size"] > 0 and row["files"] > 10
    assert not list((root / "store").glob("*.partial"))
    assert [b["outcome"] for b in build_log(root)] == ["built"]


def test_as_of_decides_the_resolution_and_the_key(root, recipe, index, uv_bin):
    old = build_json(root, recipe, index, uv_bin)
    new = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")
    assert new["key"] != old["key"] and new["as_of"] == "2024-06-02T00:00:00Z"
    assert run_in_env(Path(new["path"]), "tinyengine") == "tinyengine 1.0 tinydep 2.0"
    assert run_in_env(Path(old["path"]), "tinyengine") == "tinyengine 1.0 tinydep 1.0"


def test_latest_version_is_used_when_the_recipe_fixes_none(root, tmp_path, index, uv_bin):
    recipe = write_recipe(tmp_path)
    doc = build_json(root, recipe, index, uv_bin)
    assert doc["version"] == "1.1" and doc["as_of"] == "2024-07-02T00:00:00Z"
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.1 tinydep 2.0"
    pinned = build_json(root, recipe, index, uv_bin, "--version", "1.0")
    assert pinned["version"] == "1.0" and pinned["path"] != doc["path"]


def test_second_build_is_a_hit_without_any_http_request(root, tmp_path, index, uv_bin):
    for recipe in (write_recipe(tmp_path, 'version = "1.0"', "fixed.toml"), write_recipe(tmp_path, "", "latest.toml")):
        first = build_json(root, recipe, index, uv_bin)
        index.reset_counts()
        again = build_json(root, recipe, index, uv_bin)
        assert index.requests == []
        assert again["cache_hit"] is True and again["how"] == "hit" and again["path"] == first["path"]
    assert [b["outcome"] for b in build_log(root)] == ["built", "built"]


def test_hash_mismatch_is_refused_and_nothing_is_installed(root, recipe, index, uv_bin):
    index.tamper("tinydep-1.0-py3-none-any.whl")
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 1, proc.stderr
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("llmgw-store: error:")]
    assert len(err_lines) == 1 and "uv pip" in err_lines[0] and "hash" in err_lines[0].lower()
    assert "Traceback" not in proc.stderr
    # Nothing but the wheel home, and in it nothing sealed: whatever uv unpacked before it met the
    # bad wheel is unsealed and unlinked, which the next build seals or gc removes.
    assert [p.name for p in (root / "store").iterdir()] == [".wheels"]
    assert list((root / "var" / "wheels").iterdir()) == []
    assert registered(root) == []
    [logged] = build_log(root)
    assert logged["outcome"] == "failed" and "hash" in logged["error"].lower()
    assert run_cli(root, "gc", check=True).returncode == 0
    assert list((root / "store" / ".wheels").iterdir()) == []


def test_failed_verify_leaves_nothing_and_names_the_log(root, tmp_path, index, uv_bin):
    recipe = write_recipe(tmp_path, 'version = "1.0"\n').read_text().replace(
        'verify = ["tinyengine"]', 'verify = ["python", "-c", "raise SystemExit(3)"]')
    (tmp_path / "bad.toml").write_text(recipe)
    proc = run_cli(root, "build", str(tmp_path / "bad.toml"), "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 1
    assert "verify command" in proc.stderr and "exit 3" in proc.stderr and "full output:" in proc.stderr
    assert [p.name for p in (root / "store").iterdir() if p.name != ".wheels"] == [] and registered(root) == []


def test_missing_binary_is_a_failed_build(root, tmp_path, index, uv_bin):
    text = write_recipe(tmp_path, 'version = "1.0"').read_text().replace('binary = "tinyengine"', 'binary = "nope"')
    (tmp_path / "nobin.toml").write_text(text)
    proc = run_cli(root, "build", str(tmp_path / "nobin.toml"), "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 1 and "no executable bin/nope" in proc.stderr
    assert [p.name for p in (root / "store").iterdir() if p.name != ".wheels"] == []  # the wheel home: see above


def test_environment_survives_being_moved_with_the_store(root, recipe, index, uv_bin, tmp_path):
    doc = build_json(root, recipe, index, uv_bin)
    moved = tmp_path / "elsewhere"
    os.rename(root, moved)
    assert run_in_env(moved / "store" / Path(doc["path"]).name, "tinyengine") == "tinyengine 1.0 tinydep 1.0"


def test_list_and_info(root, recipe, index, uv_bin):
    doc = build_json(root, recipe, index, uv_bin)
    listed = json.loads(run_cli(root, "--json", "list", check=True).stdout)["paths"]
    assert [r["path"] for r in listed] == [doc["path"]]
    info = json.loads(run_cli(root, "--json", "info", doc["path"], check=True).stdout)
    assert info["key"] == doc["key"] and info["manifest"]["requirements"] == ["tinyengine==1.0"]
    assert json.loads(run_cli(root, "--json", "info", doc["key"], check=True).stdout)["name"] == info["name"]
    text = run_cli(root, "info", doc["path"], check=True).stdout
    assert "tinyengine 1.0 (cpu)" in text and "2024-02-02T00:00:00Z" in text
    missing = run_cli(root, "info", str(root / "store" / "nothing-here"))
    assert missing.returncode == 2 and missing.stderr.startswith("llmgw-store: error:")


def test_second_environment_reuses_compiled_bytecode(root, recipe, index, uv_bin):
    first = build_json(root, recipe, index, uv_bin)
    proc = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   "--as-of", "2024-06-02", check=True)
    second = json.loads(proc.stdout)
    # tinyengine is the same file in both: its pyc comes from the cache, copied (a build never links
    # a cache file into its environment); at registration the second path shares the first's
    # identical, verified file (core/dedupe.py), and the cache's entry is that store inode too
    # (bytecode.link_cache: the bytecode on disk once)
    assert re.search(r"compiled, [1-9][0-9]* from the bytecode cache", proc.stderr)
    tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    rel = f"lib/python{PYTHON}/site-packages/tinyengine/__pycache__/__init__.{tag}.pyc"
    a, b = Path(first["path"]) / rel, Path(second["path"]) / rel
    cache = {os.stat(p).st_ino for p in (root / "cache" / "pyc").rglob("*") if p.is_file()}
    assert os.stat(a).st_ino in cache and os.stat(a).st_nlink == 4  # a, b, the pool, the cache
    assert a.read_bytes() == b.read_bytes() and os.stat(a).st_ino == os.stat(b).st_ino
    # tinydep differs (1.0 against 2.0): compiled anew
    rel_dep = rel.replace("tinyengine", "tinydep")
    assert os.stat(Path(first["path"]) / rel_dep).st_ino != os.stat(Path(second["path"]) / rel_dep).st_ino
    assert run_in_env(Path(second["path"]), "tinyengine") == "tinyengine 1.0 tinydep 2.0"


def test_a_resolution_date_in_the_future_is_refused(root, recipe, index, uv_bin):
    """asOf fixes what the index held: a date still to come fixes nothing (what is uploaded before
    it would change a build of the same key). Refused, exit 2, one line, nothing built; the
    positive case: a past date builds."""
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), "--as-of", "2099-01-01")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "in the future" in proc.stderr, proc.stderr
    future = write_recipe(recipe.parent, 'version = "1.0"\nas_of = "2099-01-01T00:00:00Z"', name="future.toml")
    proc = run_cli(root, "build", str(future), "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 2 and "build[0].as_of" in proc.stderr and "in the future" in proc.stderr, proc.stderr
    assert not any((root / "store").glob("*tinyengine*")) if (root / "store").exists() else True
    assert build_json(root, recipe, index, uv_bin, "--as-of", "2024-02-02")["as_of"] == "2024-02-02T00:00:00Z"


def test_a_root_that_is_a_file_is_one_line(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("")
    for args in (("list",), ("gc", "--dry-run")):
        proc = run_cli(f, *args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("llmgw-store: error: ") and "a-file" in proc.stderr
