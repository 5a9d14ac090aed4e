"""The store's own uv: the binary the pinned `uv` package ships, copied into a store path and checked
(its RECORD digest, its `--version`); uv's wheel from the index, checked against the published
sha256, only where that package is missing.

The test index serves a real uv wheel: the real binary packed the way uv's PyPI wheels pack it
(`uv-<version>.data/scripts/uv`). "Missing" is real too: the command runs in an interpreter where
`import uv` fails; a shipped binary changed in place is a fake `uv` distribution on PYTHONPATH
whose RECORD names the real binary's digest.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_store.build.uv import UV_VERSION
from tests.conftest import run_cli
from tests.support.wheels import build_wheel

# The console script, in an interpreter where the `uv` package cannot be imported.
NO_SHIPPED_UV = ("import sys; sys.modules['uv'] = None; sys.argv[0] = 'llmgw-store'; "
                 "from llmgw_store.cli import main; main()")


def run_without_shipped_uv(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_SHIPPED_UV, "--root", str(root), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def uv_wheel(tmp_path_factory, uv_bin):
    return build_wheel(tmp_path_factory.mktemp("uvwheel"), "uv", UV_VERSION, data_scripts={"uv": uv_bin})


def _uv_row(root: Path) -> tuple[str, str]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    [(name, content_hash)] = con.execute("SELECT name, content_hash FROM paths WHERE engine = 'uv'").fetchall()
    return name, content_hash


def test_the_shipped_uv_is_copied_into_the_store_and_nothing_is_downloaded(tmp_path, recipe, index, uv_wheel,
                                                                           uv_bin):
    """No --uv, and the index also serves uv's wheel: the store copies the shipped binary (the index
    is never asked for uv), and the store path is byte for byte the one the wheel gives."""
    index.add("uv", uv_wheel, "2026-11-20T00:00:00Z")
    shipped = tmp_path / "shipped"
    proc = run_cli(shipped, "--json", "build", str(recipe), "--index-url", index.url, check=True)
    assert json.loads(proc.stdout)["uv_version"] == UV_VERSION
    assert f"installing uv {UV_VERSION} from {uv_bin} (the uv this llmgw-store ships)" in proc.stderr
    assert not [p for _, p in index.requests if "/uv/" in p or p.startswith("/files/uv-")]
    name, content_hash = _uv_row(shipped)
    manifest = json.loads((shipped / "store" / name / ".llmgw" / "manifest.json").read_text())
    assert manifest["source"] == "shipped"
    assert manifest["sha256"] == hashlib.sha256(uv_bin.read_bytes()).hexdigest()
    copy = shipped / "store" / name / "bin" / "uv"
    assert copy.stat().st_ino != uv_bin.stat().st_ino  # a copy, not a link to a file pip may replace
    assert copy.stat().st_mode & 0o222 == 0  # frozen: the build runs an immutable copy

    # The wheel's way gives the same store path, with the same content hash.
    wheel = tmp_path / "wheel"
    proc = run_without_shipped_uv(wheel, "--json", "build", str(recipe), "--index-url", index.url)
    assert proc.returncode == 0, proc.stderr
    assert f"installing uv {UV_VERSION} from its wheel" in proc.stderr
    assert _uv_row(wheel) == (name, content_hash)
    assert json.loads(proc.stdout)["key"] == json.loads(
        run_cli(shipped, "--json", "build", str(recipe), "--index-url", index.url, check=True).stdout)["key"]


def test_without_the_shipped_uv_the_wheel_is_installed_into_the_store_once(root, recipe, index, uv_wheel):
    index.add("uv", uv_wheel, "2026-11-20T00:00:00Z")
    proc = run_without_shipped_uv(root, "--json", "build", str(recipe), "--index-url", index.url)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["uv_version"] == UV_VERSION and f"installing uv {UV_VERSION} from its wheel" in proc.stderr
    uv_name, _ = _uv_row(root)
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
    proc = run_without_shipped_uv(root, "build", str(recipe), "--index-url", index.url)
    assert proc.returncode == 1
    assert "sha256 is" in proc.stderr and "refusing it" in proc.stderr
    assert list((root / "store").iterdir()) == []
    assert not list((root / "cache" / "downloads").iterdir())


def test_uv_without_a_wheel_for_this_version_is_a_clear_error(root, recipe, index):
    proc = run_without_shipped_uv(root, "build", str(recipe), "--index-url", index.url)
    assert proc.returncode == 2
    assert f"has no uv {UV_VERSION} wheel for this platform; pass --uv PATH" in proc.stderr


def test_offline_without_the_shipped_uv_says_what_needs_the_network(root, recipe, index):
    proc = run_without_shipped_uv(root, "build", str(recipe), "--index-url", index.url, "--offline")
    assert proc.returncode == 1
    assert f"installing uv {UV_VERSION} (not shipped with this llmgw-store)" in proc.stderr
    assert "--offline forbids it" in proc.stderr and index.requests == []


def _fake_uv_dist(tmp: Path, binary: bytes, recorded: bytes) -> Path:
    """A `uv` distribution of the pinned version on a path of its own: site/uv/__init__.py finds
    bin/uv (holding `binary`), and the dist's RECORD lists bin/uv with the digest of `recorded`."""
    site, bindir = tmp / "site", tmp / "bin"
    (site / "uv").mkdir(parents=True)
    bindir.mkdir()
    (bindir / "uv").write_bytes(binary)
    (bindir / "uv").chmod(0o755)
    (site / "uv" / "__init__.py").write_text(
        f"def find_uv_bin():\n    return {str(bindir / 'uv')!r}\n")
    info = site / f"uv-{UV_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: uv\nVersion: {UV_VERSION}\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"../bin/uv,sha256={digest},{len(recorded)}\nuv/__init__.py,,\n")
    return site


@pytest.mark.parametrize("changed", [False, True], ids=["as-installed", "changed-in-place"])
def test_a_shipped_uv_changed_in_place_is_refused(tmp_path, recipe, index, uv_bin, changed):
    """The shipped binary is copied only if its bytes are the ones its package's RECORD lists: a
    binary appended to (it still runs, and still says uv 0.13.9) is refused, nothing is built."""
    real = uv_bin.read_bytes()
    site = _fake_uv_dist(tmp_path / "fake", real + b"\0" if changed else real, real)
    root = tmp_path / "root"
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url,
                   env={"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    if not changed:
        assert proc.returncode == 0, proc.stderr
        assert f"from {site.parent / 'bin' / 'uv'} (the uv this llmgw-store ships)" in proc.stderr
        return
    assert proc.returncode == 1, proc.stderr
    assert "is not the file the uv 0.13.9 package installed" in proc.stderr
    assert [p.name for p in (root / "store").iterdir() if not p.name.startswith(".")] == []


def test_uv_option_must_name_a_uv(root, recipe, index, tmp_path):
    fake = tmp_path / "fake-uv"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(fake))
    assert proc.returncode == 2 and "does not look like uv" in proc.stderr
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_the_shipped_binary_is_where_the_package_says(uv_bin):
    """What the store copies is the `uv` package's binary (the same file the tests' --uv names)."""
    from llmgw_store.build.uv import shipped

    assert shipped() == uv_bin
