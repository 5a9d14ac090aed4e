"""Hostile recipes, archives and release answers: no recipe field reaches outside the build directory.

Every build here runs with a test-owned copy of the interpreter as the environment's base
(`python = "<copy>"`): bin/python is a link to it, so a write through that link lands on the copy,
never on the machine's Python (the store runs as root, and so do these tests). Each attack checks
that the copy, the real interpreter and a sentinel beside the store are unchanged, and that nothing
new appeared outside the store root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from llmgw_store.base.errors import RecipeError
from llmgw_store.build import fetch
from llmgw_store.build import recipe as recipes
from llmgw_store.system.trees import sha256_of
from tests.conftest import PYTHON, build_json, run_cli, run_in_env
from tests.support.indexes import releases  # noqa: F401  (fixture)
from tests.support.recipes import FULL, GOOD_SOURCE, TOOL, file_member, make_tar
from tests.support.release_server import ReleaseServer

REAL_PYTHON = Path(sys.executable).resolve()
SITE = f"lib/python{PYTHON}/site-packages"


@pytest.fixture
def base_python(tmp_path_factory) -> Path:
    """A copy of the interpreter binary (small: libpython is shared), the base of the test's builds;
    one per test, so an attack that got through spoils no other test."""
    bindir = tmp_path_factory.mktemp("base-python") / "bin"
    bindir.mkdir()
    copy = bindir / REAL_PYTHON.name
    shutil.copy2(REAL_PYTHON, copy)
    return copy


class Untouched:
    """What no build may change: the base interpreter (copy and original), a sentinel beside the
    store, and the listing of the directory holding the store root (only `root` and the recipe may appear)."""

    def __init__(self, tmp_path: Path, base_python: Path):
        self.dir = tmp_path
        (tmp_path / "sentinel").write_text("sentinel\n")
        self.files = [base_python, REAL_PYTHON, tmp_path / "sentinel"]
        self.hashes = [sha256_of(f) for f in self.files]
        self.listing = set(os.listdir(tmp_path)) | {"root", "attack.toml"}

    def check(self) -> None:
        assert [sha256_of(f) for f in self.files] == self.hashes
        assert set(os.listdir(self.dir)) <= self.listing, "something was written beside the store root"


def _recipe(tmp_path: Path, releases: ReleaseServer, base_python: Path, source: list,
            *changes: tuple[str, str]) -> Path:
    sha = releases.add("org/tinyengine", "src", "tinysrc.tar.gz", make_tar(source))
    text = FULL.format(python=base_python, base=releases.base, sha=sha)
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    f = tmp_path / "attack.toml"
    f.write_text(text)
    return f


def _build(tmp_path: Path, recipe: Path, index, uv_bin, releases: ReleaseServer):
    return run_cli(tmp_path / "root", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_GITHUB_API": releases.base})


def _store_is_empty(tmp_path: Path) -> bool:
    store = tmp_path / "root" / "store"
    return not store.exists() or list(store.iterdir()) == []


# --- refused when the recipe is read: exit 2, one line naming file and field, nothing written -------

ASSETS = 'assets = ["tinytool"]'
ASSET_TAG = 'asset_tag = "v{version}"'
LOAD_TIME = {
    "dir .llmgw": ('dir = "src"', 'dir = ".llmgw"', "source.dir"),
    "dir bin": ('dir = "src"', 'dir = "bin"', "source.dir"),
    "dir ../outside": ('dir = "src"', 'dir = "../../../escaped"', "source.dir"),
    "dir absolute": ('dir = "src"', 'dir = "{tmp}/escaped"', "source.dir"),
    "dir site-packages": ('dir = "src"', f'dir = "{SITE}/evil"', "source.dir"),
    "requirements ../": ('requirements = "requirements.txt"', 'requirements = "../outside"', "source.requirements"),
    "asset python3": (ASSETS, 'assets = ["python3"]', "assets"),
    "asset ../x": (ASSETS, 'assets = ["../../../../escaped"]', "assets"),
    "asset absolute": (ASSETS, 'assets = ["{tmp}/escaped"]', "assets"),
    "asset newline": (ASSETS, 'assets = ["tinytool\\n"]', "assets"),
    "asset_dir ../x": (ASSET_TAG, ASSET_TAG + '\nasset_dir = "../../../escaped"', "asset_dir"),
    "asset_dir .llmgw": (ASSET_TAG, ASSET_TAG + '\nasset_dir = ".llmgw"', "asset_dir"),
}


@pytest.mark.parametrize("case", list(LOAD_TIME))
def test_hostile_paths_are_refused_when_the_recipe_is_read(tmp_path, index, releases, uv_bin, base_python, case):
    old, new, field = LOAD_TIME[case]
    new = new.replace("{tmp}", str(tmp_path))
    for name in ("python3", "../../../../escaped", f"{tmp_path}/escaped", "tinytool\n"):
        releases.add("org/tinyengine", "v1.0", name, TOOL)  # a hostile release serves every such name
    guard = Untouched(tmp_path, base_python)
    recipe = _recipe(tmp_path, releases, base_python, GOOD_SOURCE, (old, new))
    proc = _build(tmp_path, recipe, index, uv_bin, releases)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"llmgw-store: error: {recipe}: build[0].{field}: ") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "root").exists()  # refused before the store was opened
    guard.check()


# --- refused while building: the writes themselves follow no link and replace nothing ------------

def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


# Each archive passes the unpacker (its links stay inside the archive) and each recipe passes
# validation; what stops them is that a write never goes through a link and never replaces a file.
BUILD_TIME = {
    # src/tinytool -> ../bin/python, the venv's link to the base interpreter; the asset is then
    # written "to src/tinytool".
    "asset through a link to bin/python": (
        [*GOOD_SOURCE, _link("tinysrc-1.0/tinytool", "../bin/python")],
        [(ASSET_TAG, ASSET_TAG + '\nasset_dir = "src"')], ("already exists", "refusing to unpack")),
    # src/tools -> site-packages, and the asset is a .pth file: code run by every interpreter start.
    "asset_dir through a link to site-packages": (
        [*GOOD_SOURCE, _link("tinysrc-1.0/tools", f"../{SITE}")],
        [(ASSET_TAG, ASSET_TAG + '\nasset_dir = "src/tools"'), (ASSETS, 'assets = ["evil.pth"]')],
        ("passes through a link", "refusing to unpack")),
    "asset over a file of the source": (
        [*GOOD_SOURCE, file_member("tinysrc-1.0/tinytool", b"source's own\n")],
        [(ASSET_TAG, ASSET_TAG + '\nasset_dir = "src"')], ("src/tinytool already exists",)),
    # The requirements file is a link to a file beside the source's top directory.
    "requirements file is a link": (
        [file_member("outside", b"tinydep<0.1\n"), _link("tinysrc-1.0/requirements.txt", "../outside"),
         file_member("tinysrc-1.0/serve.py", b"")],
        [('dir = "src"', 'dir = "src"\ntop = "tinysrc-1.0"')], ("symbolic link", "leads out of tinysrc-1.0/")),
    "requirements file under a linked directory": (
        [file_member("other/requirements.txt", b"tinydep<0.1\n"), _link("tinysrc-1.0/reqs", "../other"),
         file_member("tinysrc-1.0/serve.py", b"")],
        [('dir = "src"', 'dir = "src"\ntop = "tinysrc-1.0"'),
         ('requirements = "requirements.txt"', 'requirements = "reqs/requirements.txt"')],
        ("symbolic link", "leads out of tinysrc-1.0/")),
    # Only top (nested) moves into the environment, as src/: kern -> ../../victim stays inside the
    # archive's top-level directory but, once moved, is src/../../victim, beside the store.
    "a link under a nested top that leaves it": (
        [file_member("tinysrc-1.0/x/y/requirements.txt", b"tinydep<2\n"), file_member("tinysrc-1.0/x/y/serve.py", b""),
         file_member("tinysrc-1.0/victim/keep", b""), _link("tinysrc-1.0/x/y/kern", "../../victim")],
        [('dir = "src"', 'dir = "src"\ntop = "tinysrc-1.0/x/y"')], ("leads out of tinysrc-1.0/x/y/",)),
    "requirements file is a link to /etc/passwd": (
        [_link("tinysrc-1.0/requirements.txt", "/etc/passwd"), file_member("tinysrc-1.0/serve.py", b"")],
        [], ("symbolic link", "refusing to unpack")),
}


@pytest.mark.parametrize("case", list(BUILD_TIME))
def test_hostile_archives_and_assets_are_refused_while_building(tmp_path, index, releases, uv_bin, base_python, case):
    source, changes, words = BUILD_TIME[case]
    releases.add("org/tinyengine", "v1.0", "evil.pth", b"import sys\n")
    guard = Untouched(tmp_path, base_python)
    proc = _build(tmp_path, _recipe(tmp_path, releases, base_python, source, *changes), index, uv_bin, releases)
    error = proc.stderr.splitlines()[-1]  # the lines before it are the build's progress
    assert proc.returncode in (1, 2) and any(w in error for w in words), proc.stderr
    assert error.startswith("llmgw-store: error: ") and "Traceback" not in proc.stderr
    assert "root:" not in proc.stderr  # nothing of /etc/passwd is read out
    assert _store_is_empty(tmp_path)
    guard.check()


def test_genuine_nested_source_asset_dir_and_requirements_still_build(tmp_path, index, releases, uv_bin, base_python):
    source = [file_member("tinysrc-1.0/reqs/requirements.txt", b"tinydep<2\n"),
              file_member("tinysrc-1.0/serve.py", b"print('serving')\n"), file_member("notes.txt", b"")]
    guard = Untouched(tmp_path, base_python)
    recipe = _recipe(tmp_path, releases, base_python, source,
                     ('dir = "src"', 'dir = "opt/tinysrc-{version}"\ntop = "tinysrc-1.0"'),
                     ('requirements = "requirements.txt"', 'requirements = "reqs/requirements.txt"'),
                     (ASSET_TAG, ASSET_TAG + '\nasset_dir = "share/tinyengine"'))
    doc = build_json(tmp_path / "root", recipe, index, uv_bin, env={"LLMGW_STORE_GITHUB_API": releases.base})
    env = Path(doc["path"])
    assert (env / "opt" / "tinysrc-1.0" / "serve.py").read_text() == "print('serving')\n"
    tool = env / "share" / "tinyengine" / "tinytool"
    assert tool.read_bytes() == TOOL and not stat.S_IMODE(tool.stat().st_mode) & 0o111  # not in bin: not executable
    assert run_in_env(env, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    assert (env / "bin" / "python").resolve() == base_python  # the attacks above really aimed at the copy
    guard.check()


# --- the no-follow helpers on their own ----------------------------------------------------------

def test_requirements_file_must_be_a_regular_file_reached_without_links(tmp_path):
    tree = tmp_path / "tree"
    (tree / "top" / "reqs").mkdir(parents=True)
    (tree / "top" / "reqs" / "r.txt").write_text("tinydep<2\n")
    assert fetch.source_requirements(tree, "top/reqs/r.txt", "r.toml", "build[0].source") == ["tinydep<2"]
    (tree / "top" / "passwd").symlink_to("/etc/passwd")
    (tree / "top" / "etc").symlink_to("/etc")
    os.mkfifo(tree / "top" / "fifo")
    (tree / "top" / "big").write_bytes(b"#" * (fetch.MAX_REQUIREMENTS_BYTES + 1))
    (tree / "link-top").symlink_to("top")
    for rel, words in [("top/passwd", "symbolic link"), ("top/etc/passwd", "symbolic link"),
                       ("link-top/reqs/r.txt", "symbolic link"), ("top/fifo", "not a regular file"),
                       ("top/big", "larger than"), ("top/missing", "no file")]:
        with pytest.raises(RecipeError) as err:
            fetch.source_requirements(tree, rel, "r.toml", "build[0].source")
        assert err.value.field == "build[0].source.requirements" and words in err.value.problem
        assert "root:" not in str(err.value)


def test_install_file_never_writes_through_a_link_or_over_a_file(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    env, payload = tmp_path / "env", tmp_path / "payload"
    (env / "bin").mkdir(parents=True)
    payload.write_text("payload\n")
    (env / "bin" / "python").symlink_to(victim)
    (env / "bin" / "tool").write_text("mine\n")
    fd = fetch.open_dir(env, "bin")
    try:
        for name in ("python", "tool"):
            with pytest.raises(RecipeError, match="already exists in the environment"):
                fetch.install_file(payload, fd, name, 0o755, f"bin/{name}", "r.toml", "build[0].assets")
        fetch.install_file(payload, fd, "new", 0o755, "bin/new", "r.toml", "build[0].assets")
    finally:
        os.close(fd)
    assert victim.read_text() == "victim\n" and (env / "bin" / "tool").read_text() == "mine\n"
    new = env / "bin" / "new"
    assert new.read_text() == "payload\n" and stat.S_IMODE(new.stat().st_mode) == 0o755


def test_move_tree_follows_no_link_on_either_side(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    env, scratch = tmp_path / "env", tmp_path / "scratch"
    env.mkdir()
    (env / "lib64").symlink_to(outside)
    (scratch / "top").mkdir(parents=True)
    (scratch / "top" / "f").write_text("x")
    (scratch / "linked").symlink_to("top")
    with pytest.raises(RecipeError, match="passes through a link"):
        fetch.move_tree(scratch, "top", env, "lib64/src", "r.toml", "build[0].source")
    with pytest.raises(RecipeError, match="is a link or a file"):
        fetch.move_tree(scratch, "linked", env, "src", "r.toml", "build[0].source")
    (env / "taken").mkdir()
    with pytest.raises(RecipeError, match="already exists"):
        fetch.move_tree(scratch, "top", env, "taken", "r.toml", "build[0].source")
    assert list(outside.iterdir()) == [] and list((env / "taken").iterdir()) == []
    fetch.move_tree(scratch, "top", env, "opt/src", "r.toml", "build[0].source")
    assert (env / "opt" / "src" / "f").read_text() == "x" and not (scratch / "top").exists()


# --- a hostile release API: its names, digests and URLs become paths and requirement lines --------

def test_release_digest_that_is_not_hex_is_refused_before_it_names_a_file(tmp_path, index, releases, uv_bin,
                                                                          base_python):
    # The digest names the cached download (downloads/<sha256[:16]>-<name>): sixteen characters
    # of '../' would put it beside the store root.
    releases.digests["tinytool"] = "sha256:../../../../escaped" + "0" * 40
    guard = Untouched(tmp_path, base_python)
    proc = _build(tmp_path, _recipe(tmp_path, releases, base_python, GOOD_SOURCE), index, uv_bin, releases)
    error = proc.stderr.splitlines()[-1]
    assert proc.returncode == 1 and "publishes a malformed sha256 digest for tinytool; refusing it" in error, proc.stderr
    assert _store_is_empty(tmp_path) and not list((tmp_path / "root").glob("**/*escaped*"))
    guard.check()


def test_release_url_that_would_add_a_requirement_line_is_refused(tmp_path, index, releases, uv_bin, base_python):
    # The release wheel becomes `project @ <url>#sha256=...`, one line of the requirements file
    # given to uv: a newline in the URL would add an option line (another index) of its own.
    wheel = next(n for n in releases.releases[("org/tinyengine", "v1.0")] if n.endswith(".whl"))
    releases.urls[wheel] = f"{releases.base}/download/v1.0/{wheel}\n--extra-index-url http://127.0.0.1:9/simple"
    guard = Untouched(tmp_path, base_python)
    proc = _build(tmp_path, _recipe(tmp_path, releases, base_python, GOOD_SOURCE), index, uv_bin, releases)
    error = proc.stderr.splitlines()[-1]
    assert proc.returncode == 1 and f"download URL for {wheel} that is not a plain http(s) URL" in error, proc.stderr
    assert _store_is_empty(tmp_path)
    guard.check()


def test_release_asset_names_that_are_not_plain_file_names_are_dropped(releases, monkeypatch):
    releases.add("org/tinyengine", "v2.0", "tool\n--index-url x", TOOL)
    releases.add("org/tinyengine", "v2.0", "../tool", TOOL)
    releases.add("org/tinyengine", "v2.0", "tool", TOOL)
    monkeypatch.setenv("LLMGW_STORE_GITHUB_API", releases.base)
    listed = fetch.release("org/tinyengine", "v2.0")
    assert [a["name"] for a in listed] == ["tool"] and listed[0]["problem"] is None
    assert fetch.pick(listed, "org/tinyengine", "v2.0", name="tool")["sha256"] == hashlib.sha256(TOOL).hexdigest()


def test_paths_are_checked_again_with_the_real_version_before_anything_is_built(tmp_path, index, releases, uv_bin,
                                                                                base_python):
    # `{version}` is `0` when the recipe is read; `--version 1!0` (an epoch) makes `src-1!0`.
    recipe = _recipe(tmp_path, releases, base_python, GOOD_SOURCE, ('dir = "src"', 'dir = "src-{version}"'))
    proc = run_cli(tmp_path / "root", "build", str(recipe), "--version", "1!0", "--as-of", "2024-03-01",
                   "--index-url", index.url, "--uv", str(uv_bin), env={"LLMGW_STORE_GITHUB_API": releases.base})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (f"llmgw-store: error: {recipe}: build[0].source.dir: 'src-1!0': 'src-1!0' "
                                            f"is not a plain name ({recipes.PLAIN})")
    assert "creating the environment" not in proc.stderr and _store_is_empty(tmp_path)
