"""A store path's name says the engine version that is inside it (issue 16).

The loopback index (tests/conftest.py) has tinyengine 1.0 (2024-02-01) and 1.1 (2024-07-01).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli, run_in_env
from tests.support.recipes import write_recipe


def _recipe(tmp_path: Path, requirement: str) -> Path:
    return write_recipe(tmp_path, name="bare.toml", requirements=[requirement])


def _build(root, recipe, index, uv_bin, *extra):
    return run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), *extra)


def test_bare_requirements_before_the_latest_release_are_named_after_what_resolves(root, tmp_path, index, uv_bin):
    # "the latest release" as the index stood at --as-of: 1.0 (1.1 came later), and 1.0 is inside.
    recipe = _recipe(tmp_path, "tinyengine")
    proc = _build(root, recipe, index, uv_bin, "--as-of", "2024-03-01T00:00:00Z")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["version"] == "1.0" and Path(doc["path"]).name.endswith("-tinyengine-1.0-cpu")
    assert run_in_env(Path(doc["path"]), "tinyengine").startswith("tinyengine 1.0 ")
    # after 1.1's release the same recipe is 1.1, by name and inside
    later = json.loads(_build(root, recipe, index, uv_bin, "--as-of", "2024-08-01T00:00:00Z").stdout)
    assert later["version"] == "1.1" and run_in_env(Path(later["path"]), "tinyengine").startswith("tinyengine 1.1 ")


def test_requirements_that_resolve_another_version_than_the_name_are_refused(root, tmp_path, index, uv_bin):
    recipe = _recipe(tmp_path, "tinyengine==1.0")
    proc = _build(root, recipe, index, uv_bin, "--version", "1.1", "--as-of", "2024-08-01T00:00:00Z")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("llmgw-store: error: ")
    assert "resolve tinyengine to 1.0" in proc.stderr and "named 1.1" in proc.stderr
    assert not [p for p in (root / "store").iterdir() if p.name.endswith("-tinyengine-1.1-cpu")]
