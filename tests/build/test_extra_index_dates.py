"""An extra index that serves no upload-time (PyTorch's; uv issue 16846): its packages must be
pinned exactly, are then exempt from the resolution date, and everything else stays date-bound;
an unpinned one is refused naming the package."""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path

import pytest

from tests.conftest import build_json, run_cli, run_in_env
from tests.support.index_server import PackageIndex
from tests.support.recipes import write_recipe
from tests.support.wheels import build_wheel


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """Main index (with dates): tinyengine 1.0 (needs tinytorch and tinydep), tinydep 1.0 and a
    2.0 uploaded after the resolution date, and a tinytorch 1.0 that must not be used. Extra index,
    no dates: tinytorch 1.0+cu126 and 2.0+cu126."""
    d = tmp_path_factory.mktemp("dateless")
    main, extra = PackageIndex(), PackageIndex(upload_times=False)
    day = "2024-01-01T00:00:00Z"
    main.add("tinyengine", build_wheel(d / "main", "tinyengine", "1.0", requires=("tinytorch", "tinydep"),
                                       scripts={"tinyengine": "tinyengine:main"}), "2024-02-01T00:00:00Z")
    main.add("tinydep", build_wheel(d / "main", "tinydep", "1.0"), day)
    main.add("tinydep", build_wheel(d / "main", "tinydep", "2.0"), "2024-06-01T00:00:00Z")
    main.add("tinytorch", build_wheel(d / "main", "tinytorch", "1.0"), day)
    wheels = {}
    for v in ("1.0+cu126", "2.0+cu126"):
        wheels[v] = build_wheel(d / "extra", "tinytorch", v)
        extra.add("tinytorch", wheels[v], "2024-06-01T00:00:00Z")  # not served: upload_times=False
    main.start(), extra.start()
    yield main, extra, {v: hashlib.sha256(w.read_bytes()).hexdigest() for v, w in wheels.items()}
    main.stop(), extra.stop()


def _recipe(tmp_path: Path, extra: PackageIndex, pins: str = "", requirements=("tinyengine=={version}",)) -> Path:
    return write_recipe(tmp_path, f'version = "1.0"\n{pins}', "cuda.toml", variant="cu126", requirements=requirements,
                        extra_index=extra.url, index_packages=["tinytorch"])


def _store_names(root: Path) -> list[str]:
    store = root / "store"
    return sorted(n for n in os.listdir(store) if "tinyengine" in n) if store.exists() else []


def _locked(env: Path) -> dict[str, tuple[str, str]]:
    lock = tomllib.loads((env / ".llmgw" / "pylock.toml").read_text())
    return {p["name"]: (p["version"], p["wheels"][0]["url"]) for p in lock["packages"]}


def test_the_extra_index_really_serves_no_upload_time(indexes):
    from llmgw_store.build import pypi

    main, extra, _ = indexes
    assert all(f.upload_time is None for f in pypi.project_files(extra.url, "tinytorch"))
    assert all(f.upload_time is not None for f in pypi.project_files(main.url, "tinydep"))


def test_pinned_in_index_pins_builds_the_pin_and_the_rest_stays_date_bound(tmp_path, indexes, uv_bin):
    main, extra, _ = indexes
    root = tmp_path / "root"
    doc = build_json(root, _recipe(tmp_path, extra, 'index_pins = { tinytorch = "2.0+cu126" }'), main, uv_bin)
    env = Path(doc["path"])
    # tinytorch from the extra index at the pinned version; tinydep as the main index stood at
    # as_of (1.0: 2.0 came later), tinytorch 1.0 of the main index never used.
    assert run_in_env(env, "tinyengine") == "tinyengine 1.0 tinytorch 2.0+cu126 tinydep 1.0"
    locked = _locked(env)
    assert locked["tinytorch"][0] == "2.0+cu126" and locked["tinytorch"][1].startswith(extra.url.rsplit("/simple")[0])
    assert locked["tinydep"][0] == "1.0" and locked["tinydep"][1].startswith(main.url.rsplit("/simple")[0])
    # The pin is a requirement of the recorded pyproject, and part of the key's inputs.
    assert '"tinytorch==2.0+cu126"' in (env / ".llmgw" / "pyproject.toml").read_text()
    info = json.loads(run_cli(root, "--json", "info", doc["path"], check=True).stdout)
    assert info["manifest"]["inputs"]["build"]["index_pins"] == {"tinytorch": "2.0+cu126"}
    # It rebuilds to the same bytes from its recorded lock.
    proc = run_cli(root, "--json", "build", str(tmp_path / "cuda.toml"), "--check", "--index-url", main.url,
                   "--uv", str(uv_bin))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["identical"] is True


