"""The rest of the seed's installer: a second index for named packages only (PEP 751 lock)."""

from __future__ import annotations

import hashlib
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from tests.conftest import PYTHON, build_json, run_cli, run_in_env
from tests.support.index_server import PackageIndex
from tests.support.indexes import releases, two_indexes  # noqa: F401  (fixtures)
from tests.support.recipes import FULL, GOOD_SOURCE, file_member, make_tar, write_recipe
from tests.support.release_server import ReleaseServer
from tests.support.wheels import build_wheel


def _recipe(tmp_path: Path, extra: PackageIndex, packages: list[str]) -> Path:
    return write_recipe(tmp_path, 'version = "1.0"', "cuda.toml", variant="cu126", extra_index=extra.url,
                        index_packages=packages)


def test_second_index_serves_only_the_packages_named_for_it(tmp_path, two_indexes, uv_bin):
    main, extra = two_indexes
    root = tmp_path / "root"
    doc = build_json(root, _recipe(tmp_path, extra, ["tinytorch"]), main, uv_bin)
    env = Path(doc["path"])
    # tinytriton 9.0 on the second index is ignored: only tinytorch may come from there.
    assert run_in_env(env, "tinyengine") == "tinyengine 1.0 tinytorch 1.0+cu126 tinytriton 1.0"
    lock = tomllib.loads((env / ".llmgw" / "pylock.toml").read_text())
    where = {p["name"]: p["wheels"][0]["url"] for p in lock["packages"]}
    extra_host, main_host = extra.url.rsplit("/simple", 1)[0], main.url.rsplit("/simple", 1)[0]
    assert where["tinytorch"].startswith(extra_host) and where["tinytriton"].startswith(main_host)
    assert where["tinyengine"].startswith(main_host)
    assert all("sha256" in p["wheels"][0]["hashes"] for p in lock["packages"])
    # --exclude-newer holds on the second index too: 2.0+cu126 was uploaded after as_of.
    assert {p["name"]: p["version"] for p in lock["packages"]}["tinytorch"] == "1.0+cu126"
    diff = json.loads(run_cli(root, "--json", "info", doc["path"], check=True).stdout)
    assert diff["manifest"]["lock_format"] == "pylock.toml"


def test_unnamed_packages_never_come_from_the_second_index(tmp_path, two_indexes, uv_bin):
    main, extra = two_indexes
    # Only tinytriton is named: tinytorch, also on the second index at a "higher" local version,
    # must come from the main index.
    doc = build_json(tmp_path / "root", _recipe(tmp_path, extra, ["tinytriton"]), main, uv_bin)
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinytorch 1.0 tinytriton 9.0"


def test_extra_index_without_packages_is_a_recipe_error(tmp_path, two_indexes):
    main, extra = two_indexes
    f = write_recipe(tmp_path, 'version = "1.0"', "bad.toml", variant="cu126", extra_index=extra.url, index_packages=[])
    proc = run_cli(tmp_path / "root", "build", str(f), "--index-url", main.url)
    assert proc.returncode == 2 and "build[0].extra_index: extra_index and a non-empty index_packages go together" in proc.stderr


# --- source archives, release assets, release wheels -------------------------------------------

def _full(tmp_path: Path, releases: ReleaseServer, source: bytes, text: str = FULL) -> Path:
    sha = releases.add("org/tinyengine", "src", "tinysrc.tar.gz", source)
    f = tmp_path / "full.toml"
    f.write_text(text.format(python=PYTHON, base=releases.base, sha=sha))
    return f


