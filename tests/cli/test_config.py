"""The config file (cli/config.py): a node configured by its file alone, the same precedence in
the full command and the fast path, every mistake one line and exit 2 naming the file and the key,
and a file (or a file it names) that another user could write refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_cmd, run_cli, write_recipe


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    return path


def with_config(path: Path | str, *args: str, root: Path | None = None, env: dict | None = None):
    """The installed command with `path` as its config file (and no --root unless given)."""
    argv = cli_cmd(root, *args) if root is not None else [cli_cmd(Path("/"))[0], *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "LLMGW_STORE_CONFIG": str(path), **(env or {})})


def traced(path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, bool]:
    argv = [sys.executable, "-X", "importtime", cli_cmd(Path("/"))[0], *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "LLMGW_STORE_CONFIG": str(path), **(env or {})})
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    proc.stderr = "".join(ln + "\n" for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    return proc, "click" not in loaded


def one_line(proc, code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_a_node_configured_by_its_file_alone(tmp_path, index, uv_bin):
    """root, index_url, uv and python_preference from the file: build, the hit (answered by the fast
    path from the cached values), activate and rollback, then a flag over the file."""
    root = tmp_path / "node"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    conf = write_config(tmp_path / "node.toml", f'root = "{root}"\nindex_url = "{index.url}"\nuv = "{uv_bin}"\n'
                                                 'python_preference = "only-system"\nlock_timeout = 30\n')
    env = {"LLMGW_STORE_PYTHON_PREFERENCE": ""}
    first = with_config(conf, "--json", "build", str(recipe), env=env)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["how"] == "built" and doc["path"].startswith(str(root / "store") + "/")
    proc, fast = traced(conf, "build", str(recipe), env=env)
    assert proc.returncode == 0 and fast and proc.stdout == doc["path"] + "\n"
    b = json.loads(with_config(conf, "--json", "build", str(recipe), "--as-of", "2024-06-02", env=env).stdout)["path"]
    proc, fast = traced(conf, "activate", "p", doc["path"], env=env)
    assert proc.returncode == 0 and fast and proc.stdout == f"p: generation 1 -> {doc['path']}\n"
    proc, fast = traced(conf, "activate", "p", b, env=env)
    assert proc.returncode == 0 and fast and os.path.realpath(root / "profiles" / "p") == b
    proc, fast = traced(conf, "rollback", "p", env=env)
    assert proc.returncode == 0 and fast and os.path.realpath(root / "profiles" / "p") == doc["path"]
    # A flag wins over the file: another root (nothing there yet).
    other = tmp_path / "other"
    proc, fast = traced(conf, "--root", str(other), "rollback", "p", env=env)
    assert proc.returncode == 2 and f"no store at {other}" in proc.stderr
    # The file changes: the fast path does not use values it has not seen parsed.
    write_config(conf, conf.read_text().replace("lock_timeout = 30", "lock_timeout = 31"))
    proc, fast = traced(conf, "build", str(recipe), env=env)
    assert proc.returncode == 0 and not fast and proc.stdout == doc["path"] + "\n"
    proc, fast = traced(conf, "build", str(recipe), env=env)
    assert fast and proc.stdout == doc["path"] + "\n"


@pytest.mark.parametrize("text, fragments", [
    ('substituter = ["file:///x"]\n', ["unknown key 'substituter'", "substituters"]),
    ('[gc]\nmin_fre = "1G"\n', ["unknown key gc.min_fre", "min_free"]),
    ('lock_timeout = "5"\n', ["lock_timeout: must be a number of seconds"]),
    ('substituters = "file:///x"\n', ["substituters: must be a list"]),
    ('uv = "bin/uv"\n', ["uv: must be an absolute path"]),
    ('python_preference = "sometimes"\n', ["python_preference: must be one of"]),
    ('[gc]\nmin_free = "lots"\n', ["gc.min_free:", "is not a size"]),
    ('gc = 1\n', ["gc: must be a table"]),
    ('root = \n', ["not a valid TOML file"]),
    ('root = "/x"\nroot = "/y"\n', ["not a valid TOML file"]),
], ids=["typo", "gc-typo", "type", "list", "relative", "choice", "size", "table", "toml", "twice"])
def test_every_mistake_is_one_line_exit_2_naming_the_file_and_the_key(tmp_path, text, fragments):
    conf = write_config(tmp_path / "config.toml", text)
    for args in (["list"], ["activate", "p", "/x"], ["build", "r.toml"], ["config"]):
        one_line(with_config(conf, *args), 2, str(conf), *fragments)
    # --help is still there to say what the keys are.
    assert with_config(conf, "build", "--help").returncode == 0


def test_a_config_file_others_could_write_is_refused(tmp_path, uv_bin):
    conf = write_config(tmp_path / "config.toml", 'lock_timeout = 5\n')
    conf.chmod(0o666)
    one_line(with_config(conf, "list"), 2, str(conf), "writable by other users")
    conf.chmod(0o644)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone may replace what is in it
    planted = write_config(shared / "config.toml", 'lock_timeout = 5\n')
    one_line(with_config(planted, "list"), 2, "writable by other users", str(shared))
    # Through a link, the file it leads to is what is checked.
    link = tmp_path / "link.toml"
    link.symlink_to(planted)
    one_line(with_config(link, "list"), 2, "writable by other users")
    # A uv (or a key file) the file names is held to the same rule: root runs it.
    loose_uv = tmp_path / "uv"
    loose_uv.write_bytes(uv_bin.read_bytes())
    loose_uv.chmod(0o777)
    conf.write_text(f'uv = "{loose_uv}"\n')
    one_line(with_config(conf, "list"), 2, str(conf), "uv", "writable by other users")
    key = shared / "builder.public"
    key.write_text("builder:AAAA\n")
    conf.write_text(f'trusted_keys = ["{key}", "literal:AAAA"]\n')
    one_line(with_config(conf, "list"), 2, "trusted_keys", "writable by other users")
    # A root-owned sticky directory (/tmp) is fine: no one else can replace a file in it.
    assert (Path("/tmp").stat().st_mode & 0o1000) and str(tmp_path).startswith("/tmp/")
    conf.write_text("lock_timeout = 5\n")
    assert with_config(conf, "config").returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_config_file_of_another_user_is_refused(tmp_path):
    conf = write_config(tmp_path / "config.toml", 'lock_timeout = 5\n')
    os.chown(conf, 65534, 65534)
    one_line(with_config(conf, "list"), 2, "owned by uid 65534")


def test_which_file_is_read(tmp_path, monkeypatch):
    good = write_config(tmp_path / "good.toml", 'progress = "none"\n')
    bad = write_config(tmp_path / "bad.toml", 'nonsense = 1\n')
    # --config wins over the variable, and may come after the command.
    proc = with_config(bad, "--json", "config", "--config", str(good))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config_file"] == str(good)
    # A file named explicitly must exist; an empty variable means no file at all.
    one_line(with_config(tmp_path / "missing.toml", "list"), 2, "missing.toml", "cannot read the config file")
    proc = with_config("", "--json", "config")
    assert proc.returncode == 0 and json.loads(proc.stdout)["config_file"] is None
    # The default place: /etc/llmgw-store/config.toml as root, else under XDG_CONFIG_HOME.
    from llmgw_store.cli import config

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config.default_path() == ("/etc/llmgw-store/config.toml" if os.geteuid() == 0
                                     else str(tmp_path / "xdg" / "llmgw-store" / "config.toml"))


def test_config_says_each_setting_and_where_it_came_from(tmp_path):
    conf = write_config(tmp_path / "config.toml", f'root = "{tmp_path / "r"}"\nsubstituters = ["file:///a", "file:///b"]\n'
                                                   '[gc]\nmin_free = "100G"\nkeep = 5\n')
    proc = with_config(conf, "--progress", "plain", "--json", "config",
                       env={"LLMGW_STORE_INDEX_URL": "http://mirror.internal/simple"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    s = doc["settings"]
    assert doc["schema_version"] == 1 and doc["config_file"] == str(conf)
    assert (s["root"]["value"], s["root"]["source"]) == (str(tmp_path / "r"), "file")
    assert (s["substituters"]["value"], s["substituters"]["source"]) == (["file:///a", "file:///b"], "file")
    assert (s["gc.min_free"]["value"], s["gc.keep"]["value"]) == ("100G", 5)
    assert (s["index_url"]["value"], s["index_url"]["source"]) == ("http://mirror.internal/simple", "env")
    assert (s["progress"]["value"], s["progress"]["source"]) == ("plain", "flag")
    assert (s["python_preference"]["source"], s["lock_timeout"]["source"]) == ("env", "default")  # conftest's
    assert s["gc.min_free"]["env"] == "LLMGW_STORE_GC_MIN_FREE" and s["gc.min_free"]["flag"] == "--min-free"
    text = with_config(conf, "config", env={"LLMGW_STORE_INDEX_URL": "http://mirror.internal/simple"}).stdout
    assert text.splitlines()[0] == f"config file: {conf}"
    assert any(line.split()[:2] == ["index_url", "http://mirror.internal/simple"] and "LLMGW_STORE_INDEX_URL" in line
               for line in text.splitlines())


def test_help_names_the_config_file_and_each_settings_key():
    proc = run_cli(Path("/nonexistent"), "--help")
    assert "LLMGW_STORE_CONFIG" in proc.stdout and "config.toml" in proc.stdout
    gc_help = run_cli(Path("/nonexistent"), "gc", "--help").stdout
    assert "LLMGW_STORE_GC_MIN_FREE" in " ".join(gc_help.split()) and "min_free in [gc]" in " ".join(gc_help.split())


def test_gc_takes_its_policy_from_the_gc_table(tmp_path, index, uv_bin):
    root = tmp_path / "root"
    recipe = write_recipe(tmp_path, 'version = "1.0"')
    path = json.loads(run_cli(root, "--json", "build", str(recipe), "--index-url", index.url, "--uv", str(uv_bin),
                              check=True).stdout)["path"]
    conf = write_config(tmp_path / "config.toml", '[gc]\nkeep_dead_for = "1h"\n')
    proc = with_config(conf, "--json", "gc", root=root)
    assert proc.returncode == 0, proc.stderr
    assert Path(path).name in json.loads(proc.stdout)["kept_by_grace"] and Path(path).is_dir()
    proc = with_config(conf, "--json", "gc", "--keep-dead-for", "0s", root=root)  # the flag wins
    assert proc.returncode == 0 and not Path(path).exists()


def test_a_uv_that_does_not_exist_yet_is_left_to_the_command_that_runs_it(tmp_path):
    conf = write_config(tmp_path / "config.toml", f'uv = "{tmp_path / "not-yet"}"\n')
    proc = with_config(conf, "--json", "config")
    assert proc.returncode == 0 and json.loads(proc.stdout)["settings"]["uv"]["value"] == str(tmp_path / "not-yet")


def test_the_docs_list_every_setting_and_their_example_configs_are_valid(tmp_path):
    """docs/operations.md's table names each setting's key, flag and variable; its node's and
    builder's configs pass the file's checks."""
    import re

    from llmgw_store.cli import config
    from tests.conftest import REPO

    page = (REPO / "docs" / "operations.md").read_text()
    start = page.index("## The config file")
    end = page.find("\n## ", start + 1)
    section = page[start:end if end > 0 else None]
    for s in config.SETTINGS:
        key = f"`[{s.name.split('.')[0]}] {s.name.split('.')[1]}`" if "." in s.name else f"`{s.name}`"
        row = next((line for line in section.splitlines() if line.startswith(f"| {key}")), None)
        assert row is not None and f"`{s.flag}`" in row and f"`{s.env}`" in row, s.name
    examples = re.findall(r"^```toml\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert len(examples) == 2
    for text in examples:
        values = config.parse(str(tmp_path / "example.toml"), text.encode())
        assert values["root"] == "/var/lib/llmgw-store"


@pytest.mark.parametrize("text", ['index_url = "https://__token__:s3cret@mirror.internal/simple"\n',
                                  'substituters = ["http://u:s3cret@cache.internal/llmgw"]\n'])
def test_a_token_in_the_config_is_not_copied_into_the_fast_paths_cache(tmp_path, text):
    """An index token or a cache password: the fast path finds no entry and defers to the full CLI."""
    conf = write_config(tmp_path / "config.toml", text)
    conf.chmod(0o600)
    assert with_config(conf, "config").returncode == 0
    cache = tmp_path / "cache"
    assert not any(b"s3cret" in f.read_bytes() for f in cache.rglob("*") if f.is_file())
    plain = write_config(tmp_path / "plain.toml", 'index_url = "https://mirror.internal/simple"\n')
    assert with_config(plain, "config").returncode == 0
    assert any(f.name.startswith("config-") for f in (cache / "llmgw-store").iterdir())


def test_containment_and_the_units_gc_policy_come_from_the_file(tmp_path):
    from llmgw_store.core.local_store import Store

    root = tmp_path / "root"
    Store.open(root, create=True).close()
    conf = write_config(tmp_path / "config.toml", 'containment = "subreaper"\n[gc]\nmin_free = "500G"\n')
    proc = with_config(conf, "--json", "doctor", root=root)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["containment"]["kind"] == "subreaper"
    proc = with_config(conf, "--json", "config", root=root)
    shown = json.loads(proc.stdout)["settings"]
    assert shown["containment"]["value"] == "subreaper" and shown["containment"]["source"] == "file"
    # The units hand gc the file (its [gc] table is read when gc runs), not a copy of its values.
    proc = with_config(conf, "--json", "systemd-units", "--out", str(tmp_path / "units"), root=root)
    assert proc.returncode == 0, proc.stderr
    service = (tmp_path / "units" / "llmgw-store-gc.service").read_text()
    assert f'"--config" "{conf}" "gc"\n' in service and "500G" not in service
    proc = with_config(conf, "--json", "systemd-units", "--out", str(tmp_path / "units"), "--min-free", "none",
                       root=root)  # the flag wins over the file: gc's "none" sets the file's value aside
    assert proc.returncode == 0, proc.stderr
    assert f'"--config" "{conf}" "gc" "--min-free" "none"\n' in (tmp_path / "units" / "llmgw-store-gc.service").read_text()
    dry = with_config(conf, "--json", "gc", "--dry-run", "--min-free", "none", root=root)
    assert dry.returncode == 0, dry.stderr


def test_config_shows_no_credentials(tmp_path):
    """An index token and a cache password never reach `config`'s output (eyes, logs, tickets)."""
    conf = write_config(tmp_path / "config.toml", 'index_url = "http://__token__:IDXTOKEN@mirror.internal/simple"\n'
                        'substituters = ["http://nodeuser:CACHEPASS@cache.internal/llmgw"]\n')
    for args in (("config",), ("--json", "config")):
        proc = with_config(conf, *args)
        assert proc.returncode == 0, proc.stderr
        assert "IDXTOKEN" not in proc.stdout + proc.stderr and "CACHEPASS" not in proc.stdout + proc.stderr
        # positive: the URLs themselves are shown, and where they come from
        assert "http://mirror.internal/simple" in proc.stdout and "http://cache.internal/llmgw" in proc.stdout

