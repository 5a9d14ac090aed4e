"""Engines run as service users: a real second user runs and sources a root-owned profile (no write
to var/, no temp root), a store that others read gets an interpreter every user can execute, a build
that still makes a private environment says so, interpreter paths may have dot components, and
`--python` enters the key as the recipe's field would. A root the user may not write is one line,
exit 2."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from llmgw_store.build.interpreters import others_reach, why_others_cannot_run
from llmgw_store.build.recipe import python_problem
from tests.conftest import PYTHON, build_json, copy_store, run_cli, start_index, write_recipe
from tests.support.users import cli_as, local_user, run_as, system_python, traversable_dir

PRIVATE_PYTHON = os.path.realpath(sys.executable)  # here: root's pyenv, under the 0700 /root


@pytest.fixture(scope="module")
def shared():
    with traversable_dir("llmgw-svc-") as d:
        yield d


@pytest.fixture(scope="module")
def index(wheels):
    idx = start_index(wheels)
    yield idx
    idx.stop()


@pytest.fixture(scope="module")
def template(shared, index, uv_bin):
    """A store others read (its root is reachable), with profile p at tinyengine 1.0."""
    os.environ["LLMGW_STORE_PYTHON_PREFERENCE"] = "only-system"
    root = shared / "template"
    recipe = write_recipe(shared, 'version = "1.0"')
    proc = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   "--as-of", "2024-02-02", check=True)
    doc = json.loads(proc.stdout)
    run_cli(root, "activate", "p", doc["path"], check=True)
    return {"root": root, "doc": doc, "stderr": proc.stderr, "recipe": recipe}


@pytest.fixture
def store(template, shared, tmp_path):
    dest = copy_store(template["root"], shared / f"s-{tmp_path.name}")
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


@pytest.fixture(scope="module")
def service():
    with local_user("llmgwsvc") as user:
        yield user


def var_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root / "var"):
        for n in files:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


# --- a shared store prefers an interpreter every user can run --------------------------------------

def test_a_store_others_read_gets_an_interpreter_they_can_run(template):
    if not others_reach(template["root"]):
        pytest.skip(f"{template['root']} is not reachable by other users here")
    if system_python() is None:
        pytest.skip(f"no world-runnable python{PYTHON} on this machine to prefer")
    env = Path(template["doc"]["path"])
    assert why_others_cannot_run(env / "bin" / "python") is None
    if why_others_cannot_run(PRIVATE_PYTHON) is not None:
        # uv finds root's private one first on the full PATH here; the shared store took another
        assert os.path.realpath(env / "bin" / "python") != PRIVATE_PYTHON
    assert "warning: other users cannot run" not in template["stderr"]


# --- run and env as a service user ---------------------------------------------------------------

def test_a_service_user_runs_and_sources_a_root_owned_profile(store, service):
    if system_python() is None:
        pytest.skip(f"no world-runnable python{PYTHON} on this machine: the environment is root's alone")
    before = var_snapshot(store)
    ran = cli_as(service, store, "run", "p", "--", "tinyengine")
    assert ran.returncode == 0, ran.stderr
    assert "tinyengine 1.0" in ran.stdout
    lines = cli_as(service, store, "env", "p")
    assert lines.returncode == 0, lines.stderr
    assert f"export VIRTUAL_ENV={store / 'profiles' / 'p'}" in lines.stdout
    sourced = run_as(service, ["/bin/sh", "-c", 'eval "$1" && tinyengine', "sh", lines.stdout])
    assert sourced.returncode == 0 and "tinyengine 1.0" in sourced.stdout, sourced.stderr
    doc = json.loads(cli_as(service, store, "--json", "env", "p@1").stdout)
    assert doc["schema_version"] == 1 and doc["variables"]["VIRTUAL_ENV"].endswith("-tinyengine-1.0-cpu")
    # Reading wrote nothing under var/ and left no temp root.
    assert var_snapshot(store) == before
    assert not any(f.name.isdigit() for f in (store / "var" / "temproots").iterdir()
                   if os.stat(f).st_uid == service.pw_uid)


@pytest.mark.parametrize("args", [["gc"], ["activate", "q", "p@1"], ["pin", "x", "p@1"], ["stats"], ["doctor"]],
                         ids=" ".join)
def test_a_root_the_user_may_not_write_is_one_line_exit_2(store, service, args):
    before = sorted(os.listdir(store / "profiles")), sorted(os.listdir(store / "gcroots"))
    proc = cli_as(service, store, *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("llmgw-store:")]
    assert len(errors) == 1 and "permission denied" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert (sorted(os.listdir(store / "profiles")), sorted(os.listdir(store / "gcroots"))) == before


def test_a_reader_refuses_a_directory_another_user_planted(store, service):
    """Reading trusts the store's owner only: profiles/ owned by someone else is refused."""
    os.chown(store / "profiles", service.pw_uid, service.pw_gid)
    other = cli_as(service, store, "run", "p", "--", "true")
    try:
        assert other.returncode == 2 and "refusing to use the store directory" in other.stderr, other.stderr
    finally:
        os.chown(store / "profiles", 0, 0)


