"""The store installs its pinned uv from uv's wheel on the index, checked against the published sha256.

The test index serves a real uv wheel: the real binary packed the way uv's PyPI wheels pack it
(`uv-<version>.data/scripts/uv`)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from llmgw_store.build.uv import UV_VERSION
from tests.conftest import run_cli
from tests.support.wheels import build_wheel


@pytest.fixture(scope="session")
def uv_wheel(tmp_path_factory, uv_bin):
    return build_wheel(tmp_path_factory.mktemp("uvwheel"), "uv", UV_VERSION, data_scripts={"uv": uv_bin})


def test_pinned_uv_is_installed_into_the_store_once(root, recipe, index, uv_wheel):
    index.add("uv", uv_wheel, "2026-11-20T00:00:00Z")
    proc = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, check=True)
    doc = json.loads(proc.stdout)
    assert doc["uv_version"] == UV_VERSION and f"installing uv {UV_VERSION} from its wheel" in proc.stderr
    con = sqlite3.connect(root / "var" / "db.sqlite")
    [(uv_name,)] = con.execute("SELECT name FROM paths WHERE engine = 'uv'").fetchall()
    assert uv_name.endswith(f"-uv-{UV_VERSION}-bin")
    assert (root / "store" / uv_name / "bin" / "uv").stat().st_mode & 0o111
    manifest = json.loads((root / "store" / uv_name / ".llmgw" / "manifest.json").read_text())
    assert manifest["wheel_sha256"] == index.releases["uv"][0].sha256

    index.reset_counts()
    again = json.loads(run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, check=True).stdout)
    assert again["cache_hit"] and index.requests == []


def test_tampered_uv_wheel_is_refused(root, recipe, index, uv_wheel):
    index.add("uv", uv_wheel, "2026-11-20T00:00:00Z")
    index.tamper(uv_wheel.name)
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url)
    assert proc.returncode == 1
    assert "sha256 is" in proc.stderr and "refusing it" in proc.stderr
    assert list((root / "store").iterdir()) == []
    assert not list((root / "cache" / "downloads").iterdir())


def test_uv_without_a_wheel_for_this_version_is_a_clear_error(root, recipe, index):
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url)
    assert proc.returncode == 2
    assert f"has no uv {UV_VERSION} wheel for this platform; pass --uv PATH" in proc.stderr


def test_uv_option_must_name_a_uv(root, recipe, index, tmp_path):
    fake = tmp_path / "fake-uv"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(fake))
    assert proc.returncode == 2 and "does not look like uv" in proc.stderr
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such file" in proc.stderr