def test_pinned_in_requirements_and_by_digest(tmp_path, indexes, uv_bin):
    main, extra, digests = indexes
    doc = build_json(tmp_path / "a", _recipe(tmp_path, extra, requirements=("tinyengine=={version}", "tinytorch==1.0+cu126")),
                     main, uv_bin)
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinytorch 1.0+cu126 tinydep 1.0"
    pin = f'index_pins = {{ tinytorch = {{ version = "2.0+cu126", sha256 = ["{digests["2.0+cu126"]}"] }} }}'
    doc = build_json(tmp_path / "b", _recipe(tmp_path, extra, pin), main, uv_bin)
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinytorch 2.0+cu126 tinydep 1.0"


def test_unpinned_package_of_a_dateless_index_is_refused_naming_it(tmp_path, indexes, uv_bin):
    main, extra, _ = indexes
    root = tmp_path / "root"
    proc = run_cli(root, "build", _recipe(tmp_path, extra).as_posix(), "--index-url", main.url, "--uv", str(uv_bin))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("llmgw-store: error: ") and "build[0].index_pins" in line
    assert "tinytorch comes from" in line and "publishes no upload-time" in line
    assert 'index_pins = { tinytorch = "2.0+cu126" }' in line  # the fix, spelled out
    assert _store_names(root) == []


def test_a_pin_the_index_does_not_have_is_a_clear_error(tmp_path, indexes, uv_bin):
    main, extra, digests = indexes
    root = tmp_path / "root"
    proc = run_cli(root, "build", _recipe(tmp_path, extra, 'index_pins = { tinytorch = "3.0" }').as_posix(),
                   "--index-url", main.url, "--uv", str(uv_bin))
    assert proc.returncode == 2, proc.stderr
    assert f"the extra index {extra.url} has no tinytorch 3.0 (it has: 2.0+cu126, 1.0+cu126)" in proc.stderr
    # A digest that none of the pinned version's files has.
    pin = f'index_pins = {{ tinytorch = {{ version = "2.0+cu126", sha256 = "{digests["1.0+cu126"]}" }} }}'
    proc = run_cli(root, "build", _recipe(tmp_path, extra, pin).as_posix(), "--index-url", main.url, "--uv", str(uv_bin))
    assert proc.returncode == 2, proc.stderr
    assert "no file of tinytorch 2.0+cu126" in proc.stderr and "pinned sha256" in proc.stderr
    assert _store_names(root) == []


@pytest.mark.parametrize("pins, field, says", [
    ('index_pins = { tinydep = "1.0" }', "build[0].index_pins.tinydep", "is not one of index_packages"),
    ('index_pins = { tinytorch = "2.0 ; os" }', "build[0].index_pins.tinytorch", "is not an exact version"),
    ('index_pins = { tinytorch = ">=2" }', "build[0].index_pins.tinytorch", "is not an exact version"),
    ('index_pins = { tinytorch = { version = "2.0", sha256 = "abc" } }', "build[0].index_pins.tinytorch.sha256",
     "sha256"),
    ('index_pins = { tinytorch = { version = "2.0", url = "file:///etc" } }', "build[0].index_pins.tinytorch.url",
     "unknown field"),
    ('index_pins = { "tinytorch\\n--index-url=http://evil" = "2.0" }', "build[0].index_pins", "is not a project name"),
    ('index_pins = { tinytorch = 2 }', "build[0].index_pins.tinytorch", "version string"),
])
def test_bad_index_pins_are_recipe_errors(tmp_path, indexes, pins, field, says):
    main, extra, _ = indexes
    proc = run_cli(tmp_path / "root", "build", _recipe(tmp_path, extra, pins).as_posix(), "--index-url", main.url)
    assert proc.returncode == 2, proc.stderr
    assert f"{field}: " in proc.stderr and says in proc.stderr


def test_index_pins_without_an_extra_index_is_a_recipe_error(tmp_path, indexes):
    main, extra, _ = indexes
    f = write_recipe(tmp_path, 'version = "1.0"\nindex_pins = { tinytorch = "2.0" }', "r.toml", variant="cu126",
                     requirements=["tinyengine"])
    proc = run_cli(tmp_path / "root", "build", str(f), "--index-url", main.url)
    assert proc.returncode == 2 and "build[0].index_pins: pins packages of the extra index" in proc.stderr


def test_pin_from_main_index_takes_the_engines_own_requirement(tmp_path, indexes, uv_bin):
    """`from-main-index`: the requirements resolved on the main index alone, date-bound, give
    tinytorch 1.0 (what tinyengine gets there): the extra index's 1.0+cu126 is installed, not its
    newer 2.0+cu126; and a rebuild from the recorded lock writes the same pyproject."""
    main, extra, _ = indexes
    root = tmp_path / "root"
    recipe = _recipe(tmp_path, extra, 'index_pins = { tinytorch = "from-main-index" }')
    doc = build_json(root, recipe, main, uv_bin)
    env = Path(doc["path"])
    assert run_in_env(env, "tinyengine") == "tinyengine 1.0 tinytorch 1.0+cu126 tinydep 1.0"
    assert '"tinytorch==1.0"' in (env / ".llmgw" / "pyproject.toml").read_text()
    assert _locked(env)["tinytorch"][1].startswith(extra.url.rsplit("/simple")[0])
    assert not [n for n in os.listdir(root / "var" / "tmp") if n.startswith("derive-")]
    proc = run_cli(root, "--json", "build", str(recipe), "--check", "--index-url", main.url, "--uv", str(uv_bin))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["identical"] is True


