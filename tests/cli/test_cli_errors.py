"""Every error case of issue 16 is one line `llmgw-store: error: ...` on stderr, nothing on stdout,
and the exit code it promises: 2 for bad input (nothing was changed), 1 for a failed operation.
Beside each refusal, the case that must keep working."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC
from pathlib import Path

import pytest

from llmgw_store.app.units import human_size, parse_duration, parse_size
from llmgw_store.base.errors import UsageError
from tests.conftest import PYTHON, build_store, real_uv, run_cli, write_recipe


def quiet(root, *args, **kw):
    """A run with no progress lines: stderr holds the error line alone."""
    return run_cli(root, "--progress=none", *args, **kw)


def one_error(proc, code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("errors"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


# -- --root --------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["list"], ["gc"], ["build", "RECIPE"], ["stats"], ["doctor"]])
def test_a_root_that_is_a_file_is_one_line_exit_2(tmp_path, recipe, args):
    f = tmp_path / "a-file"
    f.write_text("not a store\n")
    one_error(quiet(f, *[str(recipe) if a == "RECIPE" else a for a in args]), 2, str(f))
    assert f.read_text() == "not a store\n"


READ_ONLY_AND_OTHERS = [
    ["info", "x"], ["generations", "p"], ["list-profiles"], ["verify", "x"], ["diff", "a", "b"],
    ["env", "p"], ["run", "p", "--", "true"], ["doctor"],
    ["optimise", "--dry-run"], ["optimise"], ["rollback", "p"], ["unpin", "x"], ["pin", "x", "y"],
    ["activate", "p", "y"], ["generations", "p", "--delete", "1"],
]
# What a timer runs before the first build has nothing to do: exit 0, one line, nothing created.
NOTHING_TO_DO = [["list"], ["verify"], ["stats"], ["gc"], ["gc", "--dry-run"], ["gc", "--print-roots"],
                 ["gc", "--delete-older-than", "30d", "--min-free", "1G", "--max-cache", "1G", "--keep-dead-for", "1h"]]


@pytest.mark.parametrize("args", READ_ONLY_AND_OTHERS, ids=" ".join)
def test_a_root_with_no_store_is_said_and_nothing_is_created(tmp_path, args):
    root = tmp_path / "typo"
    one_error(quiet(root, *args), 2, f"no store at {root}", "--root")
    assert not os.path.lexists(root)


@pytest.mark.parametrize("args", NOTHING_TO_DO, ids=" ".join)
def test_a_root_with_no_store_yet_is_nothing_to_do(tmp_path, args):
    root = tmp_path / "not-yet"
    proc = run_cli(root, "--progress=plain", *args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no store at {root} yet: nothing to" in lines[0], proc.stderr
    assert not os.path.lexists(root)


def test_an_empty_directory_is_no_store_either_and_stays_empty(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    proc = run_cli(root, "--progress=plain", "gc")
    assert proc.returncode == 0 and f"no store at {root} yet: nothing to collect" in proc.stderr, proc.stderr
    assert list(root.iterdir()) == []


# -- interpreters --------------------------------------------------------------------------------


def recipe_for(tmp_path: Path, python: str) -> Path:
    p = write_recipe(tmp_path, 'version = "1.0"', name=f"py{python}.toml")
    p.write_text(p.read_text().replace(f'python = "{PYTHON}"', f'python = "{python}"'))
    return p


@pytest.mark.parametrize("preference", ["only-system", "managed"])
def test_a_missing_interpreter_says_how_to_install_it(tmp_path, index, uv_bin, preference):
    # `managed` would download one: the probe finds the download host unreachable (offline) and
    # gives up within its 2 s.
    proc = quiet(tmp_path / "root", "build", str(recipe_for(tmp_path, "3.99")), "--index-url", index.url,
                   "--uv", str(uv_bin), env={"LLMGW_STORE_PYTHON_PREFERENCE": preference})
    one_error(proc, 2, "no Python 3.99 found", "uv python install 3.99", "build.python")


def fake_shims(tmp_path: Path, version: str) -> Path:
    """A pyenv-style shim directory whose python<version> says what pyenv says and exits 127."""
    shims = tmp_path / "pyenv" / "shims"
    shims.mkdir(parents=True)
    shim = shims / f"python{version}"
    shim.write_text(f"""#!/bin/sh