# --- what a build says, and --python --------------------------------------------------------------

def test_a_private_interpreter_in_a_shared_store_is_said_once(shared, index, uv_bin, tmp_path):
    """An explicit path with a dot component (root's pyenv), taken as given; the build says that
    other users cannot run what it made, and why."""
    if why_others_cannot_run(PRIVATE_PYTHON) is None or "/." not in PRIVATE_PYTHON:
        pytest.skip("this interpreter is not a private one under a dot directory")
    root = shared / f"private-{tmp_path.name}"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    try:
        proc = run_cli(root, "--json", "--progress=plain", "build", str(recipe), "--index-url", index.url,
                       "--uv", str(uv_bin), "--python", PRIVATE_PYTHON, "--as-of", "2024-02-02")
        assert proc.returncode == 0, proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if "warning: other users cannot run" in ln]
        assert len(warnings) == 1 and "mode 700" in warnings[0] and "--python" in warnings[0], proc.stderr
        doc = json.loads(proc.stdout)
        assert os.path.realpath(Path(doc["path"]) / "bin" / "python") == PRIVATE_PYTHON
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_python_on_the_command_line_enters_the_key_as_the_recipe_field_would(tmp_path, index, uv_bin):
    root = tmp_path / "root"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    plain = build_json(root, recipe, index, uv_bin, "--as-of", "2024-02-02")
    same = build_json(root, recipe, index, uv_bin, "--as-of", "2024-02-02", "--python", PYTHON)
    assert same["key"] == plain["key"] and same["how"] == "hit"
    path_python = system_python() or PRIVATE_PYTHON
    other = build_json(root, recipe, index, uv_bin, "--as-of", "2024-02-02", "--python", path_python)
    assert other["key"] != plain["key"]
    # ...and a recipe naming that path gets the very same key
    named = tmp_path / "named.toml"
    named.write_text(recipe.read_text().replace(f'python = "{PYTHON}"', f'python = "{path_python}"'))
    assert build_json(root, named, index, uv_bin, "--as-of", "2024-02-02")["key"] == other["key"]
    # the override is never answered from the build memo of a build without it
    again = run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                    "--as-of", "2024-02-02", env={"LLMGW_STORE_PYTHON": path_python}, check=True)
    assert json.loads(again.stdout)["key"] == other["key"]


@pytest.mark.parametrize("bad", ["/usr/bin/../bin/python3", "/usr/./bin/python3", "python3; id", "--foo", "/",
                                 "relative/python", "/usr/bin/py thon"])
