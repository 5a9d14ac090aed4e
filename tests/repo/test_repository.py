"""The repository builds as it says: flake.nix names exactly pyproject's dependencies (evaluated by
the real Nix against a stand-in nixpkgs that holds only the names it may use), its devShell carries
what the suite needs, and no artefact is committed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib

import pytest

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """nixpkgs' attribute of a PyPI requirement: its normalised name, extras dropped."""
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


RUNTIME = {_name(r) for r in PYPROJECT["project"]["dependencies"]} - {"uv"}  # uv: the binary, on PATH
TEST = {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]}
# What the devShell's Python holds for each of the test extra's requirements (and the uv module the
# suite asks for its uv binary); ruff and import-linter are applications in nixpkgs.
SHELL_PY = RUNTIME | {"pytest", "pytest-xdist", "boto3", "moto", "flask", "flask-cors", "uv", "pip", "setuptools", "mypy",
                      "module:import-linter"}
SHELL_TOOLS = {"uv", "ruff", "nix"}

STUB = """
let
  names = builtins.fromJSON ''%s'';
  ps = builtins.listToAttrs (map (n: { name = n; value = n; }) names) // {
    toPythonModule = drv: "module:" + drv;
    buildPythonApplication = args: args;
  };
  pkgs = {
    python3Packages = ps;
    python3.withPackages = f: { python = f ps; };
    mkShell = args: args;
    uv = "uv"; ruff = "ruff"; nix = "nix"; import-linter = "import-linter";
  };
  nixpkgs = {
    lib.genAttrs = systems: f: builtins.listToAttrs (map (s: { name = s; value = f s; }) systems);
    legacyPackages = { x86_64-linux = pkgs; aarch64-linux = pkgs; };
  };
  out = (import %s/flake.nix).outputs { self = {}; inherit nixpkgs; };
  package = out.packages.x86_64-linux.default;
  shell = out.devShells.x86_64-linux.default;
in {
  dependencies = package.dependencies;
  removed = package.pythonRemoveDeps;
  systems = builtins.attrNames out.packages;
  shellPython = (builtins.head shell.packages).python;
  shellTools = builtins.tail shell.packages;
}
"""


@pytest.fixture(scope="module")
def flake() -> dict:
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("Debian's nix-bin is not installed (.ci/run installs it)")
    names = sorted(RUNTIME | SHELL_PY | {"setuptools"})
    expr = STUB % (json.dumps(names), REPO)
    proc = subprocess.run([nix, "--eval", "--strict", "--json", "--expr", expr], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr  # an unknown name in the flake is an undefined variable here
    return json.loads(proc.stdout)


def test_the_package_depends_on_exactly_pyprojects_dependencies(flake):
    assert RUNTIME == {"httpx", "blake3", "click", "packaging", "zstandard", "pynacl"}  # sqlite-utils: dropped
    assert sorted(flake["dependencies"]) == sorted(RUNTIME)
    assert flake["removed"] == ["uv"] and flake["systems"] == ["aarch64-linux", "x86_64-linux"]


def test_the_dev_shell_holds_what_the_suite_and_ci_run(flake):
    assert set(flake["shellPython"]) == SHELL_PY
    assert set(flake["shellTools"]) == SHELL_TOOLS
    assert TEST == {"pytest", "pytest-xdist", "boto3", "moto", "import-linter", "ruff", "mypy"}  # each one mapped above


def test_no_artefacts_are_committed():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert not [f for f in files if f.endswith((".whl", ".tar.gz", ".pyc", ".so")) or f.startswith(".venv")]
    links = [f for f in files if (REPO / f).is_symlink()]
    assert links == [], f"links committed: {links}"


def test_the_package_ships_its_type_marker():
    """PEP 561: store/py.typed is in the wheel, so a user's type checker reads the annotations."""
    assert (REPO / "store" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["llmgw_store"]


def test_ci_type_checks_before_the_suite():
    """.ci/run runs .ci/mypy (which fails the run on any error) and ends with the test command, so
    pytest's summary stays the last line."""
    lines = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert any(ln.split("#")[0].strip() == ".ci/mypy" for ln in lines)
    assert lines[-1] == ".venv/bin/python -m pytest"
    assert os.access(REPO / ".ci" / "mypy", os.X_OK)


# A test file named as evidence (docs, README, the benches, CI, comments in the code) by its path.
TEST_PATH = re.compile(r"(?<![\w.])tests/(?:\w+/)*test_\w+\.py\b")


def test_every_test_file_named_by_path_exists():
    named = {}
    for top in ("README.md", "docs", "bench", ".ci", "flake.nix", "pyproject.toml", "cli", "store", "tests"):
        for f in [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*")):
            if f.is_file() and "old_indexes" not in f.parts and f.suffix in ("", ".md", ".py", ".nix", ".toml", ".sql"):
                for path in TEST_PATH.findall(f.read_text(errors="replace")):
                    named.setdefault(path, f.relative_to(REPO))
    assert len(named) > 20  # the pattern still finds the docs' references
    missing = {p: str(f) for p, f in named.items() if not (REPO / p).is_file()}
    assert missing == {}, f"named but not there (test path: where named): {missing}"