def test_source_assets_and_release_wheel_end_to_end(tmp_path, index, releases, uv_bin):
    recipe = _full(tmp_path, releases, make_tar(GOOD_SOURCE))
    doc = build_json(tmp_path / "root", recipe, index, uv_bin, env={"LLMGW_STORE_GITHUB_API": releases.base})
    env = Path(doc["path"])
    assert (env / "src" / "serve.py").read_text() == "print('serving')\n"
    assert run_in_env(env, "tinytool") == "tinytool 1.0"
    assert run_in_env(env, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    lock = (env / ".llmgw" / "requirements.lock").read_text()
    wheel = releases.releases[("org/tinyengine", "v1.0")]["tinyengine-1.0-py3-none-any.whl"]
    assert f"tinyengine @ {releases.base}/download/v1.0/tinyengine-1.0-py3-none-any.whl" in lock
    assert f"--hash=sha256:{hashlib.sha256(wheel).hexdigest()}" in lock


def test_everything_at_once_extra_index_source_asset_and_wheel(tmp_path, index, releases, uv_bin, wheels):
    """One recipe with every step of the installer: tinydep from a second index (named for it),
    the engine's wheel from a release, a release binary, a source archive with requirements."""
    extra = PackageIndex()
    extra.add("tinydep", build_wheel(tmp_path / "extra", "tinydep", "1.0+cu126"), "2024-01-01T00:00:00Z")
    extra.start()
    try:
        text = FULL.replace('asset_tag = "v{{version}}"', f'asset_tag = "v{{{{version}}}}"\nextra_index = "{extra.url}"\n'
                            'index_packages = ["tinydep"]')
        recipe = _full(tmp_path, releases, make_tar(GOOD_SOURCE), text)
        doc = build_json(tmp_path / "root", recipe, index, uv_bin, env={"LLMGW_STORE_GITHUB_API": releases.base})
    finally:
        extra.stop()
    env = Path(doc["path"])
    assert run_in_env(env, "tinyengine") == "tinyengine 1.0 tinydep 1.0+cu126"
    assert run_in_env(env, "tinytool") == "tinytool 1.0" and (env / "src" / "serve.py").exists()
    lock = tomllib.loads((env / ".llmgw" / "pylock.toml").read_text())
    where = {p["name"]: p for p in lock["packages"]}
    assert where["tinydep"]["wheels"][0]["url"].startswith(extra.url.rsplit("/simple", 1)[0])
    assert "download/v1.0/tinyengine-1.0" in json.dumps(where["tinyengine"])


def test_source_with_wrong_sha256_is_refused(tmp_path, index, releases, uv_bin):
    recipe = _full(tmp_path, releases, make_tar(GOOD_SOURCE))
    text = recipe.read_text()
    sha = text.split('sha256 = "')[1][:64]
    recipe.write_text(text.replace(sha, "0" * 64))
    proc = run_cli(tmp_path / "root", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_GITHUB_API": releases.base})
    assert proc.returncode == 1 and "refusing it" in proc.stderr and "sha256 is" in proc.stderr
    assert list((tmp_path / "root" / "store").iterdir()) == []


def _evil(kind: str) -> list:
    if kind == "dotdot":
        return [file_member("tinysrc-1.0/../../evil", b"x")]
    if kind == "absolute":
        return [file_member("/tmp/llmgw-evil-abs", b"x")]
    info = tarfile.TarInfo("tinysrc-1.0/link")
    if kind == "symlink-out":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        return [(info, None)]
    info.type = tarfile.CHRTYPE  # device file
    info.devmajor, info.devminor = 1, 3
    return [(info, None)]


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink-out", "device"])
def test_unsafe_archives_are_refused_and_nothing_is_written(tmp_path, index, releases, uv_bin, kind):
    recipe = _full(tmp_path, releases, make_tar(GOOD_SOURCE + _evil(kind)))
    proc = run_cli(tmp_path / "root", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_GITHUB_API": releases.base})
    assert proc.returncode == 1 and "refusing to unpack" in proc.stderr, proc.stderr
    root = tmp_path / "root"
    assert list((root / "store").iterdir()) == [] and list((root / "var" / "tmp").iterdir()) == []
    assert not Path("/tmp/llmgw-evil-abs").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize("line, words", [
    ("-e .", "options are not allowed"),
    ("--index-url https://evil.example/simple", "options are not allowed"),
    ("https://evil.example/x.whl", "URLs are not allowed"),
    ("tinydep @ file:///tmp/x.whl", "URLs are not allowed"),
])
def test_source_requirements_take_only_pypi_lines(tmp_path, index, releases, uv_bin, line, words):
    source = [file_member("tinysrc-1.0/requirements.txt", f"tinydep\n{line}\n".encode())]
    recipe = _full(tmp_path, releases, make_tar(source))
    proc = run_cli(tmp_path / "root", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_GITHUB_API": releases.base})
    assert proc.returncode == 2, proc.stderr
    assert f"build[0].source.requirements: requirements.txt line 2: {line!r}: {words}" in proc.stderr


def test_asset_without_published_digest_is_refused(tmp_path, index, releases, uv_bin):
    releases.no_digest.add("tinytool")
    recipe = _full(tmp_path, releases, make_tar(GOOD_SOURCE))
    proc = run_cli(tmp_path / "root", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_GITHUB_API": releases.base})
    assert proc.returncode == 1 and "publishes no sha256 digest for tinytool; refusing it" in proc.stderr


def test_tampered_asset_is_refused(tmp_path, index, releases, uv_bin):
    releases.tampered.add("tinytool")
    recipe = _full(tmp_path, releases, make_tar(GOOD_SOURCE))
    proc = run_cli(tmp_path / "root", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_GITHUB_API": releases.base})
    assert proc.returncode == 1 and "tinytool" in proc.stderr and "refusing it" in proc.stderr
    assert list((tmp_path / "root" / "store").iterdir()) == []
