"""A fleet node that needs only its settings and a binary cache (issue 22): a builder root and a
node root in one test, the package index stopped once the builder has pushed.

The node is configured the way a unit file or the config file does it — environment only, no
build option on its command lines (LLMGW_STORE_SUBSTITUTERS, LLMGW_STORE_TRUSTED_KEYS,
LLMGW_STORE_SUBSTITUTE_ONLY, LLMGW_STORE_OFFLINE, LLMGW_STORE_INDEX_URL) — and runs no --uv: the
key of a pinned recipe needs the shipped uv's version and the host's interpreter, nothing from the
network. A miss is exit 66 naming the key and the cache, and builds nothing.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_cli, start_index, write_recipe

PINNED = 'version = "{version}"\nas_of = "{as_of}"'


def _recipe(tmp: Path, name: str, version: str, as_of: str) -> Path:
    return write_recipe(tmp, PINNED.format(version=version, as_of=as_of), name=name)


def _store(root: Path) -> list[str]:
    store = root / "store"
    return sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) if store.exists() else []


def _run(profile: Path) -> str:
    import subprocess

    return subprocess.run([str(profile / "bin" / "tinyengine")], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def _outcomes(root: Path) -> list[str]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    try:
        return [r[0] for r in con.execute("SELECT outcome FROM builds")]
    finally:
        con.close()


def _one_error(proc) -> str:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("llmgw-store: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture
def fleet(tmp_path, wheels):
    """The builder: two pinned recipes built (with the shipped uv) and pushed to a file:// cache;
    a third recipe it never built. The index is stopped before the node does anything."""
    index = start_index(wheels)
    try:
        builder, keys, cache = tmp_path / "builder", tmp_path / "keys", f"file://{tmp_path / 'cache'}"
        a = _recipe(tmp_path, "a.toml", "1.0", "2024-02-02T00:00:00Z")   # tinydep 1.0
        b = _recipe(tmp_path, "b.toml", "1.0", "2024-08-01T00:00:00Z")   # tinydep 2.0
        c = _recipe(tmp_path, "c.toml", "1.1", "2024-08-01T00:00:00Z")   # never built: a miss
        run_cli(builder, "keygen", "builder-1", "--out", str(keys), check=True)
        names = {}
        for r in (a, b):
            doc = json.loads(run_cli(builder, "--json", "build", str(r), "--index-url", index.url, check=True).stdout)
            names[r.name] = doc["name"]
            run_cli(builder, "push", doc["name"], "--to", cache, "--secret-key", str(keys / "builder-1.secret"),
                    check=True)
    finally:
        index.stop()
    node_env = {
        "LLMGW_STORE_SUBSTITUTERS": cache,
        "LLMGW_STORE_TRUSTED_KEYS": (keys / "builder-1.public").read_text().strip(),
        "LLMGW_STORE_SUBSTITUTE_ONLY": "1",
        "LLMGW_STORE_OFFLINE": "1",
        "LLMGW_STORE_INDEX_URL": index.url,  # a key input: the node names the builder's index
    }
    return {"node": tmp_path / "node", "env": node_env, "cache": cache, "recipes": (a, b, c), "names": names,
            "index": index}


def test_a_node_activates_what_the_builder_pushed_with_the_index_down(fleet):
    node, env = fleet["node"], fleet["env"]
    a, b, c = fleet["recipes"]
    names = fleet["names"]
    proc = run_cli(node, "activate", "svc", str(a), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"svc: generation 1 -> {node / 'store' / names['a.toml']}"
    assert _run(node / "profiles" / "svc") == "tinyengine 1.0 tinydep 1.0"
    run_cli(node, "activate", "svc", str(b), env=env, check=True)
    assert _run(node / "profiles" / "svc") == "tinyengine 1.0 tinydep 2.0"
    # Pulled, never built: no store path of its own uv, no build that ran, nothing downloaded.
    assert _store(node) == sorted(names.values())
    assert "built" not in _outcomes(node)
    assert not list((node / "cache" / "downloads").iterdir())

    # A miss: exit 66 naming the key and the cache asked; nothing built, nothing left behind.
    for args in (["activate", "svc", str(c)], ["build", str(c)]):
        proc = run_cli(node, *args, env=env)
        assert proc.returncode == 66, proc.stderr
        line = _one_error(proc)
        assert "--substitute-only: no binary cache has" in line and fleet["cache"] in line
        assert re.search(r"-tinyengine-1\.1-cpu \(key [0-9a-z]{32};", line), line
        assert "nothing was built" in line
    assert _store(node) == sorted(names.values())
    assert not [p for p in (node / "store").iterdir() if p.name.endswith(".partial")]
    assert "built" not in _outcomes(node) and "running" not in _outcomes(node)
    gens = json.loads(run_cli(node, "--json", "generations", "svc", check=True).stdout)
    assert gens["current"] == 2 and len(gens["generations"]) == 2


def test_a_recorded_generation_comes_back_from_the_cache_and_a_miss_is_never_rebuilt(fleet):
    node, env = fleet["node"], fleet["env"]
    a, b, _ = fleet["recipes"]
    names = fleet["names"]
    run_cli(node, "activate", "svc", str(a), env=env, check=True)
    run_cli(node, "activate", "svc", str(b), env=env, check=True)
    run_cli(node, "generations", "svc", "--delete", "1", check=True)
    run_cli(node, "gc", check=True)
    assert names["a.toml"] not in _store(node)  # generation 1 is cold

    proc = run_cli(node, "rollback", "svc", "--to", "1", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("(cold: substituted)")
    assert _run(node / "profiles" / "svc") == "tinyengine 1.0 tinydep 1.0"

    # Generation 2 goes cold too, and the cache loses it: its record holds a lock the node could
    # rebuild from, but a substitute-only node never builds.
    run_cli(node, "generations", "svc", "--delete", "2", check=True)
    run_cli(node, "gc", check=True)
    key = names["b.toml"].split("-", 1)[0]
    (Path(fleet["cache"][len("file://"):]) / f"{key}.json").unlink()
    proc = run_cli(node, "rollback", "svc", "--to", "2", env=env)
    assert proc.returncode == 66, proc.stderr
    line = _one_error(proc)
    assert f"no binary cache has {names['b.toml']} (key {key};" in line and fleet["cache"] in line
    assert names["b.toml"] not in _store(node) and "built" not in _outcomes(node)
    assert _run(node / "profiles" / "svc") == "tinyengine 1.0 tinydep 1.0"  # still generation 1


def test_substitute_only_without_a_cache_is_a_usage_error(fleet):
    node, (a, _, _) = fleet["node"], fleet["recipes"]
    env = {k: v for k, v in fleet["env"].items() if k != "LLMGW_STORE_SUBSTITUTERS"}
    proc = run_cli(node, "build", str(a), env=env)
    assert proc.returncode == 2 and "--substitute-only needs a binary cache" in _one_error(proc)
    assert _store(node) == []


def test_offline_says_what_would_need_the_network(fleet):
    """--offline alone (the node may build): an unpinned recipe's key needs the index, an http cache
    is passed over, and the pinned recipe still comes from the file:// cache."""
    node, env = fleet["node"], {k: v for k, v in fleet["env"].items() if k != "LLMGW_STORE_SUBSTITUTE_ONLY"}
    a = fleet["recipes"][0]
    unpinned = write_recipe(a.parent, 'version = "1.0"', name="unpinned.toml")  # as_of: publication + 1 day
    proc = run_cli(node, "build", str(unpinned), env=env)
    assert proc.returncode == 1
    line = _one_error(proc)
    assert "needs the network, and --offline forbids it" in line and "pin version and as_of" in line
    env["LLMGW_STORE_SUBSTITUTERS"] = f"http://127.0.0.1:9/nothing {fleet['cache']}"
    proc = run_cli(node, "--json", "build", str(a), env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["how"] == "substituted"
    assert "cache http://127.0.0.1:9/nothing: passed over (--offline: file:// caches only)" in proc.stderr
