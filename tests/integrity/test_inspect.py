"""What is inside a store path: `packages` (with the hashes the lock pins), `why` (requirement chains
through extras and markers), `export` (installed elsewhere by the real uv with --require-hashes from
the loopback index; a tampered export is refused by it). Each takes a profile, PROFILE@N, a name, a
key and a path."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import PYTHON, copy_store, real_uv, run_cli
from tests.support.index_server import PackageIndex
from tests.support.wheels import build_wheel

DATE = "2024-01-01T00:00:00Z"
RECIPE = f"""
[engine]
name = "tinyengine"
binary = "tinyengine"

[[build]]
variant = "cpu"
python = "{PYTHON}"
version = "1.0"
requirements = ["tinyengine=={{version}}", "midlib[fast]==1.0"]
verify = ["tinyengine"]
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An index where midlib needs speedup only with its extra `fast`, and legacy only on Python 2;
    a store with tinyengine 1.0 built from it, profile p at it."""
    d = tmp_path_factory.mktemp("inspect")
    script = {"tinyengine": "tinyengine:main"}
    wheels = {
        "tinydep": build_wheel(d / "w", "tinydep", "1.0"),
        "speedup": build_wheel(d / "w", "speedup", "1.0"),
        "midlib": build_wheel(d / "w", "midlib", "1.0",
                              requires=("tinydep", "speedup; extra == 'fast'", "legacy; python_version < '3'")),
        "tinyengine": build_wheel(d / "w", "tinyengine", "1.0", requires=("tinydep",), scripts=script),
    }
    idx = PackageIndex()
    for name, wheel in wheels.items():
        idx.add(name, wheel, DATE)
    idx.start()
    recipe = d / "tiny.toml"
    recipe.write_text(RECIPE)
    root = d / "root"
    built = json.loads(run_cli(root, "--json", "build", str(recipe), "--index-url", idx.url, "--uv", str(real_uv()),
                               "--as-of", "2024-02-02", check=True).stdout)
    run_cli(root, "activate", "p", built["path"], check=True)
    digests = {n: hashlib.sha256(w.read_bytes()).hexdigest() for n, w in wheels.items()}
    yield {"root": root, "built": built, "index": idx, "digests": digests, "tmp": d}
    idx.stop()


def names_for(world) -> list[str]:
    b = world["built"]
    return ["p", "p@1", Path(b["path"]).name, b["key"], b["path"]]


def test_packages_names_each_with_its_version_and_pinned_hashes(world):
    root = world["root"]
    text = run_cli(root, "packages", "p", check=True).stdout.split("\n")
    assert [ln.split() for ln in text if ln] == [["midlib", "1.0"], ["speedup", "1.0"], ["tinydep", "1.0"],
                                                  ["tinyengine", "1.0"]]
    for target in names_for(world):
        doc = json.loads(run_cli(root, "--json", "packages", target, check=True).stdout)
        assert doc["schema_version"] == 1 and doc["lock_format"] == "requirements.lock"
        by = {p["name"]: p for p in doc["packages"]}
        assert set(by) == set(world["digests"])
        for name, digest in world["digests"].items():
            assert by[name]["hashes"] == [f"sha256:{digest}"] and by[name]["installed"], by[name]
        assert by["tinyengine"]["requested"] and by["midlib"]["requested"] and not by["tinydep"]["requested"]


def test_why_follows_requirements_through_extras_and_markers(world):
    root = world["root"]
    assert run_cli(root, "why", "p", "speedup", check=True).stdout.strip() == "midlib 1.0 -> speedup 1.0"
    chains = run_cli(root, "why", "p@1", "TinyDep", check=True).stdout.strip().splitlines()
    assert sorted(chains) == ["midlib 1.0 -> tinydep 1.0", "tinyengine 1.0 -> tinydep 1.0"]
    doc = json.loads(run_cli(root, "--json", "why", world["built"]["key"], "tinyengine", check=True).stdout)
    assert doc["chains"] == [[["tinyengine", "1.0"]]] and doc["package"] == "tinyengine"
    # legacy (Python 2 only) was never installed; a name that is not a package is refused
    for missing, code in (("legacy", 2), ("../x", 2)):
        proc = run_cli(root, "why", "p", missing)
        assert proc.returncode == code and proc.stderr.count("llmgw-store: error:") == 1, proc.stderr


def _venv(tmp: Path) -> Path:
    venv = tmp / "elsewhere"
    subprocess.run([str(real_uv()), "venv", "--python", sys.executable, str(venv)], check=True, capture_output=True)
    return venv


def _install(venv: Path, lock: Path, index_url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(real_uv()), "pip", "install", "--python", str(venv / "bin" / "python"), *extra,
                           "-r", str(lock), "--index-url", index_url, "--no-cache"],
                          capture_output=True, text=True, timeout=120, check=False)


def test_export_installs_elsewhere_with_require_hashes(world, tmp_path):
    root, idx = world["root"], world["index"]
    text = run_cli(root, "export", "p", check=True).stdout
    assert "--hash=sha256:" in text and text.startswith("# ")
    lock = tmp_path / "requirements.txt"
    lock.write_text(text)
    venv = _venv(tmp_path)
    done = _install(venv, lock, idx.url, "--require-hashes")
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([str(venv / "bin" / "tinyengine")], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "tinyengine 1.0 tinydep 1.0"
    # A tampered export is refused by uv: the hashes bind it to the files the store installed.
    digest = world["digests"]["tinydep"]
    lock.write_text(text.replace(digest, hashlib.sha256(b"other").hexdigest()))
    venv2 = tmp_path / "again"
    subprocess.run([str(real_uv()), "venv", "--python", sys.executable, str(venv2)], check=True, capture_output=True)
    refused = _install(venv2, lock, idx.url, "--require-hashes")
    assert refused.returncode != 0 and "hash" in refused.stderr.lower(), refused.stderr


def test_export_as_pylock_installs_elsewhere(world, tmp_path):
    root, idx = world["root"], world["index"]
    doc = json.loads(run_cli(root, "--json", "export", "p", "--format", "pylock", check=True).stdout)
    assert doc["format"] == "pylock" and doc["schema_version"] == 1
    import tomllib

    lock = tomllib.loads(doc["text"])
    assert lock["lock-version"] == "1.0"
    by = {p["name"]: p for p in lock["packages"]}
    assert {n: p["wheels"][0]["hashes"]["sha256"] for n, p in by.items()} == world["digests"]
    path = tmp_path / "pylock.toml"
    path.write_text(doc["text"])
    venv = _venv(tmp_path)
    done = _install(venv, path, idx.url)
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([str(venv / "bin" / "tinyengine")], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "tinyengine 1.0 tinydep 1.0"


def test_every_name_of_a_path_works_and_a_bad_one_is_exit_2(world, tmp_path):
    root = copy_store(world["root"], tmp_path / "root")
    for target in names_for(world)[:4]:
        assert run_cli(root, "export", target).returncode == 0, target
    for command in (["packages", "nope"], ["why", "nope", "tinydep"], ["export", "nope"],
                    ["export", "p", "--format", "conda"]):
        proc = run_cli(root, *command)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr)


@pytest.mark.parametrize("value", ["plain", "quote\" back\\slash", "tab\tnl\ncr\rff\fbs\b", "nul\x00 esc\x1b del\x7f",
                                   "astral \U0001F600 and bmp \u00e9\u4e2d", "\ud7ff\ue000\uffff"])
def test_exported_toml_strings_read_back_as_written(value):
    """export --format pylock writes TOML basic strings; JSON's escaping is not TOML's (a surrogate
    pair for a character outside the BMP, a raw DEL)."""
    from llmgw_store.integrity.inspect import toml_string

    assert tomllib.loads(f"v = {toml_string(value)}\n")["v"] == value
