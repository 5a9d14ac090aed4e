"""The one end-to-end build against the real PyPI: the quick start's recipe, the store's own uv.
Skipped cleanly when PyPI cannot be reached (the rest of the suite runs offline)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli


def pypi_reachable() -> bool:
    import httpx

    try:
        return httpx.head("https://pypi.org/simple/uv/", timeout=5).status_code < 500
    except httpx.HTTPError:
        return False


@pytest.mark.pypi
@pytest.mark.skipif(not pypi_reachable(), reason="PyPI cannot be reached")
def test_example_builds_from_real_pypi(tmp_path, monkeypatch):
    root = tmp_path / "root"
    recipe = REPO / "examples" / "black.toml"
    doc = json.loads(run_cli(root, "--json", "build", str(recipe), check=True, timeout=900).stdout)
    env = Path(doc["path"])
    out = subprocess.run([str(env / "bin" / "black"), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("black, 24.4.2")
    # black 24.4.2 was published on 2024-04-26; its dependencies resolve as PyPI stood a day later.
    assert doc["as_of"].startswith("2024-04-27")
    lock = (env / ".llmgw" / "requirements.lock").read_text()
    assert "black==24.4.2" in lock and "--hash=sha256:" in lock
    again = json.loads(run_cli(root, "--json", "build", str(recipe), check=True).stdout)
    assert again["cache_hit"] and again["path"] == doc["path"]


@pytest.mark.pypi
@pytest.mark.skipif(not pypi_reachable(), reason="PyPI cannot be reached")
@pytest.mark.parametrize("page, marker", [("fleet.md", "build examples/black.toml --as-of"),
                                          ("build.md", "build examples/black.toml --as-of")])
def test_the_docs_black_examples_run_against_real_pypi(tmp_path, page, marker):
    """The pages' black examples as written, with the real examples/black.toml, the real PyPI and
    the store's own uv (tests/repo/test_docs_examples.py runs them against stand-ins): their pinned
    date must be after black 24.4.2's last upload (2024-04-26T00:45Z), or the build finds no
    such release."""
    import os
    import re
    import shutil
    import sys

    text = (REPO / "docs" / page).read_text()
    block = next(b for b in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M) if marker in b)
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "black.toml", tmp_path / "examples" / "black.toml")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "LLMGW_STORE_ROOT": str(tmp_path / "root"), "LLMGW_STORE_PROGRESS": "plain"}
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{page}: exit {proc.returncode}\n{block}\n{proc.stdout}\n{proc.stderr}"
    if page == "fleet.md":
        assert "black, 24.4.2" in proc.stdout, proc.stdout
    else:
        assert '"version": "24.4.2"' in proc.stdout, proc.stdout
