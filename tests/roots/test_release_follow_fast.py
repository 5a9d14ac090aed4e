"""A follow of a release that has not moved is answered by the fast path (roots/follow.py through
cli/fast.py: the node's mark, one read of the pointer, its checks, the profile's generation), with
exactly what the full command answers; everything else — a replayed or older pointer, a tampered
one, a key no longer trusted, a moved release, a held profile — is the full command's (issue 35).

Whether the fast path answered is read from `python -X importtime`: the full follow loads
cache/releases.py (and the store, the pull); the fast one never does.

Real parts: the builder store of tests/support/delta.py, a node store, a file:// cache and the
documented nginx (tests/support/nginx.py), the installed CLI in subprocesses."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_cmd, run_cli
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)
from tests.support.follow import clean_env, node_config
from tests.support.nginx import AUTH, NGINX, NODES, start_nginx  # noqa: F401  (the fixture)

FULL_ONLY = "llmgw_store.cache.releases"  # the full follow's module: the fast path never loads it
NODE_AUTH = {"LLMGW_STORE_CACHE_AUTH": f"node-1:{NODES['node-1']}"}


def traced(root: Path, conf: Path, *args: str, env: dict) -> tuple[subprocess.CompletedProcess, bool]:
    """One run of the installed command on the node: (the process, whether the fast path answered it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *cli_cmd(root, "--config", str(conf), *args)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    proc.stderr = "".join(ln + "\n" for ln in proc.stderr.splitlines() if not ln.startswith("import time:"))
    return proc, "llmgw_store.roots.follow" in loaded and FULL_ONLY not in loaded and "click" not in loaded


def full(root: Path, conf: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    """The same command through the click app alone (never the fast path)."""
    code = "import sys; from llmgw_store.cli.main import main; sys.argv[0] = 'llmgw-store'; main()"
    return subprocess.run([sys.executable, "-c", code, "--root", str(root), "--config", str(conf), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


class Fleet:
    """A builder publishing `prod` to one cache, and one node following it by its config file."""

    def __init__(self, w, tmp_path: Path, cache: str, builder_env: dict | None = None, node_env: dict | None = None):
        self.w, self.cache = w, cache
        self.builder_env = clean_env(builder_env)
        self.env = clean_env(node_env) | {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
        self.node = tmp_path / "node"
        self.conf = node_config(tmp_path / "node.toml", w["keys"], cache, node=False)
        self.secret = str(w["keys"] / "builder-1.secret")

    def builder(self, *args: str) -> subprocess.CompletedProcess:
        return run_cli(self.w["root"], *args, env=self.builder_env, check=True)

    def set(self, name: str) -> None:
        self.builder("push", name, "--to", self.cache, "--secret-key", self.secret)
        self.builder("release", "set", "prod", name, "--to", self.cache, "--secret-key", self.secret)

    def node_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_cli(self.node, "--config", str(self.conf), *args, env=self.env, check=check)

    def follow(self, *args: str) -> tuple[subprocess.CompletedProcess, bool]:
        return traced(self.node, self.conf, *args, "activate", "svc", env=self.env)

    def current(self) -> str:
        gens = json.loads(self.node_cli("--json", "generations", "svc").stdout)["generations"]
        return next(g["name"] for g in gens if g["current"])


def _file_fleet(w, tmp_path) -> tuple[Fleet, Path]:
    cache = tmp_path / "cache"
    return Fleet(w, tmp_path, f"file://{cache}"), cache / "releases" / "prod.json"


def _parity(f: Fleet) -> None:
    """The no-op follow, both forms (config file, --release) and both outputs (text, --json; -v, -q):
    answered by the fast path, as the full command answers it."""
    for args in ((), ("--json",), ("-v",), ("-q", "--json")):
        for how in ((), ("--release", "prod")):
            fast_proc, fast = traced(f.node, f.conf, *args, "activate", "svc", *how, env=f.env)
            slow = full(f.node, f.conf, *args, "activate", "svc", *how, env=f.env)
            assert fast, (args, how, fast_proc.stderr)
            assert (fast_proc.returncode, fast_proc.stdout, fast_proc.stderr) == \
                (slow.returncode, slow.stdout, slow.stderr), (args, how)
            assert fast_proc.returncode == 0
            assert "already at generation 1" in fast_proc.stdout if "--json" not in args else \
                json.loads(fast_proc.stdout)["changed"] is False
    doc = json.loads(traced(f.node, f.conf, "--json", "activate", "svc", env=f.env)[0].stdout)
    assert doc["changed"] is False and doc["release"]["release"] == "prod" and doc["release"]["key"] == f.current()[:32]


def test_a_no_op_follow_is_answered_fast_as_the_full_command_answers_it(world, tmp_path):
    w, (a, _) = world, world["names"]
    f, _ = _file_fleet(w, tmp_path)
    f.set(a)
    first, fast = f.follow()
    assert first.returncode == 0 and not fast and "generation 1" in first.stdout, first.stderr  # the first follow
    assert f.current() == a
    _parity(f)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
def test_a_no_op_follow_through_the_documented_nginx_is_answered_fast_too(world, start_nginx, tmp_path):
    w, (a, _) = world, world["names"]
    ngx = start_nginx()
    f = Fleet(w, tmp_path, ngx.url, AUTH, NODE_AUTH)
    f.set(a)
    first, fast = f.follow()
    assert first.returncode == 0 and not fast, first.stderr
    _parity(f)
    # One GET of the pointer: what nginx logged for the last follow.
    log = ngx.error_log.with_name("access.log")
    before = log.read_text().count("\n")
    proc, fast = f.follow()
    assert proc.returncode == 0 and fast
    requests = log.read_text().splitlines()[before:]
    assert [r.split('"')[1] for r in requests] == ["GET /llmgw/releases/prod.json HTTP/1.1"], requests


def test_a_replayed_older_pointer_is_refused_by_the_fast_path_too(world, tmp_path):
    """The node went back by hand (`rollback`) to what an older pointer names; that pointer, put
    back in the cache, names the profile's current generation: only the mark refuses it."""
    w, (a, b) = world, world["names"]
    f, obj = _file_fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    old = obj.read_bytes()
    f.set(b)
    proc, _ = f.follow()
    assert proc.returncode == 0 and f.current() == b, proc.stderr
    f.node_cli("rollback", "svc")
    assert f.current() == a
    obj.write_bytes(old)  # the replay
    proc, fast = f.follow()
    assert proc.returncode == 65 and not fast, (proc.stdout, proc.stderr)
    assert "is older than" in proc.stderr and "refusing it" in proc.stderr and proc.stdout == ""
    assert f.current() == a


def test_a_tampered_pointer_or_a_key_no_longer_trusted_is_refused_by_the_fast_path_too(world, tmp_path):
    """The pointer the node marked, its signed part intact (so its digest is the mark's) and its
    signature damaged — and then intact, but its signer's key removed from the node's trusted keys."""
    w, (a, _) = world, world["names"]
    f, obj = _file_fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    assert f.follow()[1]  # answered fast, before anything was changed
    good = obj.read_bytes()
    doc = json.loads(good)
    sig = bytearray(base64.b64decode(doc["signatures"][0]["sig"]))
    sig[0] ^= 1
    doc["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    obj.write_text(json.dumps(doc))
    proc, fast = f.follow()
    assert proc.returncode == 65 and not fast and "does not verify" in proc.stderr, proc.stderr
    obj.write_bytes(good)
    assert f.follow()[1]
    # The builder's key no longer trusted (the intruder's instead): nothing the old key signed is taken.
    f.conf.write_text(f.conf.read_text().replace("builder-1.public", "intruder.public"))
    for _ in range(2):  # the first reads the changed file (the full command), the second its cached values
        proc, fast = f.follow()
        assert proc.returncode != 0 and not fast and "not signed by a trusted key" in proc.stderr, proc.stderr
    assert f.current() == a


def test_a_moved_release_falls_through_to_a_real_switch(world, tmp_path):
    w, (a, b) = world, world["names"]
    f, _ = _file_fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    f.set(b)
    proc, fast = f.follow()
    assert proc.returncode == 0 and not fast and "generation 2" in proc.stdout, proc.stderr
    assert f.current() == b
    proc, fast = f.follow()
    assert fast and "already at generation 2" in proc.stdout
    # A release set again to the same key is a new pointer (a new sequence number): the full
    # command takes it and raises the mark; the next follow is fast again.
    f.builder("release", "set", "prod", b, "--to", f.cache, "--secret-key", f.secret)
    proc, fast = f.follow()
    assert proc.returncode == 0 and not fast and "already at generation 2" in proc.stdout
    assert f.follow()[1]


def test_a_held_profile_is_not_answered_by_the_fast_path(world, tmp_path):
    w, (a, b) = world, world["names"]
    f, _ = _file_fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    f.node_cli("hold", "svc")
    for moved in (False, True):
        if moved:
            f.set(b)
        proc, fast = f.follow()
        assert proc.returncode == 0 and not fast and "held at" in proc.stdout, proc.stdout
        assert f.current() == a
    f.node_cli("unhold", "svc")
    proc, fast = f.follow()
    assert proc.returncode == 0 and not fast and f.current() == b


def test_a_first_follow_and_a_missing_mark_are_the_full_commands(world, tmp_path):
    """Without this node's mark of the release (a first follow, or var/seen.json moved away) the
    full command reads the pointer and records the mark; nothing is answered from nothing."""
    w, (a, _) = world, world["names"]
    f, _ = _file_fleet(w, tmp_path)
    f.set(a)
    assert f.follow()[0].returncode == 0
    os.rename(f.node / "var" / "seen.json", f.node / "var" / "seen.json.old")
    proc, fast = f.follow()
    assert proc.returncode == 0 and not fast and "already at generation 1" in proc.stdout
    assert (f.node / "var" / "seen.json").exists() and f.follow()[1]


def test_the_lean_name_checks_are_the_regular_expressions():
    """cache/pointer.py checks names and words without `re` (it is on the follow's path): the same
    answers as the expressions releases.py and its history checks used, on names near every edge."""
    import random
    import re

    from llmgw_store.cache import pointer

    rules = [(re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*"), lambda s: pointer._chars(s, pointer._NAME_CHARS, 64), 64),
             (re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"), pointer._signer, 1 << 30),
             (re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,199}"), pointer._word, 1 << 30)]
    alphabet = "aZ09._-+!/ \n\u00e9\u0661:"
    rng = random.Random(35)
    words = ["", "a", "-a", ".a", "a..b", "a\n", "\u0661", "a" * 64, "a" * 65, "a" * 100, "a" * 101, "a" * 200,
             "a" * 201] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    for expr, lean, most in rules:
        for w in words:
            assert lean(w) == (bool(expr.fullmatch(w)) and len(w) <= most), (expr.pattern, w)
    for w in words:
        assert pointer.release_name_ok(w) == (bool(rules[0][0].fullmatch(w)) and len(w) <= 64 and ".." not in w), w


def test_malformed_json_is_a_value_error_before_json_is_loaded():
    """system/jsontext reads var/seen.json and the pointer on the follow's path, where the json package
    is not loaded: a malformed document is still a ValueError (json's own), never an internal error."""
    code = ("import sys\nfrom llmgw_store.system import jsontext\nassert 'json.decoder' not in sys.modules\n"
            "for text in ('{not json', '{\"a\": [1, }', '[1,', ''):\n"
            "    try:\n        jsontext.loads(text)\n    except ValueError as exc:\n        print(type(exc).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and len(proc.stdout.split()) == 4, proc.stderr


def test_a_cache_that_fails_is_asked_once_by_the_fast_path_then_by_the_full_command(world, tmp_path):
    """The fast path makes one attempt and leaves a failing cache to the full command's retries: a
    follow against a cache that answers 503 fails after the full command's attempts plus one, not
    twice as many (which would double the time a node takes to say the cache is unreachable)."""
    from tests.support.fault_server import FaultyCache

    w, (a, _) = world, world["names"]
    f, _ = _file_fleet(w, tmp_path)
    f.set(a)
    srv = FaultyCache(tmp_path / "cache")
    try:
        f.conf = node_config(tmp_path / "node-http.toml", w["keys"], srv.url, node=False)
        first, fast = f.follow()
        assert first.returncode == 0 and not fast, first.stderr
        proc, fast = f.follow()
        assert proc.returncode == 0 and fast, proc.stderr  # the positive case: answered fast over HTTP
        srv.rules.append([__import__("re").compile(r"/releases/prod\.json$"), "503", None])
        srv.requests.clear()
        f.env = f.env | {"LLMGW_STORE_CACHE_ATTEMPTS": "3"}
        proc, _ = f.follow()
        assert proc.returncode == 69, (proc.returncode, proc.stderr)
        asked = [p for _, p in srv.requests if p.endswith("/releases/prod.json")]
        assert len(asked) == 1 + 3, srv.requests
    finally:
        srv.stop()