def test_a_bad_python_is_exit_2_before_anything_is_written(tmp_path, index, uv_bin, bad):
    root = tmp_path / "root"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    proc = run_cli(root, "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin), f"--python={bad}")
    assert proc.returncode == 2 and "--python" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not root.exists()


def test_dot_components_are_paths_but_dot_and_dot_dot_are_not():
    assert python_problem("/root/.pyenv/versions/3.11.7/bin/python3.11") is None
    assert python_problem("/home/u/.local/share/uv/python/cpython-3.12/bin/python3") is None
    for bad in ("/a/../b", "/a/./b", "/a/..", "/.", "/a//b", "~/.pyenv/bin/python", "3.11\n", ""):
        assert python_problem(bad) is not None, bad


def test_who_can_run_what(tmp_path):
    private = tmp_path / "d"
    private.mkdir(mode=0o700)
    exe = private / "tool"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    os.chmod(private, 0o700)
    assert "mode 700" in why_others_cannot_run(exe)
    os.chmod(private, 0o755)
    if others_reach(tmp_path):
        assert why_others_cannot_run(exe) is None
        exe.chmod(0o750)
        assert "may not execute" in why_others_cannot_run(exe)
    link = tmp_path / "link"
    link.symlink_to(exe)
    assert why_others_cannot_run(link) == why_others_cannot_run(exe)
    assert stat.S_IMODE(os.stat(tmp_path).st_mode)  # the walk changed no mode


# --- discovery in a shared store does not start what a private PATH directory holds ----------------

def _shim_build(root: Path, tmp_path: Path, index, uv_bin) -> tuple[Path, dict]:
    """Build with a private directory first on PATH holding a python shim that leaves a mark each
    time it is started (as root's pyenv shims do work each time); (the mark, the build's JSON)."""
    private = tmp_path / "private-bin"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    mark = tmp_path / "shim-started"
    shim = private / f"python{PYTHON}"
    shim.write_text(f'#!/bin/sh\necho x >> "{mark}"\nexec "{system_python()}" "$@"\n')
    shim.chmod(0o755)
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    doc = build_json(root, recipe, index, uv_bin, "--as-of", "2024-02-02",
                     env={"PATH": f"{private}{os.pathsep}{os.environ.get('PATH', '')}",
                          "LLMGW_STORE_PYTHON_PREFERENCE": "only-system"})
    return mark, doc


def test_a_shared_store_does_not_start_an_interpreter_from_a_private_path_dir(shared, index, uv_bin, tmp_path):
    if system_python() is None:
        pytest.skip(f"no world-runnable python{PYTHON} on this machine")
    root = shared / f"pathdirs-{tmp_path.name}"
    try:
        if not others_reach(root.parent):
            pytest.skip(f"{shared} is not reachable by other users here")
        mark, doc = _shim_build(root, tmp_path, index, uv_bin)
        assert not mark.exists(), "discovery started the shim in a directory other users cannot enter"
        assert why_others_cannot_run(Path(doc["path"]) / "bin" / "python") is None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_private_store_still_finds_the_interpreter_first_on_path(tmp_path, index, uv_bin):
    """The positive case beside it: a store only its owner reads searches PATH as it stands, so
    the shim first on it is what uv starts."""
    if system_python() is None:
        pytest.skip(f"no world-runnable python{PYTHON} on this machine")
    root = tmp_path / "root"
    assert not others_reach(root.parent)  # pytest's tmp_path is private to its user
    mark, _doc = _shim_build(root, tmp_path, index, uv_bin)
    assert mark.exists()


def test_a_shared_store_says_a_failing_shim_once(shared, index, uv_bin, tmp_path):
    """A failing pyenv shim in a directory every user can enter, for a version nothing else has:
    both searches (other users' directories first, then the full PATH) pass over it; it is said
    once, and the error names it."""
    shims = shared / f"pyenv-{tmp_path.name}" / "shims"
    shims.mkdir(mode=0o755, parents=True)
    shim = shims / "python3.98"
    shim.write_text('#!/bin/sh\necho "pyenv: python3.98: command not found" >&2\necho >&2\n'
                    'echo "The \\`python3.98\' command exists in these Python versions:" >&2\necho "  3.98.1" >&2\n'
                    'exit 127\n')
    shim.chmod(0o755)
    root = shared / f"shim-{tmp_path.name}"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    recipe.write_text(recipe.read_text().replace(f'python = "{PYTHON}"', 'python = "3.98"'))
    try:
        if not others_reach(shims):
            pytest.skip(f"{shared} is not reachable by other users here")
        proc = run_cli(root, "--progress=plain", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                       "--as-of", "2024-02-02",
                       env={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
                            "LLMGW_STORE_PYTHON_PREFERENCE": "only-system"})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("passing over") == 1, proc.stderr
        assert f"{shim} is a pyenv shim for 3.98.1" in proc.stderr.splitlines()[-1]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shims.parent, ignore_errors=True)