echo "pyenv: python{version}: command not found" >&2
echo >&2
echo "The \\`python{version}' command exists in these Python versions:" >&2
echo "  {version}.1" >&2
exit 127
""")
    shim.chmod(0o755)
    return shims


def test_a_failing_pyenv_shim_is_no_interpreter_and_the_error_says_so(tmp_path, index, uv_bin):
    shims = fake_shims(tmp_path, "3.98")
    proc = quiet(tmp_path / "root", "build", str(recipe_for(tmp_path, "3.98")), "--index-url", index.url,
                   "--uv", str(uv_bin), env={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
    line = one_error(proc, 2, "no Python 3.98 found", f"{shims}/python3.98 is a pyenv shim for 3.98.1",
                     "pyenv global")
    assert "127" not in line


def test_a_failing_shim_before_a_working_interpreter_does_not_stop_a_build(tmp_path, index, uv_bin):
    shims = fake_shims(tmp_path, PYTHON)
    proc = run_cli(tmp_path / "root", "--json", "build", str(recipe_for(tmp_path, PYTHON)), "--index-url", index.url,
                   "--uv", str(uv_bin), env={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["python"].startswith(PYTHON)


# -- names and numbers ---------------------------------------------------------------------------

LONG = "a" * 300


@pytest.mark.parametrize("args, fragment", [
    (["activate", LONG, "x"], "is not a profile name: at most 100 characters"),
    (["pin", LONG, "x"], "is not a pin name: at most 100 characters"),
    (["unpin", LONG], "is not a pin name: at most 100 characters"),
    (["rollback", LONG], "is not a profile name: at most 100 characters"),
    (["generations", LONG], "is not a profile name: at most 100 characters"),
    (["info", LONG + "@1"], "is not a profile name: at most 100 characters"),
    (["info", "a" * 5000], "is not a store path, its name or key, PROFILE or PROFILE@N"),
    (["rollback", "p", "--to", "99999999999999999999"], "is not a generation number"),
    (["generations", "p", "--delete", "0"], "is not a generation number"),
])
def test_names_and_numbers_out_of_bounds(built, args, fragment):
    line = one_error(quiet(built["root"], *args), 2, fragment)
    assert len(line) < 400


def test_long_names_in_keygen_and_build(tmp_path, index, uv_bin, recipe):
    one_error(quiet(tmp_path / "r", "keygen", LONG, "--out", str(tmp_path / "k")), 2,
              "is not a signing key name: at most 100 characters")
    assert not (tmp_path / "k").exists()
    for opt in (["--variant", LONG], ["--version", LONG]):
        line = one_error(quiet(tmp_path / "r", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                                 *opt), 2)
        assert len(line) < 400
    long_engine = write_recipe(tmp_path, 'version = "1.0"', name="long.toml")
    long_engine.write_text(long_engine.read_text().replace('name = "tinyengine"', f'name = "{LONG}"'))
    one_error(quiet(tmp_path / "r", "build", str(long_engine), "--index-url", index.url, "--uv", str(uv_bin)), 2,
              "engine.name")
    assert not (tmp_path / "r").exists()  # refused before the store was touched


# -- dates, durations, sizes ---------------------------------------------------------------------


@pytest.mark.parametrize("as_of, fragment", [
    ("99999-01-01T00:00:00Z", "is not an ISO 8601 time"),
    ("9999-12-31T23:59:59Z", "is out of range"),
    ("2999-01-01", "is in the future"),
    ("0001-01-01T00:00:00+05:00", "is out of range: a time from 1970 to 9000"),
    ("1969-12-31", "is out of range"),
    ("2024-13-01", "is not an ISO 8601 time"),
    ("x" * 5000, "is not an ISO 8601 time"),
])
def test_resolution_dates_out_of_range_or_in_the_future(tmp_path, recipe, index, uv_bin, as_of, fragment):
    line = one_error(quiet(tmp_path / "root", "build", str(recipe), "--as-of", as_of, "--index-url", index.url,
                             "--uv", str(uv_bin)), 2, fragment)
    assert len(line) < 400
    assert not (tmp_path / "root").exists()


def test_a_resolution_date_in_the_past_is_fine(tmp_path, recipe, index, uv_bin):
    proc = run_cli(tmp_path / "root", "--json", "build", str(recipe), "--as-of", "2024-03-01", "--index-url",
                   index.url, "--uv", str(uv_bin), check=True)
    assert json.loads(proc.stdout)["as_of"] == "2024-03-01T00:00:00Z"


@pytest.mark.parametrize("args, fragment", [
    (["generations", "p", "--older-than", "99999999999d"], "is too long a duration: at most 100 years"),
    (["generations", "p", "--older-than", "1e400d"], "is not a duration"),
    (["gc", "--delete-older-than", "99999999999d"], "is too long a duration"),
    (["gc", "--max-freed", "99999999999999999999T"], "is too large a size: at most 8 EiB"),
    (["gc", "--min-free", "1e999G"], "is not a size"),
    (["gc", "--max-cache", "-5G"], "is not a size"),
])
def test_durations_and_sizes_out_of_range(built, args, fragment):
    one_error(quiet(built["root"], *args), 2, fragment)


def test_units_parse_and_print_one_style():
    assert parse_size("50G") == parse_size("50GiB") == parse_size("50gib") == parse_size("50 g") == 50 << 30
    assert parse_size("50GB") == parse_size("50gb") == 50 * 10**9
    assert parse_size("1.5T") == int(1.5 * (1 << 40)) and parse_size("4096") == parse_size("4096B") == 4096
    assert parse_size("500M") == 500 << 20 and parse_size("2KB") == 2000
    for bad in ("", "G", "5X", "5 GiBs", "1e3G", "-1G", "5.G", "9" * 30):
        with pytest.raises(UsageError):
            parse_size(bad)
    assert parse_duration("30d") == 30 * 86400 and parse_duration("36500d") == 36500 * 86400
    with pytest.raises(UsageError, match="at most 100 years"):
        parse_duration("40000d")
    assert [human_size(n) for n in (0, 512, 1536, 12 << 20, 3 << 29, -(1 << 30))] == [
        "0 B", "512 B", "1.5 KiB", "12.0 MiB", "1.5 GiB", "-1.0 GiB"]


# -- list and info say the same ------------------------------------------------------------------


def test_list_and_info_say_entries_and_iec_sizes(built):
    root, name = built["root"], built["names"][0]
    listed = run_cli(root, "list", check=True).stdout
    assert re.search(rf"{re.escape(name)}\s+\d+\.\d KiB\s+\d+ entries\s+last used ", listed), listed
    assert " MB" not in listed and " files" not in listed
    info = run_cli(root, "info", name, check=True).stdout
    m = re.search(r"size:\s+(\d+\.\d KiB) in (\d+) entries", info)
    assert m, info
    n = re.search(r"(\d+\.\d KiB)\s+(\d+) entries", listed)
    assert (m.group(1), m.group(2)) == (n.group(1), n.group(2))


def test_an_index_publishing_an_absurd_upload_time_is_a_failed_operation(tmp_path, wheels):
    from datetime import datetime

    from tests.support.index_server import PackageIndex

    idx = PackageIndex()
    idx.add("tinydep", wheels["tinydep-1.0"], "2024-01-01T00:00:00Z")
    rel = idx.add("tinyengine", wheels["tinyengine-1.0"], "2024-02-01T00:00:00Z")
    rel.uploaded = datetime(1900, 1, 1, tzinfo=UTC)  # a hostile or broken mirror
    idx.start()
    try:
        recipe = write_recipe(tmp_path)  # no as_of: the upload time decides it
        proc = quiet(tmp_path / "root", "build", str(recipe), "--version", "1.0", "--index-url", idx.url,
                     "--uv", str(real_uv()))
    finally:
        idx.stop()
    one_error(proc, 1, "malformed PEP 691 answer", "upload-time", "out of range")
