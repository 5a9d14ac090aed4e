"""The fast path and click read one declaration (cli/spec.py, cli/config.py) and parse alike.

- every click parameter and `envvar` of the group, `build`, `activate` and `rollback` is declared,
  with the same spellings, variable, kind and (for `build`) what it does to a memo answer: an option
  added to click alone fails here until the fast path handles it or says it cannot change a hit;
- the options that enter the memo key are exactly the build options the builder's memo key reads;
- both parsers, given the same argv, environment and config file (thousands of combinations), give
  the command the same values, or the fast one leaves the command to click.
No store, no index: these run in the quick loop.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import click
import pytest

from llmgw_store.build import memo as buildmemo
from llmgw_store.build.plan import BuildOptions
from llmgw_store.cli import config, spec
from llmgw_store.cli.main import cli

FAST = ("build", "activate", "rollback", "list", "info", "env", "generations", "config", "verify")


def _click_params(command: click.Command) -> dict[str, click.Parameter]:
    """Its parameters but click's own --help and the group's --version (eager: they print and exit)."""
    return {p.name: p for p in command.params if not (p.name in ("help", "version") and p.is_eager)}


@pytest.mark.parametrize("name", [config.GLOBAL, *FAST])
def test_every_click_parameter_and_variable_is_declared(name):
    command = cli if name == config.GLOBAL else cli.commands[name]
    declared = {p.name: p for p in (spec.GROUP if name == config.GLOBAL else spec.COMMANDS[name])}
    params = _click_params(command)
    assert set(params) == set(declared), "click and cli/spec.py declare different parameters"
    for pname, p in params.items():
        d = declared[pname]
        assert isinstance(p, click.Argument) == d.argument, pname
        if isinstance(p, click.Option):
            assert tuple(p.opts + p.secondary_opts) == d.flags, pname
            assert p.envvar == d.env, f"{pname}: click reads {p.envvar!r}, the fast path {d.env!r}"
            assert p.multiple == (d.kind in ("list", "ints")), pname
            assert p.count == (d.kind == "count"), pname
            assert p.is_flag == (d.kind in ("flag", "bool")), pname
            if d.setting is not None:
                assert d.env == d.setting.env and d.flags == (d.setting.flag,), pname
        roles = (*config.HIT_ROLES, spec.MISS)
        assert d.hit in roles, f"{name} {pname}: say what it does to a cache hit ({', '.join(roles)})"


def test_what_enters_the_memo_key_is_what_the_builder_puts_in_it():
    keyed = {p.name for p in spec.COMMANDS["build"] if p.hit == "key"}
    assert keyed == set(buildmemo.KEY_OPTIONS)
    fields = {f.name for f in dataclasses.fields(BuildOptions)}
    assert keyed <= fields, "the builder's memo key reads BuildOptions fields of these names"
    # The activate of a recipe builds with the same options.
    assert {p.name for p in spec.COMMANDS["build"] if not p.argument and p.name != "check"} <= \
           {p.name for p in spec.COMMANDS["activate"]}


def test_every_setting_is_an_option_of_each_command_it_names():
    for s in config.SETTINGS:
        if config.GLOBAL in s.commands:
            assert s.param in _click_params(cli)
            continue
        names = [c for c in s.commands if c != "*"] or [c for c, cmd in cli.commands.items()
                                                          if s.param in _click_params(cmd)]
        for c in names:
            if c == "systemd-units" and s.param not in _click_params(cli.commands[c]):
                continue  # its gc options come with the units that carry the policy
            command = cli
            for part in c.split():  # a subcommand ("cache gc") by its path
                command = command.commands[part]
            p = _click_params(command).get(s.param)
            assert isinstance(p, click.Option) and p.envvar == s.env and s.flag in p.opts, (s.name, c)


# -- both parsers on the same input ----------------------------------------------------------------------


def _click_values(argv: list[str]) -> dict | None:
    """What click gives the group and the command (their parameters merged), or None if it refuses."""
    try:
        group_ctx = cli.make_context("llmgw-store", list(argv), resilient_parsing=False)
        rest = [*group_ctx._protected_args, *group_ctx.args]
        if not rest or rest[0] not in FAST:
            return None
        command = cli.commands[rest[0]]
        sub = command.make_context(rest[0], rest[1:], parent=group_ctx)
    except (click.exceptions.ClickException, click.exceptions.Exit):
        return None
    if "llmgw_store.config_error" in group_ctx.meta:
        return None
    return {"command": rest[0], **group_ctx.params, **sub.params}


def _fast_values(argv: list[str], environ: dict) -> dict | None:
    """What the fast path gives the command (its config file from the cache the full command fills)."""
    from llmgw_store.cli.fast import parse

    parsed = parse(list(argv), environ)
    return None if parsed is None else {"command": parsed.command, **parsed.params}


def _same(fast: dict, slow: dict) -> None:
    for k, v in fast.items():
        w = slow[k]
        if isinstance(v, tuple) or isinstance(w, (list, tuple)):
            v, w = tuple(v), tuple(w)
        assert v == w and type(v) is type(w), (k, v, w)
    assert set(fast) == set(slow)


def _compare(argv: list[str], environ: dict, monkeypatch) -> tuple[bool, bool]:
    for s in config.SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    slow = _click_values(argv)
    import os

    fast = _fast_values(argv, dict(os.environ))
    if fast is not None:
        assert slow is not None, f"the fast path takes {argv} {environ}, click refuses it"
        _same(fast, slow)
    return fast is not None, slow is not None


ENV_VALUES = {
    "LLMGW_STORE_ROOT": ["/tmp/from-env", ""],
    "LLMGW_STORE_INDEX_URL": ["http://127.0.0.1:9/simple/", ""],
    "LLMGW_STORE_UV": ["/usr/bin/true", "/no/such/uv", "/tmp"],
    "LLMGW_STORE_PYTHON_PREFERENCE": ["system", "bogus", ""],
    "LLMGW_STORE_SUBSTITUTERS": ["file:///a file:///b", " "],
    "LLMGW_STORE_TRUSTED_KEYS": ["k:AAAA"],
    "LLMGW_STORE_LOCK_TIMEOUT": ["7", "-1", "x", "inf"],
    "LLMGW_STORE_PROGRESS": ["json", "none", "loud"],
}
TOKENS = ["build", "activate", "rollback", "r.toml", "p", "/x/y.toml", "--json", "-v", "-q", "-vq", "-vv", "--root",
          "R", "--root=R2", "--index-url", "http://i/simple", "--index-url=", "--uv", "/usr/bin/true", "/tmp",
          "--lock-timeout", "5", "-1", "nan", "--to", "3", "x", "--", "--check", "--check-timeout", "0", "9",
          "--progress", "json", "bogus", "--substituter", "s1", "--trusted-key", "k:x", "--version", "1.0",
          "--variant", "cpu", "--as-of", "2024-01-01", "--python-preference", "only-system", "--then-check",
          "--no-check", "--keep-records", "2", "--help", "-h", "--frob", "--verbose", "--quiet", "-", "list",
          "generations", "config", "verify", "--repair", "--delete", "--forget", "--keep", "--older-than", "30d", "--history", "--dry-run"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text('root = "/srv/from-file"\nindex_url = "http://file/simple"\nlock_timeout = 11\n'
                    'substituters = ["file:///f"]\npython_preference = "only-managed"\nprogress = "plain"\n'
                    'trusted_keys = ["f:AAAA"]\n[gc]\nkeep = 3\nmin_free = "1G"\n')
    monkeypatch.setenv(config.CONFIG_ENV, str(path))
    return config.load()


VALUES = ["R", "/tmp", "/usr/bin/true", "/no/such", "", "5", "-1", "0", "nan", "x", "json", "only-system", "2",
          "http://i/simple/", "--json", "-v", "cpu", "2024-01-01", "true --x"]
POSITIONAL = {"build": ["r.toml"], "activate": ["p", "/x/y"], "rollback": ["p"], "list": [], "info": ["p@1"],
              "env": ["p"], "generations": ["p"], "config": [], "verify": ["p", "q@2"]}


def _random_line(rng: random.Random) -> list[str]:
    """A command line of one of the fast commands: its arguments, some of its own options and the
    group's with a value each (often a good one), on either side of the command, now and then a
    token anywhere from TOKENS."""
    command = rng.choice(FAST)
    before: list[str] = []
    after: list[str] = list(POSITIONAL[command])
    options = [p for p in (*spec.GROUP, *spec.COMMANDS[command]) if not p.argument]
    for _ in range(rng.randint(0, 6)):
        p = rng.choice(options)
        flag = rng.choice(p.flags)
        if p.takes_value:
            value = rng.choice([*p.choices, *VALUES]) if rng.random() < 0.8 else rng.choice(TOKENS)
            words = [f"{flag}={value}"] if rng.random() < 0.3 else [flag, value]
        else:
            words = [flag]
        target = before if (p in spec.GROUP and rng.random() < 0.5) else after
        at = rng.randint(0, len(target))
        target[at:at] = words
    if rng.random() < 0.3:
        line = before + [command] + after
        line.insert(rng.randint(0, len(line)), rng.choice(TOKENS))
        return line
    return before + [command] + after


@pytest.mark.parametrize("with_file", [False, True], ids=["no-config", "config"])
def test_both_parsers_agree_on_random_command_lines(monkeypatch, tmp_path, with_file, request, capsys):
    if with_file:
        request.getfixturevalue("config_file")
    else:
        monkeypatch.setenv(config.CONFIG_ENV, "")
    rng = random.Random(20240601 + with_file)
    taken = refused = 0
    n = 800 if with_file else 2000  # a config file is read by each click run: slower
    for _ in range(n):
        argv = _random_line(rng)
        environ = {k: rng.choice(v) for k, v in ENV_VALUES.items() if rng.random() < 0.3}
        fast, slow = _compare(argv, environ, monkeypatch)
        taken += fast
        refused += not slow
    capsys.readouterr()  # --help's pages
    assert taken > n // 10 and refused > n // 20, (taken, refused)  # both kinds of line were tried


@pytest.mark.parametrize("argv", [
    ["build", "r.toml"],
    ["build", "r.toml", "--json", "--root", "R", "-v"],
    ["--json", "build", "--root=R", "r.toml", "-vq"],
    ["activate", "p", "/x/y", "--check", "true", "--check-timeout", "5", "--progress", "none"],
    ["rollback", "p", "--to", "3", "--lock-timeout", "0", "--substituter", "a", "--substituter", "b"],
    ["activate", "--", "p", "t.toml"],
    ["activate", "p"],  # the follow of the config file's `releases`: TARGET left out
    ["--json", "activate", "p", "--release", "prod", "--substituter", "file:///c"],
    ["generations", "p", "--history", "--substituter", "a", "--substitute-only"],
    ["generations", "p", "--delete", "3", "--delete", "4", "--dry-run", "--keep-records", "2"],
    ["--json", "config", "--root", "R"],
    ["verify"],
    ["verify", "p", "q@1", "--", "-x", "--repair"],
    ["-v", "verify", "--repair", "p", "--uv", "/usr/bin/true", "--lock-timeout", "3"],
    ["build", "r.toml", "--index-url", "http://flag/simple/", "--uv", "/usr/bin/true"],
], ids=lambda a: " ".join(a))
@pytest.mark.parametrize("env", [{}, {k: v[0] for k, v in ENV_VALUES.items()}], ids=["no-env", "env"])
@pytest.mark.parametrize("with_file", [False, True], ids=["no-config", "config"])
def test_both_parsers_take_these_lines_alike(argv, env, with_file, monkeypatch, request):
    """Flag over variable over file over default, global options on either side of the command."""
    if with_file:
        request.getfixturevalue("config_file")
    else:
        monkeypatch.setenv(config.CONFIG_ENV, "")
    env = {k: v for k, v in env.items() if k != "LLMGW_STORE_UV" or "--uv" not in argv}
    fast, slow = _compare(argv, env, monkeypatch)
    assert fast and slow


def test_precedence_flag_then_variable_then_file_then_default(monkeypatch, config_file):
    cases = [
        ([], {}, "/srv/from-file", "http://file/simple", 11.0),
        ([], {"LLMGW_STORE_ROOT": "/env", "LLMGW_STORE_INDEX_URL": "http://env/simple",
              "LLMGW_STORE_LOCK_TIMEOUT": "12"}, "/env", "http://env/simple", 12.0),
        (["--root", "/flag", "--index-url", "http://flag/simple", "--lock-timeout", "13"],
         {"LLMGW_STORE_ROOT": "/env", "LLMGW_STORE_LOCK_TIMEOUT": "12"}, "/flag", "http://flag/simple", 13.0),
    ]
    for extra, environ, root, index_url, timeout in cases:
        argv = ["build", "r.toml", *extra]
        _compare(argv, environ, monkeypatch)
        import os

        got = _fast_values(argv, dict(os.environ))
        assert (got["root"], got["index_url"], got["lock_timeout"]) == (root, index_url, timeout)
    got = _fast_values(["rollback", "p"], {config.CONFIG_ENV: ""})
    assert got["lock_timeout"] == 60.0 and got["root"] is None and got["progress"] == "auto"


def test_the_config_file_is_clicks_default_map_for_each_command_that_takes_the_setting(config_file):
    from llmgw_store.cli.app import default_map

    dm = default_map(cli, config_file.values)
    assert dm["root"] == "/srv/from-file" and dm["progress"] == "plain"
    assert dm["gc"]["keep"] == 3 and dm["gc"]["min_free"] == "1G" and dm["gc"]["lock_timeout"] == 11.0
    assert "keep" not in dm.get("generations", {})  # [gc] keep is gc's, not `generations --keep`
    assert dm["build"]["substituters"] == ("file:///f",) and dm["verify"]["python_preference"] == "only-managed"
    assert dm["verify"]["index_url"] == "http://file/simple" and "index_url" not in dm.get("pull", {})
    assert "lock_timeout" not in dm.get("cache", {}).get("gc", {})  # cache gc takes no lock


@pytest.mark.parametrize("args, want", [
    (["build", "r.toml", "--json"], ["--json", "build", "r.toml"]),
    (["build", "r.toml", "--root", "R", "-vq"], ["--root", "R", "-vq", "build", "r.toml"]),
    (["build", "--version", "1.0", "r.toml", "--progress=json"], ["--progress=json", "build", "--version", "1.0",
                                                                  "r.toml"]),
    (["cache", "gc", "file:///c", "--json", "--keep-from", "k"], ["--json", "cache", "gc", "file:///c",
                                                                  "--keep-from", "k"]),
    (["run", "p", "--", "cmd", "--json"], ["run", "p", "--", "cmd", "--json"]),
    (["run", "p", "cmd", "--json"], ["run", "p", "cmd", "--json"]),
    (["run", "--json", "p", "cmd"], ["--json", "run", "p", "cmd"]),
    (["nosuch", "--json"], ["nosuch", "--json"]),
    (["--help"], ["--help"]),
    (["build", "--help", "--json"], ["--json", "build", "--help"]),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_global_options_after_the_command_go_before_it(args, want):
    from llmgw_store.cli.app import hoist

    assert hoist(cli, args) == want


def test_the_parsers_agree_on_every_pair_of_global_option_positions(monkeypatch):
    monkeypatch.setenv(config.CONFIG_ENV, "")
    globals_ = [["--json"], ["-v"], ["-q"], ["--root", "R"], ["--progress", "none"]]
    for a, b in itertools.permutations(globals_, 2):
        for where in ("before", "after", "split"):
            if where == "before":
                argv = [*a, *b, "rollback", "p"]
            elif where == "after":
                argv = ["rollback", "p", *a, *b]
            else:
                argv = [*a, "rollback", *b, "p"]
            fast, slow = _compare(argv, {}, monkeypatch)
            assert fast and slow, argv


def test_the_repository_has_no_second_copy_of_an_option(tmp_path):
    """The fast path keeps no table of its own: no option spelling appears in cli/fast.py."""
    text = (Path(spec.__file__).parent / "fast.py").read_text()
    for p in (*spec.GROUP, *itertools.chain.from_iterable(spec.COMMANDS.values())):
        for f in p.flags:
            if f.startswith("--"):
                assert f'"{f}"' not in text, f
