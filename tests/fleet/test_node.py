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

from tests.conftest import run_cli, write_recipe
from tests.support.fleet import _one_error, _store, fleet  # noqa: F401  (fixture)


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
