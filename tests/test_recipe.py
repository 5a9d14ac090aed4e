"""Recipe validation: every error names the file and the field; the CLI exits 2 and writes nothing."""

from __future__ import annotations

import sqlite3

import pytest

from llmgw_store.build import recipe as recipes
from llmgw_store.core.errors import RecipeError, UsageError
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
        (('variant = "cu128"', 'variant = "CU 128"'), "build[0].variant", "not a valid name"),
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
