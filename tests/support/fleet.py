"""A builder root that built two pinned tinyengine recipes and pushed them, signed, to a file://
cache, with the package index stopped before a node does anything: the `fleet` fixture of the
node tests (tests/fleet/test_node.py, tests/cache/test_node_causes.py, tests/integrity/test_metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, start_index, write_recipe

PINNED = 'version = "{version}"\nas_of = "{as_of}"'


def _recipe(tmp: Path, name: str, version: str, as_of: str) -> Path:
    return write_recipe(tmp, PINNED.format(version=version, as_of=as_of), name=name)


def _store(root: Path) -> list[str]:
    store = root / "store"
    return sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) if store.exists() else []


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