def test_pin_from_main_index_of_a_package_nothing_requires_is_refused(tmp_path, indexes, uv_bin):
    main, extra, _ = indexes
    f = _recipe(tmp_path, extra, 'index_pins = { tinytorch = "from-main-index" }', requirements=["tinydep"])
    proc = run_cli(tmp_path / "root", "build", str(f), "--index-url", main.url, "--uv", str(uv_bin), "--version", "1.0")
    assert proc.returncode == 2, proc.stderr
    assert "build[0].index_pins.tinytorch" in proc.stderr and "nothing the build requires needs tinytorch" in proc.stderr


def test_the_lock_is_checked_against_every_pin():
    """After resolving, a lock that holds another version, or a file whose digest the pin does not
    list (a mirror that changed a file between the listing and the resolution), is refused."""
    from llmgw_store.base.errors import IntegrityError
    from llmgw_store.build import indexpins

    good, bad = "a" * 64, "b" * 64
    lock = ('lock-version = "1.0"\n[[packages]]\nname = "tinytorch"\nversion = "2.0+cu126"\n'
            f'wheels = [{{ url = "http://x/tinytorch-2.0+cu126-py3-none-any.whl", hashes = {{ sha256 = "{bad}" }} }}]\n')
    indexpins.check_lock(lock, {"tinytorch": indexpins.Pin("tinytorch", "2.0")})  # 2.0 takes 2.0+cu126
    with pytest.raises(IntegrityError, match=r"resolved tinytorch to '2\.0\+cu126', not the pinned 1\.0"):
        indexpins.check_lock(lock, {"tinytorch": indexpins.Pin("tinytorch", "1.0")})
    with pytest.raises(IntegrityError, match=f"has sha256 '{bad}', which index_pins does not list"):
        indexpins.check_lock(lock, {"tinytorch": indexpins.Pin("tinytorch", "2.0+cu126", (good,))})
    with pytest.raises(IntegrityError, match="resolved tinydep to nothing"):
        indexpins.check_lock(lock, {"tinydep": indexpins.Pin("tinydep", "1.0")})


@pytest.mark.parametrize("requirement", [
    "tinytorch==1.0+cu126; python_version<'3'",  # an exact pin the marker turns off on every host
    "tinytorch==1.0+cu126; sys_platform == 'linux'",  # on today, off on another host of the fleet
    "tinytorch>=1; python_version<'3'",
])
def test_a_marker_on_an_index_packages_requirement_is_refused(tmp_path, indexes, uv_bin, requirement):
    """`tinytorch==1.0+cu126; python_version<'3'` looked like an exact pin (so the date filter was
    lifted) while uv skipped it and took tinytorch from the main index instead."""
    main, extra, _ = indexes
    root = tmp_path / "root"
    recipe = _recipe(tmp_path, extra, requirements=("tinyengine=={version}", requirement))
    proc = run_cli(root, "build", recipe.as_posix(), "--index-url", main.url, "--uv", str(uv_bin))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("llmgw-store: error: ") and "build[0].requirements" in line
    assert "names tinytorch" in line and "environment marker" in line
    assert _store_names(root) == []


def test_a_marker_on_another_package_is_kept(tmp_path, indexes, uv_bin):
    main, extra, _ = indexes
    recipe = _recipe(tmp_path, extra, requirements=("tinyengine=={version}", "tinytorch==1.0+cu126",
                                                    "tinydep; python_version>='3'"))
    doc = build_json(tmp_path / "a", recipe, main, uv_bin)
    assert run_in_env(Path(doc["path"]), "tinyengine") == "tinyengine 1.0 tinytorch 1.0+cu126 tinydep 1.0"


def test_an_invalid_requirement_is_a_one_line_error(tmp_path, indexes, uv_bin):
    main, extra, _ = indexes
    recipe = _recipe(tmp_path, extra, 'index_pins = { tinytorch = "1.0+cu126" }',
                     requirements=("tinyengine=={version}", "accel>=2.0+cu"))
    proc = run_cli(tmp_path / "root", "build", recipe.as_posix(), "--index-url", main.url, "--uv", str(uv_bin))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("llmgw-store: error: ") and "'accel>=2.0+cu' is not a requirement" in lines[-1]
    assert not any(ln.strip().startswith("~") or ln.strip() == "accel>=2.0+cu" for ln in lines)
