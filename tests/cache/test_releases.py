"""Releases (issue 35): the builder decides what the fleet runs by a signed pointer in the binary
cache (`release set`), and a node follows it (`activate PROFILE --release NAME`) without a recipe,
a key of its own, or the index.

Real parts: a builder store with two neighbouring environments (tests/support/delta.py), a node
store, a file:// cache and the documented nginx (tests/support/nginx.py), the real CLI in
subprocesses. The node names an index that is not there (port 9): it never asks one.
"""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from tests.conftest import run_cli, run_in_env
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)
from tests.support.nginx import AUTH, NGINX, start_nginx  # noqa: F401  (the fixture)

DEAD_INDEX = "http://127.0.0.1:9/simple"


def _push(w, name, cache, env=None):
    run_cli(w["root"], "push", name, "--to", cache, "--secret-key", str(w["keys"] / "builder-1.secret"), env=env,
            check=True)


def _set(w, release, target, cache, *, key="builder-1", env=None, check=True, extra=()):
    proc = run_cli(w["root"], "--json", "release", "set", release, target, "--to", cache, "--secret-key",
                   str(w["keys"] / f"{key}.secret"), *extra, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    return proc


def _node_env(w, cache) -> dict:
    return {"LLMGW_STORE_SUBSTITUTERS": cache,
            "LLMGW_STORE_TRUSTED_KEYS": (w["keys"] / "builder-1.public").read_text().strip(),
            "LLMGW_STORE_SUBSTITUTE_ONLY": "1", "LLMGW_STORE_INDEX_URL": DEAD_INDEX}


def _follow(w, env, release="prod", profile="svc"):
    return run_cli(w["node"], "--json", "activate", profile, "--release", release, env=env)


def _followed(w, env, release="prod") -> dict:
    proc = _follow(w, env, release)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _runs(w) -> str:
    return run_in_env(w["node"] / "profiles" / "svc", "tinyengine")


def _outcomes(root) -> list[str]:
    con = sqlite3.connect(root / "var" / "db.sqlite")
    try:
        return [r[0] for r in con.execute("SELECT outcome FROM builds")]
    finally:
        con.close()


def _one_error(proc) -> str:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("llmgw-store: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _current(w) -> tuple[int, str]:
    gens = json.loads(run_cli(w["node"], "--json", "generations", "svc", check=True).stdout)
    cur = next(g for g in gens["generations"] if g["current"])
    return gens["current"], cur["name"]


def test_a_node_follows_the_release_forward_back_and_refuses_a_replay(world, tmp_path):
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    pointer = tmp_path / "cache" / "releases" / "prod.json"
    _push(w, a, cache)
    _push(w, b, cache)
    env = _node_env(w, cache)

    first = _set(w, "prod", a, cache)
    assert first["key"] == a[:32] and first["name"] == a and first["previous"] is None
    assert (first["engine"], first["version"], first["signer"]) == ("tinyengine", "1.0", "builder-1")
    got = _followed(w, env)
    assert (got["generation"], got["changed"], got["release"]["name"]) == (1, True, a)
    assert _runs(w) == "tinyengine 1.0 tinydep 1.0"

    # Not moved: nothing pulled, no new generation.
    builds = _outcomes(w["node"])
    same = _followed(w, env)
    assert (same["generation"], same["changed"]) == (1, False)
    assert _outcomes(w["node"]) == builds

    second = _set(w, "prod", b, cache)
    assert second["seq"] > first["seq"] and second["previous"]["key"] == a[:32]
    old_bytes = pointer.read_bytes()  # prod -> b, a genuine pointer a replay will put back
    assert (_followed(w, env)["generation"], _current(w)[1]) == (2, b)
    assert _runs(w) == "tinyengine 1.0 tinydep 2.0"

    # Back to a: a newer sequence number pointing at an older key is a fleet-wide rollback.
    third = _set(w, "prod", a, cache)
    assert third["seq"] > second["seq"] and [e["key"] for e in third["history"]] == [b[:32], a[:32]]
    back = _followed(w, env)
    assert (back["generation"], back["changed"], _current(w)[1]) == (3, True, a)
    assert _runs(w) == "tinyengine 1.0 tinydep 1.0"
    assert "built" not in _outcomes(w["node"])  # pulled or already here, never built

    # A replay: the older pointer's genuine bytes put back. Refused, the node stays where it is.
    pointer.write_bytes(old_bytes)
    proc = _follow(w, env)
    assert proc.returncode == 65, proc.stderr
    line = _one_error(proc)
    assert f"sequence {second['seq']} is older than {third['seq']}" in line and "replayed" in line, line
    assert _current(w) == (3, a)

    # The builder moves on from whatever the cache holds: its next sequence number is above every one it saw.
    fourth = _set(w, "prod", a, cache)
    assert fourth["seq"] > third["seq"]
    assert _followed(w, env)["changed"] is False

    # rollback still works on the node, locally; following the release again brings it back to prod.
    run_cli(w["node"], "rollback", "svc", env=env, check=True)
    assert _current(w) == (2, b)
    again = _followed(w, env)
    assert (again["generation"], again["changed"], _current(w)[1]) == (4, True, a)

    # The node's record of what it has seen is its own: damaged, it stops the node (a lost record would let
    # a replay through) with one line saying how to start over.
    seen = w["node"] / "var" / "seen.json"
    assert json.loads(seen.read_text())["marks"]["*"]["release"]["prod"]["seq"] == fourth["seq"]
    seen.write_text("{not json")
    line = _one_error(_follow(w, env))
    assert "not a record of the signed documents seen; move it away" in line, line


def test_a_pointer_a_trusted_key_did_not_sign_is_refused(world, tmp_path):
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    pointer = tmp_path / "cache" / "releases" / "prod.json"
    _push(w, a, cache)
    _push(w, b, cache)
    env = _node_env(w, cache)
    _set(w, "prod", a, cache)
    assert _followed(w, env)["generation"] == 1

    # Tampered: the key moved to b by hand, the signature kept.
    doc = json.loads(pointer.read_text())
    doc["key"], doc["name"] = b[:32], b
    pointer.write_text(json.dumps(doc))
    line = _one_error(_follow(w, env))
    assert ("releases/prod.json: not signed by a trusted key: a signature naming one does not verify, the "
            "metadata was changed after signing (signed by: builder-1); refusing it") in line, line
    assert _current(w) == (1, a)

    # An untrusted signer (the intruder's key, though the object is the builder's).
    proc = _set(w, "prod", b, cache, key="intruder", extra=("--trusted-key", str(w["keys"] / "builder-1.public")))
    assert proc["signer"] == "intruder"
    line = _one_error(_follow(w, env))
    assert "not signed by a trusted key (signed by: intruder)" in line, line
    assert _current(w) == (1, a)
    assert "substituted" in _outcomes(w["node"]) and len(_outcomes(w["node"])) == 1  # b was never pulled

    # Another release's genuine pointer served under this one's name; a pointer too large to be one.
    _set(w, "canary", b, cache)
    pointer.write_bytes((pointer.parent / "canary.json").read_bytes())
    line = _one_error(_follow(w, env))
    assert "releases/prod.json: it is signed for another release ('canary'); refusing it" in line, line
    pointer.write_bytes(b" " * (65 << 10))
    line = _one_error(_follow(w, env))
    assert "serves more than 65536 bytes" in line, line
    assert _current(w) == (1, a)

    # No pointer at all: one line naming the release.
    line = _one_error(_follow(w, env, release="staging"))
    assert "no binary cache given has the release staging" in line, line


@pytest.mark.parametrize("name", ["../prod", "a/b", "..", "a..b", ".hidden", "x" * 65, "prod\n"])
def test_a_release_name_that_is_not_one_is_refused(world, tmp_path, name):
    w, a = world, world["names"][0]
    cache = f"file://{tmp_path / 'cache'}"
    proc = _set(w, name, a, cache, check=False)
    assert proc.returncode == 2 and "is not a release name" in _one_error(proc), proc.stderr
    proc = _follow(w, _node_env(w, cache), release=name)
    assert proc.returncode == 2 and "is not a release name" in _one_error(proc), proc.stderr
    assert not (tmp_path / "cache").exists()


def test_release_set_refuses_what_the_cache_does_not_hold(world, tmp_path):
    w, a = world, world["names"][0]
    cache = f"file://{tmp_path / 'cache'}"
    proc = _set(w, "prod", a, cache, check=False)
    assert proc.returncode == 2 and f"has no {a}: push it first" in _one_error(proc), proc.stderr
    assert not (tmp_path / "cache" / "releases").exists()

    # From a root that lacks the path: the key is taken as the cache's signed metadata names it.
    _push(w, a, cache)
    other = tmp_path / "other"
    proc = run_cli(other, "--json", "release", "set", "prod", a[:32], "--to", cache, "--secret-key",
                   str(w["keys"] / "builder-1.secret"), check=True)
    doc = json.loads(proc.stdout)
    assert (doc["key"], doc["name"], doc["engine"]) == (a[:32], a, None)
    assert _followed(w, _node_env(w, cache))["release"]["name"] == a


def test_activate_takes_a_target_or_a_release(world, tmp_path):
    w, a = world, world["names"][0]
    env = _node_env(w, f"file://{tmp_path / 'cache'}")
    both = run_cli(w["node"], "activate", "svc", a, "--release", "prod", env=env)
    assert both.returncode == 2 and "TARGET and --release exclude each other" in _one_error(both)
    neither = run_cli(w["node"], "activate", "svc", env=env)
    assert neither.returncode == 2 and "needs TARGET" in _one_error(neither)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
def test_a_node_follows_a_release_through_the_documented_nginx(world, start_nginx):
    w, (a, b) = world, world["names"]
    ngx = start_nginx()
    _push(w, a, ngx.url, env=AUTH)
    _push(w, b, ngx.url, env=AUTH)
    anonymous = _set(w, "prod", a, ngx.url, check=False)
    assert anonymous.returncode == 1 and "HTTP 401" in anonymous.stderr  # a pointer is written by the builder only
    _set(w, "prod", a, ngx.url, env=AUTH)
    env = _node_env(w, ngx.url)
    assert _followed(w, env)["generation"] == 1
    _set(w, "prod", b, ngx.url, env=AUTH)
    assert _followed(w, env)["generation"] == 2 and _runs(w) == "tinyengine 1.0 tinydep 2.0"

    # A release that has not moved costs one GET: the pointer.
    log = ngx.files.parent.parent / "access.log"
    before = log.read_text().count("\n")
    assert _followed(w, env)["changed"] is False
    requests = log.read_text().splitlines()[before:]
    assert len(requests) == 1 and re.search(r'"GET /llmgw/releases/prod\.json HTTP', requests[0]), requests

    # The fleet view through nginx: the folder listings of roots/ and releases/.
    run_cli(w["node"], "keygen", "node-1", "--out", str(w["keys"]), check=True)
    run_cli(w["node"], "push-roots", "--to", ngx.url, "--secret-key", str(w["keys"] / "node-1.secret"), env=AUTH,
            check=True)
    doc = json.loads(run_cli(w["root"], "--json", "fleet", "--from", ngx.url, "--keep-from",
                             str(w["keys"] / "node-1.public"), "--trusted-key", str(w["keys"] / "builder-1.public"),
                             check=True).stdout)
    assert [(n["node"], n["profiles"]) for n in doc["nodes"]] == [("node-1", {"svc": b[:32]})]
    assert [(r["release"], r["key"]) for r in doc["releases"]] == [("prod", b[:32])]


def test_promote_show_and_one_view_of_the_fleet(world, tmp_path):
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    _push(w, a, cache)
    _push(w, b, cache)
    _set(w, "prod", a, cache)
    pushed = json.loads(run_cli(w["root"], "--json", "push", b, "--to", cache, "--secret-key",
                                str(w["keys"] / "builder-1.secret"), "--release", "canary", check=True).stdout)
    assert pushed["already_there"] == [b] and pushed["release"]["name"] == b
    promoted = json.loads(run_cli(w["root"], "--json", "release", "promote", "canary", "prod", "--to", cache,
                                  "--secret-key", str(w["keys"] / "builder-1.secret"), check=True).stdout)
    assert (promoted["release"], promoted["name"], promoted["previous"]["name"]) == ("prod", b, a)
    public = str(w["keys"] / "builder-1.public")
    shown = run_cli(w["node"], "release", "show", "prod", "--from", cache, "--trusted-key", public, check=True)
    assert shown.stdout.startswith(f"prod -> {b}  tinyengine 1.0 (cpu)") and f"  was {a}" in shown.stdout
    untrusted = run_cli(w["node"], "release", "show", "prod", "--from", cache, "--trusted-key",
                        str(w["keys"] / "intruder.public"))
    assert untrusted.returncode == 77 and "not signed by a trusted key" in _one_error(untrusted)

    # A node follows prod and publishes its roots; the fleet view shows what it runs, and which release that is.
    env = _node_env(w, cache)
    _followed(w, env)
    run_cli(w["node"], "keygen", "node-1", "--out", str(w["keys"]), check=True)
    run_cli(w["node"], "push-roots", "--to", cache, "--secret-key", str(w["keys"] / "node-1.secret"), check=True)
    args = ("fleet", "--from", cache, "--keep-from", str(w["keys"] / "node-1.public"), "--trusted-key", public)
    doc = json.loads(run_cli(w["root"], "--json", *args, check=True).stdout)
    (node,) = doc["nodes"]
    assert (node["node"], node["profiles"], node["refused"]) == ("node-1", {"svc": b[:32]}, None)
    assert {r["release"]: r["key"] for r in doc["releases"]} == {"prod": b[:32], "canary": b[:32]}
    text = run_cli(w["root"], *args, check=True).stdout
    assert f"  svc -> {b[:32]}  (release canary, prod)" in text, text

    # A roots document that fails its checks is shown as refused; the rest is still shown.
    roots = tmp_path / "cache" / "roots" / "node-1.json"
    tampered = json.loads(roots.read_text())
    tampered["profiles"] = {"svc": a[:32]}
    roots.write_text(json.dumps(tampered))
    doc = json.loads(run_cli(w["root"], "--json", *args, check=True).stdout)
    assert "not signed by a trusted key" in doc["nodes"][0]["refused"] and len(doc["releases"]) == 2


def test_two_activations_at_once_never_lower_the_mark(world, tmp_path):
    """One activation holds between its check of the pointer and its record of it (the older pointer);
    another reads the newer pointer meanwhile and must wait for it, so the record ends at the newer."""
    import subprocess

    from tests.conftest import cli_cmd
    from tests.support.barrier import Barrier

    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    _push(w, a, cache)
    _push(w, b, cache)
    env = _node_env(w, cache)
    gate = Barrier(tmp_path)
    old = _set(w, "prod", a, cache)
    args = ("--json", "activate", "svc", "--release", "prod")

    def start(point):
        import os

        return subprocess.Popen(cli_cmd(w["node"], *args), env={**os.environ, **env, **gate.env(point)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = start("SEEN_PAUSE")
    gate.reached("SEEN_PAUSE", first)
    new = _set(w, "prod", b, cache)
    second = start("LOCK_WAIT")
    gate.reached("LOCK_WAIT", second)  # queued behind the first, which holds the record's lock
    gate.go("LOCK_WAIT")
    gate.go("SEEN_PAUSE")
    for proc in (first, second):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    marks = json.loads((w["node"] / "var" / "seen.json").read_text())["marks"]
    assert marks["*"]["release"]["prod"]["seq"] == new["seq"] > old["seq"]


def test_a_node_config_file_names_the_release_each_profile_follows(world, tmp_path):
    w, a = world, world["names"][0]
    cache = f"file://{tmp_path / 'cache'}"
    _push(w, a, cache)
    _set(w, "prod", a, cache)
    conf = tmp_path / "node.toml"
    conf.write_text(f'substituters = ["{cache}"]\ntrusted_keys = ["{w["keys"] / "builder-1.public"}"]\n'
                    'substitute_only = true\nreleases = {svc = "prod", api = "canary"}\n')
    conf.chmod(0o600)
    env = {"LLMGW_STORE_CONFIG": str(conf), "LLMGW_STORE_INDEX_URL": DEAD_INDEX}
    proc = run_cli(w["node"], "--json", "activate", "svc", env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["generation"], doc["release"]["release"], doc["release"]["name"]) == (1, "prod", a)
    shown = json.loads(run_cli(w["node"], "--json", "config", env=env, check=True).stdout)
    assert "svc=prod" in json.dumps(shown), shown
    # A profile the file names no release for: one line saying what activate needs.
    line = _one_error(run_cli(w["node"], "activate", "other", env=env))
    assert "activate needs TARGET" in line and 'releases = {other = "NAME"}' in line, line
    # The flag names one too (PROFILE=RELEASE), over the file's table.
    proc = run_cli(w["node"], "activate", "api", "--follow", "api=prod", env=env)
    assert proc.returncode == 0 and "(release prod," in proc.stdout, proc.stderr
    conf.write_text('releases = ["svc"]\n')
    line = _one_error(run_cli(w["node"], "activate", "svc", env=env))
    assert "releases" in line and "must be" in line, line


def test_an_older_pointer_from_another_cache_or_spelling_is_a_replay_too(world, tmp_path):
    """The mark is the release's, not one cache's: a second substituter (a mirror that lags, or one
    whose writer replays), a new cache URL, or the same cache spelled `//` or `/./` serving the older
    genuine pointer is refused as a replay (found by the outside attack of issue 32)."""
    w, (a, b) = world, world["names"]
    one, two = f"file://{tmp_path / 'rc1'}", f"file://{tmp_path / 'rc2'}"
    for cache in (one, two):
        _push(w, a, cache)
        _push(w, b, cache)
    _set(w, "prod", a, two)              # rc2 holds the older pointer: prod -> a
    older = (tmp_path / "rc2" / "releases" / "prod.json").read_bytes()
    newer = _set(w, "prod", b, one)      # rc1: prod -> b, later
    assert (_followed(w, _node_env(w, one))["release"]["name"], _current(w)) == (b, (1, b))

    (tmp_path / "rc1" / "releases" / "prod.json").unlink()  # rc1 lost it, or is down
    for caches in (f"{one} {two}", two, f"file://{tmp_path}//rc2", f"file://{tmp_path}/./rc2"):
        line = _one_error(_follow(w, _node_env(w, caches)))
        assert f"is older than {newer['seq']}" in line and "replayed" in line, (caches, line)
        assert _current(w) == (1, b)
    # The same spelled another way, with the newer pointer: the mark holds it, the node follows.
    (tmp_path / "rc2" / "releases" / "prod.json").write_bytes(older)
    _set(w, "prod", a, two)
    assert _followed(w, _node_env(w, f"file://{tmp_path}/./rc2"))["release"]["name"] == a
    assert _current(w) == (2, a)
