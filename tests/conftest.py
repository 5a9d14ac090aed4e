"""Fixtures: a real package index on 127.0.0.1 with dated releases, the real uv, a store in tmp_path.

The index holds (upload times chosen so that `--exclude-newer` decides what resolves):
    tinydep     1.0  2024-01-01        2.0  2024-06-01
    tinyengine  1.0  2024-02-01        1.1  2024-07-01     (requires tinydep; console script `tinyengine`)
A build of tinyengine 1.0 resolves as of 2024-02-02 and must get tinydep 1.0, not 2.0.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.index_server import PackageIndex
from tests.support.recipes import PYTHON, TINY_RECIPE, tiny_recipe, write_recipe  # noqa: F401  (importable from here)
from tests.support.wheels import build_wheel

REPO = Path(__file__).resolve().parent.parent

# A suite started in the background by a shell without job control (`pytest &`, CI, nohup) inherits
# SIGINT ignored, and an ignored signal stays ignored across exec: every store process a test starts
# would then ignore the ^C the interrupt tests send it. A handler (not an ignore) is reset to the
# default by exec, so each child starts as it would from a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)

# --- the quick loop: `pytest -m "not system"` ------------------------------------------------------
# A test is `system` when it takes a fixture that builds or serves (the package index, the wheels,
# uv, a store root, a binary cache) or when it, a fixture it takes, or a helper of the tests either
# calls, runs the CLI, a build or other processes (Popen; multiprocessing's Process), or when it needs
# the real PyPI (`pypi`). Decided from the fixtures it takes and the names their code uses, so a new
# test is classified without anyone remembering to mark it. A stress loop marks its repetitions past
# the first few `system` itself (test_containment.py): the quick loop runs a few, the suite all.
SYSTEM_FIXTURES = frozenset({"index", "wheels", "uv_bin", "root", "recipe", "delta_wheels", "cache", "s3_server"})
SYSTEM_CALLS = frozenset({"run_cli", "cli_cmd", "build_json", "build_store", "copy_store", "real_uv", "start_index",
                          "CliRunner", "Popen", "Process"})


def _uses_system(fn, seen: set) -> bool:
    """Whether `fn`'s code, its nested functions', or a test helper's it names, uses SYSTEM_CALLS."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or fn in seen:
        return False
    seen.add(fn)
    scope = getattr(fn, "__globals__", {})
    stack = [code]
    while stack:
        c = stack.pop()
        for name in c.co_names:
            if name in SYSTEM_CALLS:
                return True
            helper = scope.get(name)
            if not getattr(helper, "__module__", "").startswith("tests"):
                continue
            # a test helper: a function, or a class whose methods do the work
            methods = [helper] if inspect.isfunction(helper) else \
                [m for m in vars(helper).values() if inspect.isfunction(m)] if inspect.isclass(helper) else []
            if any(_uses_system(m, seen) for m in methods):
                return True
        stack += [k for k in c.co_consts if inspect.iscode(k)]
    return False


def _fixture_functions(item) -> list:
    """The functions of every fixture `item` takes, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return [d.func for ds in defs for d in ds]


def pytest_collection_modifyitems(config, items):
    for item in items:
        fn = getattr(item, "function", None)
        seen: set = set()
        if SYSTEM_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("pypi") or \
                any(_uses_system(f, seen) for f in ([fn] if fn is not None else []) + _fixture_functions(item)):
            item.add_marker(pytest.mark.system)


def real_uv() -> Path:
    from uv import find_uv_bin

    return Path(find_uv_bin())


@pytest.fixture(scope="session")
def uv_bin() -> Path:
    return real_uv()


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("wheels")
    script = {"tinyengine": "tinyengine:main"}
    return {
        "tinydep-1.0": build_wheel(d, "tinydep", "1.0"),
        "tinydep-2.0": build_wheel(d, "tinydep", "2.0"),
        "tinyengine-1.0": build_wheel(d, "tinyengine", "1.0", requires=("tinydep",), scripts=script),
        "tinyengine-1.1": build_wheel(d, "tinyengine", "1.1", requires=("tinydep",), scripts=script),
    }


RELEASE_DATES = {
    "tinydep-1.0": "2024-01-01T00:00:00Z",
    "tinydep-2.0": "2024-06-01T00:00:00Z",
    "tinyengine-1.0": "2024-02-01T00:00:00Z",
    "tinyengine-1.1": "2024-07-01T00:00:00Z",
}


def start_index(wheels: dict[str, Path]) -> PackageIndex:
    """A running loopback index serving the test wheels with their release dates."""
    idx = PackageIndex()
    for key, wheel in wheels.items():
        idx.add(key.split("-")[0], wheel, RELEASE_DATES[key])
    return idx.start()


@pytest.fixture
def index(wheels):
    idx = start_index(wheels)
    yield idx
    idx.stop()


@pytest.fixture(autouse=True)
def _store_env(monkeypatch):
    # Managed-Python downloads cannot be reached offline; tests use the machine's interpreter.
    monkeypatch.setenv("LLMGW_STORE_PYTHON_PREFERENCE", "only-system")
    monkeypatch.delenv("LLMGW_STORE_ROOT", raising=False)
    monkeypatch.delenv("LLMGW_STORE_UV", raising=False)
    # No config file but the one a test writes: the machine's /etc/llmgw-store or ~/.config is not read.
    monkeypatch.setenv("LLMGW_STORE_CONFIG", "")


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "store-root"


@pytest.fixture
def recipe(tmp_path) -> Path:
    return write_recipe(tmp_path, 'version = "1.0"')


def cli_cmd(root: Path, *args: str) -> list[str]:
    """The installed console script, as a user (or cron) runs it."""
    exe = Path(sys.executable).with_name("llmgw-store")
    return [str(exe), "--root", str(root), *args]


def run_cli(root: Path, *args: str, check: bool = False, env: dict | None = None, timeout: float = 300):
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(cli_cmd(root, *args), capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def build_json(root: Path, recipe: Path, index: PackageIndex, uv: Path, *extra: str, **kw) -> dict:
    proc = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv), *extra,
                   check=True, **kw)
    return json.loads(proc.stdout)


def run_in_env(env_path: Path, *argv: str) -> str:
    return subprocess.run([str(env_path / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def build_store(tmp: Path, wheels: dict[str, Path], *as_ofs: str) -> dict:
    """A store holding tinyengine 1.0 built as of each date (unrooted), and the running index it
    came from (the caller stops it): the starting point of module-scoped fixtures."""
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    idx = start_index(wheels)
    root = tmp / "root"
    recipe = write_recipe(tmp, 'version = "1.0"')
    paths = [build_json(root, recipe, idx, real_uv(), "--as-of", d)["path"] for d in as_ofs]
    return {"root": root, "paths": paths, "names": [Path(p).name for p in paths], "recipe": recipe, "index": idx}


def copy_store(src: Path, dest: Path) -> Path:
    """A private copy of a template store for one test (cp -a keeps modes, links and the index)."""
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    return dest
