"""Recipe validation: every error names the file and the field; the CLI exits 2 and writes nothing."""

from __future__ import annotations

import sqlite3

import pytest

from llmgw_store.base.errors import RecipeError, UsageError
from llmgw_store.build import recipe as recipes
from tests.conftest import PYTHON, run_cli

GOOD = """
[engine]
name = "vllm"
binary = "vllm"

[[build]]
variant = "cu128"
python = "3.12"
requirements = ["vllm=={version}"]
verify = ["vllm", "--version"]
"""


def test_good_recipe_parses_with_defaults(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(GOOD)
    r = recipes.load(f)
    assert (r.name, r.pypi, r.binary) == ("vllm", "vllm", "vllm")
    assert r.build_for(None).variant == "cu128"
    assert r.build_for("cu128").resolved("0.6.3")["requirements"] == ["vllm==0.6.3"]


@pytest.mark.parametrize(
    "change, field, words",
    [
        (('name = "vllm"', 'name = "vLLM/x"'), "engine.name", "not a store name"),
        (('name = "vllm"', 'name = ".hidden"'), "engine.name", "not a store name"),
        (('binary = "vllm"', 'binary = 3'), "engine.binary", "must be str, not int"),
        (('binary = "vllm"\n', ""), "engine.binary", "required field is missing"),
        (('python = "3.12"', 'python = "3.12"\npyhton = "3.11"'), "build[0].pyhton", "unknown field"),
        (('requirements = ["vllm=={version}"]', 'requirements = "vllm"'), "build[0].requirements", "must be list"),
        (('requirements = ["vllm=={version}"]', "requirements = [1]"), "build[0].requirements", "list of non-empty strings"),
        (('python = "3.12"', 'python = "3.12"\nfree_gb = true'), "build[0].free_gb", "must be int or float, not bool"),
        (('python = "3.12"', 'python = "3.12"\nas_of = "yesterday"'), "build[0].as_of", "not an ISO 8601 time"),
        (('variant = "cu128"', 'variant = "CU 128"'), "build[0].variant", "not a variant name"),
    ],
)
def test_bad_recipes_name_file_and_field(tmp_path, change, field, words):
    f = tmp_path / "bad.toml"
    f.write_text(GOOD.replace(*change))
    with pytest.raises(RecipeError) as err:
        recipes.load(f)
    assert err.value.field == field
    assert str(err.value).startswith(f"{f}: {field}: ") and words in str(err.value)


def test_duplicate_variant_and_missing_build(tmp_path):
    f = tmp_path / "dup.toml"
    f.write_text(GOOD + GOOD[GOOD.index("[[build]]"):])
    with pytest.raises(RecipeError, match=r"build\[1\].variant: variant 'cu128' appears twice"):
        recipes.load(f)
    f.write_text(GOOD[: GOOD.index("[[build]]")])
    with pytest.raises(RecipeError, match="at least one"):
        recipes.load(f)


def test_unknown_variant_lists_the_known_ones(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(GOOD)
    with pytest.raises(UsageError, match=r"no build with variant 'cpu' \(the recipe has: cu128\)"):
        recipes.load(f).build_for("cpu")


def test_as_of_is_normalised_to_utc(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text(GOOD.replace('python = "3.12"', 'python = "3.12"\nas_of = "2024-03-01T02:00:00+02:00"'))
    assert recipes.load(f).builds[0].fields["as_of"] == "2024-03-01T00:00:00Z"
    f.write_text(GOOD.replace('python = "3.12"', "python = \"3.12\"\nas_of = 2024-03-01T00:00:00Z"))
    assert recipes.load(f).builds[0].fields["as_of"] == "2024-03-01T00:00:00Z"


def test_cli_exit_2_and_nothing_written_for_a_bad_recipe(tmp_path):
    root = tmp_path / "root"
    f = tmp_path / "bad.toml"
    f.write_text(GOOD.replace('python = "3.12"', 'python = "3.12"\ncolour = "red"'))
    proc = run_cli(root, "build", str(f))
    assert proc.returncode == 2
    assert proc.stderr == f"llmgw-store: error: {f}: build[0].colour: unknown field (known: {', '.join(recipes.BUILD_FIELDS)})\n"
    assert proc.stdout == "" and not root.exists()


def test_cli_bad_input_exit_codes(tmp_path):
    root = tmp_path / "root"
    missing = run_cli(root, "build", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and missing.stderr == f"llmgw-store: error: {tmp_path / 'nope.toml'}: no such recipe file\n"
    f = tmp_path / "r.toml"
    f.write_text("[engine\n")
    assert run_cli(root, "build", str(f)).returncode == 2
    f.write_text(GOOD)
    bad_time = run_cli(root, "build", str(f), "--as-of", "soon")
    assert bad_time.returncode == 2 and "not an ISO 8601 time" in bad_time.stderr
    assert run_cli(root, "build").returncode == 2  # click: missing argument
    assert not root.exists()


def test_bad_requirement_is_refused_before_anything_is_built(tmp_path, index, uv_bin):
    root = tmp_path / "root"
    f = tmp_path / "r.toml"
    f.write_text(GOOD.replace("vllm", "tinyengine").replace('python = "3.12"', f'python = "{PYTHON}"\nversion = "1.0"')
                 .replace('requirements = ["tinyengine=={version}"]', 'requirements = ["tinyengine @ https://example.org/x.whl"]'))
    proc = run_cli(root, "build", str(f), "--index-url", index.url, "--uv", str(uv_bin))
    assert proc.returncode == 2 and "build[0].requirements" in proc.stderr and "direct reference" in proc.stderr
    assert list((root / "store").iterdir()) == []
    assert list((root / "store").iterdir()) == []
    assert sqlite3.connect(root / "var" / "db.sqlite").execute("SELECT count(*) FROM builds").fetchone()[0] == 0


# --- every path a build names stays inside its tree (see also tests/build/test_recipe_attacks.py) --------

SOURCE = '\n[build.source]\nurl = "https://example.org/s.tar.gz"\nsha256 = "' + "0" * 64 + '"\n'


def _paths_recipe(tmp_path, build_lines: str, source_lines: str = "") -> str:
    f = tmp_path / "paths.toml"
    f.write_text(GOOD.replace('[engine]\nname = "vllm"', '[engine]\nname = "vllm"\nrepo = "org/vllm"')
                 + build_lines + (SOURCE + source_lines if source_lines else ""))
    return f


@pytest.mark.parametrize("build_lines, source_lines, field, words", [
    ("", 'dir = ".llmgw"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = ".llmgw/x"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = "bin"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = "bin/python3.11"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = "pyvenv.cfg"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = "lib/python3.11/site-packages/evil"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = "lib64/x"', "build[0].source.dir", "what the store and uv venv own"),
    ("", 'dir = "../outside"', "build[0].source.dir", "climbs out of the environment"),
    ("", 'dir = "/tmp/x"', "build[0].source.dir", "is absolute"),
    ("", 'dir = "a//b"', "build[0].source.dir", "empty component"),
    ("", 'dir = "src\\n"', "build[0].source.dir", "is not a plain name"),
    ("", 'dir = "a\\u0000b"', "build[0].source.dir", "is not a plain name"),
    ("", f'dir = "{"a/" * 20}a"', "build[0].source.dir", "is longer than"),
    ("", 'top = "../x"', "build[0].source.top", "climbs out of the archive"),
    ("", 'requirements = "/etc/passwd"', "build[0].source.requirements", "is absolute"),
    ('assets = ["python3"]\nasset_tag = "v1"', "", "build[0].assets", "reserved"),
    ('assets = ["python3.11"]\nasset_tag = "v1"', "", "build[0].assets", "reserved"),
    ('assets = ["activate"]\nasset_tag = "v1"', "", "build[0].assets", "reserved"),
    ('assets = ["pip"]\nasset_tag = "v1"', "", "build[0].assets", "reserved"),
    ('assets = ["../x"]\nasset_tag = "v1"', "", "build[0].assets", "not a plain file name"),
    ('assets = ["/etc/x"]\nasset_tag = "v1"', "", "build[0].assets", "not a plain file name"),
    ('assets = ["a\\n"]\nasset_tag = "v1"', "", "build[0].assets", "not a plain file name"),
    ('assets = [".hidden"]\nasset_tag = "v1"', "", "build[0].assets", "not a plain file name"),
    ('assets = ["tool", "tool"]\nasset_tag = "v1"', "", "build[0].assets", "appears twice"),
    ('assets = ["tool"]\nasset_tag = "v1"\nasset_dir = "../x"', "", "build[0].asset_dir", "climbs out"),
    ('assets = ["tool"]\nasset_tag = "v1"\nasset_dir = ".llmgw"', "", "build[0].asset_dir", "what the store and uv venv own"),
    ('assets = ["tool"]\nasset_tag = "v1"\nasset_dir = "lib64"', "", "build[0].asset_dir", "what the store and uv venv own"),
])
def test_paths_outside_the_tree_or_on_the_stores_own_are_refused(tmp_path, build_lines, source_lines, field, words):
    f = _paths_recipe(tmp_path, build_lines, source_lines)
    with pytest.raises(RecipeError) as err:
        recipes.load(f)
    assert err.value.field == field and words in err.value.problem, str(err.value)
    assert "\n" not in str(err.value)  # one line, even when the value holds a newline


def test_plain_relative_paths_and_asset_names_are_accepted(tmp_path):
    f = _paths_recipe(tmp_path, 'assets = ["tinytool", "tool-{version}.bin", "uvicorn"]\nasset_tag = "v1"\n'
                      'asset_dir = "share/tools"', 'dir = "opt/src-{version}"\ntop = "vllm-{version}"\n'
                      'requirements = "requirements/cuda.txt"')
    fields = recipes.load(f).builds[0].resolved("0.6.3")
    assert fields["source"]["dir"] == "opt/src-0.6.3" and fields["assets"][1] == "tool-0.6.3.bin"
    recipes.check_paths(fields, f, "build[0]")  # what the builder runs again with the real version
    f = _paths_recipe(tmp_path, 'assets = ["tinytool"]\nasset_tag = "v1"\nasset_dir = "bin"', 'dir = "bin/vllm-src"')
    assert recipes.load(f).builds[0].fields["asset_dir"] == "bin"


@pytest.mark.parametrize("change, field", [
    (('name = "vllm"', 'name = "vllm\\n"'), "engine.name"),
    (('variant = "cu128"', 'variant = "cu128\\n"'), "build[0].variant"),
    (('python = "3.12"', 'python = "3.12"\nversion = "1.0\\n"'), "build[0].version"),
])
def test_a_trailing_newline_is_not_a_name(tmp_path, change, field):
    f = tmp_path / "nl.toml"
    f.write_text(GOOD.replace(*change))
    with pytest.raises(RecipeError) as err:
        recipes.load(f)
    assert err.value.field == field


# --- issue 11: values handed to uv, a requirement or a release lookup --------------------------

WHEEL = '\n[build.wheel]\ntag = "v{version}"\nprefix = "vllm-"\nproject = "vllm"\n'  # appended; needs engine.repo
REPO = ('binary = "vllm"', 'binary = "vllm"\nrepo = "org/vllm"')
ASSET = ('python = "3.12"', 'python = "3.12"\nassets = ["tool"]\nasset_tag = "v{version}"')
EXTRA = 'python = "3.12"\nextra_index = "https://download.pytorch.org/whl/cu128"\nindex_packages = ["torch"]'


def _wheel(old: str, new: str) -> tuple:
    return REPO, WHEEL.replace(old, new)


@pytest.mark.parametrize("change, tail, field", [
    (('python = "3.12"', 'python = "--install-dir=/x"'), "", "build[0].python"),
    (('python = "3.12"', 'python = "3.12 --install-dir=/x"'), "", "build[0].python"),
    (('python = "3.12"', 'python = "../bin/python"'), "", "build[0].python"),
    (('python = "3.12"', 'python = "/usr/../tmp/python"'), "", "build[0].python"),
    (('python = "3.12"', 'python = "3.12\\n"'), "", "build[0].python"),
    (('binary = "vllm"', 'binary = "../../usr/bin/env"'), "", "engine.binary"),
    (('binary = "vllm"', 'binary = "-rf"'), "", "engine.binary"),
    (('binary = "vllm"', 'binary = "vllm\\nx"'), "", "engine.binary"),
    (('binary = "vllm"', 'binary = "vllm"\npypi = "vllm\\n--index-url=http://evil"'), "", "engine.pypi"),
    (('binary = "vllm"', 'binary = "vllm"\npypi = "../x"'), "", "engine.pypi"),
    (('binary = "vllm"', 'binary = "vllm"\nrepo = "org/../x"'), "", "engine.repo"),
    (('binary = "vllm"', 'binary = "vllm"\nrepo = "org/vllm/releases"'), "", "engine.repo"),
    (('binary = "vllm"', 'binary = "vllm"\nrepo = "../vllm"'), "", "engine.repo"),
    (*_wheel('project = "vllm"', 'project = "tinydep @ file:///x\\nvllm"'), "build[0].wheel.project"),
    (*_wheel('project = "vllm"', 'project = "-r /etc/shadow"'), "build[0].wheel.project"),
    (*_wheel('tag = "v{version}"', 'tag = "v1/../../x"'), "build[0].wheel.tag"),
    (*_wheel('prefix = "vllm-"', 'prefix = "../vllm-"'), "build[0].wheel.prefix"),
    (*_wheel('prefix = "vllm-"', 'suffix = ".whl\\n"'), "build[0].wheel.suffix"),
    (*_wheel('prefix = "vllm-"', 'repo = "org/x y"'), "build[0].wheel.repo"),
    (('python = "3.12"', EXTRA.replace("https://download.pytorch.org/whl/cu128", "file:///etc")), "",
     "build[0].extra_index"),
    (('python = "3.12"', EXTRA.replace("cu128", 'cu128\\n--index-url=http://evil')), "", "build[0].extra_index"),
    (('python = "3.12"', EXTRA.replace("cu128", 'cu128\\"')), "", "build[0].extra_index"),
    (('python = "3.12"', EXTRA.replace('["torch"]', '["-r /etc/shadow"]')), "", "build[0].index_packages"),
    (('python = "3.12"', EXTRA.replace('["torch"]', '["torch\\ntriton"]')), "", "build[0].index_packages"),
    (('python = "3.12"', EXTRA.replace('["torch"]', '["tinydep @ file:///x/tinydep-6.6.whl"]')), "",
     "build[0].index_packages"),
    ((ASSET[0], ASSET[1].replace("v{version}", "../v{version}")), "", "build[0].asset_tag"),
])
def test_values_passed_to_uv_or_a_requirement_are_checked(tmp_path, change, tail, field):
    f = tmp_path / "v.toml"
    text = GOOD.replace(*change) + tail
    f.write_text(text.replace(*REPO) if "assets" in text else text)  # assets need engine.repo
    with pytest.raises(RecipeError) as err:
        recipes.load(f)
    assert err.value.field == field
    assert len(str(err.value)) < 400 and "\n" not in str(err.value)


@pytest.mark.parametrize("python", ["3", "3.11", "3.11.7", "cpython3.11", "cpython@3.12", "pypy3.10",
                                    "/usr/bin/python3.11"])
def test_genuine_python_requests_and_values_still_load(tmp_path, python):
    f = tmp_path / "v.toml"
    text = GOOD.replace(*ASSET).replace(*REPO).replace('binary = "vllm"', 'binary = "vllm-serve_2"\npypi = "vllm.x_y-z"')
    text = text.replace('python = "3.12"', EXTRA.replace("3.12", python).replace('["torch"]', '["torch", "triton"]'))
    f.write_text(text + WHEEL.replace('prefix = "vllm-"', 'prefix = "vllm-"\nsuffix = "+cu128.whl"'))
    r = recipes.load(f)
    assert r.builds[0].fields["python"] == python and r.binary == "vllm-serve_2" and r.pypi == "vllm.x_y-z"
    assert r.builds[0].fields["wheel"]["project"] == "vllm" and r.builds[0].fields["asset_tag"] == "v{version}"


def test_cli_refuses_a_python_that_is_an_option(tmp_path):
    """uv took `--install-dir=/x` as its option and wrote an interpreter at /x, as root."""
    f = tmp_path / "r.toml"
    f.write_text(GOOD.replace('python = "3.12"', f'python = "--install-dir={tmp_path}/x"'))
    proc = run_cli(tmp_path / "root", "build", str(f))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"llmgw-store: error: {f}: build[0].python: ")
    assert not (tmp_path / "x").exists() and not (tmp_path / "root").exists()


@pytest.mark.parametrize("variant", ["x" * 33, "cu128\n", "../x", ""])
def test_a_variant_is_a_short_name(tmp_path, variant):
    """The variant is part of every store path name: a name, at most 32 characters."""
    with pytest.raises(RecipeError, match=r"build\[0\]\.variant"):
        recipes.parse({"engine": {"name": "e", "binary": "e"},
                       "build": [{"variant": variant, "python": "3.11", "requirements": ["e"]}]}, tmp_path / "r.toml")
    recipes.parse({"engine": {"name": "e", "binary": "e"},
                   "build": [{"variant": "x" * 32, "python": "3.11", "requirements": ["e"]}]}, tmp_path / "r.toml")
