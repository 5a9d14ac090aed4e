"""The rest of the seed's installer: a second index for named packages only (PEP 751 lock)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.conftest import PYTHON, build_json, run_cli, run_in_env
from tests.support.index_server import PackageIndex
from tests.support.wheels import build_wheel

RECIPE = """
[engine]
name = "tinyengine"
binary = "tinyengine"

[[build]]
variant = "cu126"
python = "{python}"
version = "1.0"
requirements = ["tinyengine=={{version}}"]
verify = ["tinyengine"]
extra_index = "{extra}"
index_packages = {packages}
"""


@pytest.fixture(scope="module")
def two_indexes(tmp_path_factory):
    """The main index serves tinyengine (which needs tinytorch and tinytriton) and both of those;
    the second index serves tinytorch's CUDA build and a *higher* tinytriton, as an attacker who
    registered it there would."""
    d = tmp_path_factory.mktemp("two-indexes")
    main, extra = PackageIndex(), PackageIndex()
    day = "2024-01-01T00:00:00Z"
    engine = build_wheel(d / "main", "tinyengine", "1.0", requires=("tinytorch", "tinytriton"),
                         scripts={"tinyengine": "tinyengine:main"})
    main.add("tinyengine", engine, "2024-02-01T00:00:00Z")
    main.add("tinytorch", build_wheel(d / "main", "tinytorch", "1.0"), day)
    main.add("tinytriton", build_wheel(d / "main", "tinytriton", "1.0"), day)
    extra.add("tinytorch", build_wheel(d / "extra", "tinytorch", "1.0+cu126"), day)
    extra.add("tinytorch", build_wheel(d / "extra", "tinytorch", "2.0+cu126"), "2024-06-01T00:00:00Z")  # after as_of
    extra.add("tinytriton", build_wheel(d / "extra", "tinytriton", "9.0"), day)
    main.start(), extra.start()
    yield main, extra
    main.stop(), extra.stop()


def _recipe(tmp_path: Path, extra: PackageIndex, packages: list[str]) -> Path:
    f = tmp_path / "cuda.toml"
    f.write_text(RECIPE.format(python=PYTHON, extra=extra.url, packages=json.dumps(packages)))
    return f


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
    f = tmp_path / "bad.toml"
    f.write_text(RECIPE.format(python=PYTHON, extra=extra.url, packages="[]"))
    proc = run_cli(tmp_path / "root", "build", str(f), "--index-url", main.url)
    assert proc.returncode == 2 and "build[0].extra_index: extra_index and a non-empty index_packages go together" in proc.stderr
