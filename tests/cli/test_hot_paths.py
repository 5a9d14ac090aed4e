"""What the hot paths load (`python -X importtime` of the installed command): a cache-hit `build`
loads none of click, SQLite, re, pathlib, typing or dataclasses; a switch (`activate`, `rollback`)
loads no click, no inspect (cli/fast.py defers it: every dataclass a switch makes has a
docstring), no OpenSSL and no child-process machinery; neither parses a config file it has seen (tomllib). Each of
those is milliseconds on a path whose whole budget is a few times the interpreter's start. A follow
of a release that has not moved (roots/follow.py) loads what a switch does not load, but not the
library's cache stack (releases, backends, signing), the store as the library opens it, json,
pathlib or dataclasses: the pointer's checks (cache/pointer.py, cache/signatures.py) and PyNaCl.
The figures themselves are taken by bench/ and quoted in docs/architecture.md ("Figures")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_json, cli_cmd, run_cli


def _names(stderr: str) -> set[str]:
    return {ln.rsplit("|", 1)[-1].strip() for ln in stderr.splitlines() if ln.startswith("import time:")}


def loaded(root: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The process, and the modules it loaded beyond what finding the package loads (an editable
    install's import hook brings re and pathlib itself; a regular install, none)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *cli_cmd(root, *args)], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, **(env or {})})
    base = subprocess.run([sys.executable, "-X", "importtime", "-c", "import llmgw_store.cli"], capture_output=True,
                          text=True, timeout=60, check=True)
    return proc, _names(proc.stderr) - (_names(base.stderr) - {"llmgw_store", "llmgw_store.cli"})


@pytest.fixture
def store(tmp_path, root, recipe, index, uv_bin):
    a = build_json(root, recipe, index, uv_bin)["path"]
    b = build_json(root, recipe, index, uv_bin, "--as-of", "2024-06-02")["path"]
    run_cli(root, "activate", "p", a, check=True)
    conf = tmp_path / "config.toml"
    conf.write_text(f'index_url = "{index.url}"\nuv = "{uv_bin}"\nlock_timeout = 30\n')
    env = {"LLMGW_STORE_CONFIG": str(conf), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run_cli(root, "config", env=env, check=True)  # the full command reads the file once
    return {"a": a, "b": b, "env": env, "recipe": recipe}


HIT_NEVER = {"click", "_sqlite3", "re", "pathlib", "typing", "dataclasses", "inspect", "tomllib", "json", "threading",
             "hashlib", "contextlib", "enum", "importlib.util"}
SWITCH_NEVER = {"click", "inspect", "ast", "tomllib", "_hashlib", "hmac", "secrets", "shlex",
                "llmgw_store.app.debug", "llmgw_store.supervise.procs", "llmgw_store.build.builder"}


FOLLOW_NEVER = SWITCH_NEVER | {"llmgw_store.cache.releases", "llmgw_store.cache.signing", "llmgw_store.cache.backends",
                               "llmgw_store.cache.pull", "llmgw_store.core.local_store", "llmgw_store.core.index",
                               "json", "pathlib", "dataclasses"}
FOLLOW_LOADS = {"llmgw_store.roots.follow", "llmgw_store.cache.pointer", "llmgw_store.cache.signatures",
                "llmgw_store.roots.switch", "nacl.signing"}


def test_a_cache_hit_loads_little(root, store):
    proc, names = loaded(root, "build", str(store["recipe"]), env=store["env"])
    assert proc.returncode == 0 and proc.stdout == store["a"] + "\n"
    assert "llmgw_store.build.memo" in names and not names & HIT_NEVER, sorted(names & HIT_NEVER)


def test_a_switch_loads_what_it_needs_only(root, store):
    for args in (["activate", "p", store["b"]], ["rollback", "p"], ["--json", "activate", "p", store["b"]]):
        proc, names = loaded(root, *args, env=store["env"])
        assert proc.returncode == 0, proc.stderr
        # roots/switch.py answers (tests/roots/test_switch.py checks what else it leaves out, from a regular layout too).
        assert "llmgw_store.roots.switch" in names and not names & SWITCH_NEVER, (args, sorted(names & SWITCH_NEVER))
    # A check runs a child: then procs comes (and threads for its output).
    proc, names = loaded(root, "activate", "p", store["a"], "--check", "true", env=store["env"])
    assert proc.returncode == 0 and "llmgw_store.supervise.procs" in names and "click" not in names


def test_inspect_deferred_is_inspect_when_used(root, store):
    """The stand-in cli/fast.py puts in place of inspect is the real module at its first use."""
    code = ("import sys; from llmgw_store.cli.fast import defer; sys.modules.pop('inspect', None); defer('inspect');"
            "import inspect; assert type(inspect).__name__ == '_Deferred'; f = inspect.signature;"
            "import inspect as again; assert again is sys.modules['inspect'] and again.signature is f;"
            "assert 'getsource' in dir(inspect); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert proc.stdout == "ok\n", proc.stderr


def test_every_dataclass_of_the_library_has_a_docstring_where_a_switch_loads_it():
    """dataclasses imports inspect to write the docstring of a dataclass that has none: one of those
    on a switch's path would load it again (the test above would fail). This names the class."""
    import ast

    from tests.conftest import REPO

    modules = ["core/layout.py", "core/local_store.py", "app/results.py", "roots/profiles.py", "roots/records.py",
               "roots/health.py"]
    for rel in modules:
        tree = ast.parse((REPO / "store" / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                assert ast.get_docstring(node), f"store/{rel}: {node.name} needs a one-line docstring"


def test_a_follow_of_a_release_that_has_not_moved_loads_what_it_needs_only(root, store, tmp_path):
    keys = tmp_path / "keys"
    run_cli(root, "keygen", "builder", "--out", str(keys), check=True)
    cache, secret = f"file://{tmp_path / 'bcache'}", str(keys / "builder.secret")
    run_cli(root, "push", store["a"], "--to", cache, "--secret-key", secret, check=True)
    run_cli(root, "release", "set", "prod", store["a"], "--to", cache, "--secret-key", secret, check=True)
    node = tmp_path / "node"
    follow = ["activate", "svc", "--release", "prod", "--substituter", cache, "--trusted-key", str(keys / "builder.public")]
    run_cli(node, *follow, env=store["env"], check=True)  # the first follow: the full command, the mark recorded
    for args in (follow, ["--json", *follow]):
        proc, names = loaded(node, *args, env=store["env"])
        assert proc.returncode == 0 and ('"changed": false' in proc.stdout or "already at" in proc.stdout), proc.stderr
        assert FOLLOW_LOADS <= names and not names & FOLLOW_NEVER, (args, FOLLOW_LOADS - names,
                                                                     sorted(names & FOLLOW_NEVER))
