"""Binary caches over networks that fail: retries, stalls, resumed reads, fallback across caches,
redirects, and pulls killed at every point (real processes, held at debug points by barriers).

The caches here are tests/support/fault_server.py's FaultyCache: real HTTP on 127.0.0.1, serving
what a `file://` push wrote, with faults injected into chosen requests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess

import pytest

from tests.cache.test_fleet_delta import _plan
from tests.conftest import cli_cmd, run_cli, run_in_env
from tests.support.barrier import Barrier
from tests.support.delta import delta_wheels, push2, template, world  # noqa: F401  (fixtures)
from tests.support.fault_server import FaultyCache
from tests.support.retrylog import waits_until

# Small clocks, so that a test waits seconds, not minutes: the defaults are a 30 s stall and a 5 s
# metadata timeout (and retries for 30 s without progress, no count).
FAST = {"LLMGW_STORE_CACHE_STALL": "2", "LLMGW_STORE_CACHE_METADATA_TIMEOUT": "2"}


@pytest.fixture
def pushed(world, tmp_path):
    """The first environment pushed (format 2) into the directory tmp_path/cache."""
    push2(world, world["names"][0], f"file://{tmp_path / 'cache'}")
    return world


@pytest.fixture
def servers():
    made: list[FaultyCache] = []

    def serve(root, **kw) -> FaultyCache:
        made.append(FaultyCache(root, **kw))
        return made[-1]

    yield serve
    for srv in made:
        srv.stop()


def pull(w, target, *caches, env=None, check=True):
    froms = [arg for c in caches for arg in ("--from", c)]
    proc = run_cli(w["node"], "--json", "pull", target, *froms, "--trusted-key", str(w["keys"] / "builder-1.public"),
                   env={**FAST, **(env or {})})
    if check:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), proc.stderr
    return proc


def assert_pulled_whole(w, name):
    assert run_in_env(w["node"] / "store" / name, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    assert run_cli(w["node"], "verify").returncode == 0


def meta_of(tmp_path, name):
    return json.loads((tmp_path / "cache" / f"{name[:32]}.json").read_text())


# --- retries: every fault a network makes, and a mix of them -----------------------------------

@pytest.mark.parametrize("fault", ["503", "500", "drop", "reset", "truncate", "stall", "drip", "redirect"])
def test_a_pull_gets_past_each_kind_of_failure(pushed, tmp_path, servers, fault):
    """The first three blob requests fail this way; the pull retries them (a read cut short is
    resumed where it stopped, with a Range request) and completes, every byte checked."""
    a = pushed["names"][0]
    srv = servers(tmp_path / "cache", rules=[(r"/cache/blobs/", fault, 3)], drip_s=0.3)
    got, err = pull(pushed, a, srv.url)
    assert got["pulled"] == [a] and srv.counts == {fault: 3}
    assert "trying again" in err or fault == "redirect"
    if fault in ("reset", "truncate"):
        assert srv.ranged >= 1  # resumed, not started over
    assert_pulled_whole(pushed, a)


def test_a_pull_through_random_failures_completes(pushed, tmp_path, servers):
    """A third of all requests fail (503, 500, drops, resets, cut bodies), metadata included. Ten
    attempts at most (the default has no count): with five, one of the ~100 requests fails five times
    in a row about once in three runs ((1/3)^5 per request; which request draws which fault depends on
    the threads' order)."""
    a = pushed["names"][0]
    srv = servers(tmp_path / "cache", rate=0.33, faults=("503", "500", "drop", "reset", "truncate"), seed=7)
    got, _ = pull(pushed, a, srv.url, env={"LLMGW_STORE_CACHE_ATTEMPTS": "10"})
    assert got["pulled"] == [a] and sum(srv.counts.values()) >= 3, srv.counts
    assert_pulled_whole(pushed, a)


def test_a_cache_that_keeps_failing_fails_the_pull_after_its_attempts(pushed, tmp_path, servers):
    a = pushed["names"][0]
    srv = servers(tmp_path / "cache", rules=[(r"/cache/blobs/", "503")])
    proc = pull(pushed, a, srv.url, env={"LLMGW_STORE_CACHE_ATTEMPTS": "3"}, check=False)
    assert proc.returncode == 1 and "HTTP 503 (gave up after 3 attempts)" in proc.stderr.splitlines()[-1]
    assert not (pushed["node"] / "store" / a).exists()


def test_a_pull_waits_out_a_ten_second_cache_restart_with_the_defaults(pushed, tmp_path, servers):
    """The cache goes down in the middle of a blob (the body cut by a reset, then every connection
    refused) and comes back only once a request has waited 10 s for it: the pull, with no setting
    of its own, resumes and completes. (Five attempts with waits of up to 0.5, 1, 2, 4 s gave up
    within 7.5 s.)"""
    a = pushed["names"][0]
    srv = servers(tmp_path / "cache", rules=[(r"/cache/blobs/", "down", 1)])
    proc = subprocess.Popen(cli_cmd(pushed["node"], "--json", "pull", a, "--from", srv.url, "--trusted-key",
                                    str(pushed["keys"] / "builder-1.public")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = waits_until(proc, 10.0, srv.url)
        assert srv.went_down.is_set()
        srv.come_back()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(seen) + err
    assert json.loads(out)["pulled"] == [a] and srv.counts == {"down": 1}
    assert any("refused" in ln.lower() for ln in seen), seen
    assert_pulled_whole(pushed, a)


def test_a_cache_down_longer_than_retry_for_fails_the_pull_saying_so(pushed, tmp_path, servers):
    a = pushed["names"][0]
    srv = servers(tmp_path / "cache", rules=[(r"/cache/blobs/", "down", 1)])
    proc = pull(pushed, a, srv.url, env={"LLMGW_STORE_CACHE_RETRY_FOR": "2"}, check=False)
    assert proc.returncode == 1 and srv.went_down.is_set()
    assert "2s without progress, its retry_for)" in proc.stderr.splitlines()[-1], proc.stderr
    assert not (pushed["node"] / "store" / a).exists()


# --- stalls: a cache that drips is passed over within its time -----------------------------------

def test_a_dripping_metadata_cache_is_passed_over_for_the_next(pushed, tmp_path, servers):
    a = pushed["names"][0]
    slow = servers(tmp_path / "cache", rules=[(r"\.json$", "drip")], drip_s=0.5)
    good = servers(tmp_path / "cache")
    got, err = pull(pushed, a, slow.url, good.url)
    assert got["pulled"] == [a]
    line = next(ln for ln in err.splitlines() if slow.url in ln)
    assert "not received whole within 2s (the metadata timeout)" in line and line.endswith("passing it over")
    assert_pulled_whole(pushed, a)


def test_build_passes_a_dripping_cache_over_and_substitutes_from_the_next(pushed, tmp_path, servers, template,
                                                                          uv_bin):
    a = pushed["names"][0]
    slow = servers(tmp_path / "cache", rules=[(r"\.json$", "drip")], drip_s=0.5)
    good = servers(tmp_path / "cache")
    proc = run_cli(pushed["node"], "--json", "build", str(template["recipe"]), "--as-of", "2024-02-02", "--index-url",
                   template["index"].url, "--uv", str(uv_bin), "--substituter", slow.url, "--substituter", good.url,
                   "--trusted-key", str(pushed["keys"] / "builder-1.public"), env=FAST)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["how"] == "substituted" and doc["path"].endswith(a)
    assert any(slow.url in ln and "passing it over" in ln for ln in proc.stderr.splitlines())


def test_build_tries_every_cache_before_building_locally(pushed, tmp_path, servers, template, uv_bin):
    """The first cache is down, the second answers 503 to everything: both are passed over (one
    line each), then the build goes on locally."""
    a = pushed["names"][0]
    failing = servers(tmp_path / "cache", rules=[(r".", "503")])
    down = "http://127.0.0.1:9/cache"  # the discard port: nothing listens
    proc = run_cli(pushed["node"], "--json", "build", str(template["recipe"]), "--as-of", "2024-02-02",
                   "--index-url", template["index"].url, "--uv", str(uv_bin), "--substituter", down,
                   "--substituter", failing.url, "--trusted-key", str(pushed["keys"] / "builder-1.public"),
                   env={**FAST, "LLMGW_STORE_CACHE_ATTEMPTS": "2"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["how"] == "built"
    passed = [ln for ln in proc.stderr.splitlines() if ln.endswith("passing it over")]
    assert len(passed) == 2 and down in passed[0] and failing.url in passed[1] and "HTTP 503" in passed[1], passed
    assert (pushed["node"] / "store" / a).is_dir()


def test_build_takes_the_cache_settings_from_the_config_file_and_the_flag_wins(pushed, tmp_path, servers, template,
                                                                              uv_bin):
    """`[cache] attempts = 1` in the config file: one 503 on a blob passes the only cache over, and
    a substitute-only build fails naming the key; `--cache-attempts 3` retries it and substitutes."""
    a = pushed["names"][0]
    conf = tmp_path / "config.toml"
    conf.write_text("[cache]\nattempts = 1\n")
    conf.chmod(0o644)
    env = {**FAST, "LLMGW_STORE_CONFIG": str(conf)}
    args = ["--json", "build", str(template["recipe"]), "--as-of", "2024-02-02", "--index-url", template["index"].url,
            "--uv", str(uv_bin), "--trusted-key", str(pushed["keys"] / "builder-1.public"), "--substitute-only"]
    once = servers(tmp_path / "cache", rules=[(r"/cache/blobs/", "503", 1)])
    proc = run_cli(pushed["node"], *args, "--substituter", once.url, env=env)
    assert proc.returncode == 69 and a[:32] in proc.stderr.splitlines()[-1], proc.stderr
    assert once.counts == {"503": 1} and not (pushed["node"] / "store" / a).exists()
    again = servers(tmp_path / "cache", rules=[(r"/cache/blobs/", "503", 1)])
    proc = run_cli(pushed["node"], *args, "--substituter", again.url, "--cache-attempts", "3", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["how"] == "substituted" and again.counts == {"503": 1}


# --- fallback: a second cache serves what the first lacks ----------------------------------------

def test_a_blob_the_first_cache_lacks_comes_from_the_second(pushed, tmp_path):
    a = pushed["names"][0]
    second = tmp_path / "second"
    shutil.copytree(tmp_path / "cache", second)
    plan = _plan(pushed, meta_of(tmp_path, a))
    lost = max(plan["blobs"], key=lambda b: b["c"])["d"]
    (tmp_path / "cache" / "blobs" / lost).unlink()
    got, _ = pull(pushed, a, f"file://{tmp_path / 'cache'}", f"file://{second}")
    assert got["pulled"] == [a]
    assert_pulled_whole(pushed, a)


def test_a_blob_that_fails_its_digest_in_the_first_cache_comes_from_the_second(pushed, tmp_path):
    import zstandard

    a = pushed["names"][0]
    second = tmp_path / "second"
    shutil.copytree(tmp_path / "cache", second)
    plan = _plan(pushed, meta_of(tmp_path, a))
    big = max(plan["blobs"], key=lambda b: b["c"])["d"]
    p = tmp_path / "cache" / "blobs" / big
    raw = bytearray(zstandard.ZstdDecompressor().decompress(p.read_bytes()))
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(zstandard.ZstdCompressor().compress(bytes(raw)))
    got, err = pull(pushed, a, f"file://{tmp_path / 'cache'}", f"file://{second}")
    assert got["pulled"] == [a]
    line = next(ln for ln in err.splitlines() if "passing it over" in ln)
    assert f"cache file://{tmp_path / 'cache'}: " in line and "refusing it" in line
    assert_pulled_whole(pushed, a)
    # the positive control: that cache alone is refused, and nothing is left behind
    node2 = tmp_path / "node2"
    proc = run_cli(node2, "pull", a, "--from", f"file://{tmp_path / 'cache'}", "--trusted-key",
                   str(pushed["keys"] / "builder-1.public"))
    assert proc.returncode == 1 and "refusing it" in proc.stderr
    assert list((node2 / "store").iterdir()) == [] and list((node2 / "var" / "tmp").iterdir()) == []


# --- resuming: what a failed pull fetched and checked is not fetched again -----------------------

def test_a_pull_that_failed_on_the_network_resumes_from_what_it_fetched(pushed, tmp_path, servers):
    a = pushed["names"][0]
    meta = meta_of(tmp_path, a)
    big = max(_plan(pushed, meta)["blobs"], key=lambda b: b["c"])
    srv = servers(tmp_path / "cache", rules=[(rf"/blobs/{big['d']}$", "500")])
    proc = pull(pushed, a, srv.url, env={"LLMGW_STORE_CACHE_ATTEMPTS": "2"}, check=False)
    assert proc.returncode == 1 and "HTTP 500" in proc.stderr
    kept = pushed["node"] / "var" / "tmp" / f"resume-{a[:32]}"
    assert kept.is_dir() and not (pushed["node"] / "store" / a).exists()
    good = servers(tmp_path / "cache")
    got, err = pull(pushed, a, good.url)
    assert got["pulled"] == [a] and got["bytes_resumed"] > 0 and "resuming" in err
    fetched_blobs = [p for m, p in good.requests if m == "GET" and "/blobs/" in p]
    assert f"/cache/blobs/{big['d']}" in fetched_blobs and len(fetched_blobs) < len(_plan(pushed, meta)["blobs"]) + 3
    assert not kept.exists()
    assert_pulled_whole(pushed, a)


def test_a_resumed_file_that_was_changed_is_fetched_again(pushed, tmp_path, servers):
    a = pushed["names"][0]
    meta = meta_of(tmp_path, a)
    big = max(_plan(pushed, meta)["blobs"], key=lambda b: b["c"])
    srv = servers(tmp_path / "cache", rules=[(rf"/blobs/{big['d']}$", "500")])
    pull(pushed, a, srv.url, env={"LLMGW_STORE_CACHE_ATTEMPTS": "2"}, check=False)
    kept = pushed["node"] / "var" / "tmp" / f"resume-{a[:32]}"
    victims = [p for p in kept.rglob("*.py") if p.is_file()]
    assert victims
    for v in victims:
        v.chmod(0o644)
        v.write_text("import os; os.system('echo owned')\n")
        v.chmod(0o444)
    good = servers(tmp_path / "cache")
    got, err = pull(pushed, a, good.url)
    assert got["pulled"] == [a] and "resuming" in err
    assert_pulled_whole(pushed, a)  # the changed files were fetched again, not taken


# --- redirects -----------------------------------------------------------------------------------

def test_a_redirect_to_another_host_is_refused_unless_allowed(pushed, tmp_path, servers):
    a = pushed["names"][0]
    elsewhere = servers(tmp_path / "cache")
    srv = servers(tmp_path / "cache", rules=[(r"/cache/", "offsite")], offsite=elsewhere.url)
    proc = pull(pushed, a, srv.url, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"redirected to {elsewhere.origin}, not this cache's scheme and host; refusing it" in proc.stderr
    assert elsewhere.requests == []
    got, _ = pull(pushed, a, srv.url, env={"LLMGW_STORE_CACHE_REDIRECTS_TO": elsewhere.origin})
    assert got["pulled"] == [a] and elsewhere.requests
    assert_pulled_whole(pushed, a)


# --- a pull killed at every point leaves nothing that blocks the next ---------------------------

POINTS = ["PULL_BLOB_WRITTEN", "INSTALL_BEFORE_RENAME", "INSTALL_BEFORE_REGISTER", "INSTALL_AFTER_REGISTER"]


@pytest.mark.parametrize("then", ["pull", "build"])
@pytest.mark.parametrize("point", POINTS)
def test_a_pull_killed_at_any_point_blocks_no_later_pull_or_build(world, tmp_path, point, then, template, uv_bin):
    w, a = world, world["names"][0]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    gate = Barrier(tmp_path)
    victim = subprocess.Popen(cli_cmd(w["node"], "pull", a, "--from", url, "--trusted-key",
                                      str(w["keys"] / "builder-1.public")),
                              env={**os.environ, **gate.env(point)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        gate.reached(point, victim)
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.communicate()
    if point == "INSTALL_BEFORE_REGISTER":  # the window: renamed into store/, not registered
        assert (w["node"] / "store" / a).is_dir()
        con = sqlite3.connect(w["node"] / "var" / "db.sqlite")
        assert con.execute("SELECT count(*) FROM paths WHERE name = ?", (a,)).fetchone() == (0,)
    if then == "pull":
        got, _ = pull(w, a, url)
        assert (got["pulled"] + got["already_present"]) == [a]
    else:
        proc = run_cli(w["node"], "--json", "build", str(template["recipe"]), "--as-of", "2024-02-02",
                       "--index-url", template["index"].url, "--uv", str(uv_bin), "--substituter", url,
                       "--trusted-key", str(w["keys"] / "builder-1.public"))
        assert proc.returncode == 0, proc.stderr
        how = json.loads(proc.stdout)["how"]
        expected = {"INSTALL_BEFORE_REGISTER": "recovered", "INSTALL_AFTER_REGISTER": "hit"}.get(point, "substituted")
        assert how == expected
    assert_pulled_whole(w, a)
    if then == "build":  # a build that found the path (hit, recovered) fetched nothing: gc sweeps
        run_cli(w["node"], "gc", check=True)
    assert not [p for p in (w["node"] / "var" / "tmp").iterdir() if p.name.startswith("pull-")]


def test_a_complete_unregistered_tree_in_the_store_does_not_block_the_next_pull(world, tmp_path):
    """The state a kill between rename and registration leaves (made here without a kill): the
    next pull registers the tree in place instead of failing with `Directory not empty`."""
    w, a = world, world["names"][0]
    url = f"file://{tmp_path / 'cache'}"
    push2(w, a, url)
    pull(w, a, url)
    con = sqlite3.connect(w["node"] / "var" / "db.sqlite")
    with con:
        con.execute("DELETE FROM refs WHERE referrer = ?", (a,))
        con.execute("DELETE FROM paths WHERE name = ?", (a,))
    con.close()
    got, err = pull(w, a, url)
    assert got["already_present"] == [a] and "registered it again from its manifest" in err
    assert_pulled_whole(w, a)


@pytest.mark.parametrize("point", ["INSTALL_BEFORE_RENAME", "INSTALL_BEFORE_REGISTER"])
def test_a_format_1_pull_killed_at_its_install_blocks_no_later_pull(world, tmp_path, point):
    w, a = world, world["names"][0]
    url = f"file://{tmp_path / 'cache'}"
    run_cli(w["root"], "push", a, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"), "--format", "1",
            check=True)
    gate = Barrier(tmp_path)
    victim = subprocess.Popen(cli_cmd(w["node"], "pull", a, "--from", url, "--trusted-key",
                                      str(w["keys"] / "builder-1.public")),
                              env={**os.environ, **gate.env(point)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        gate.reached(point, victim)
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.communicate()
    got, _ = pull(w, a, url)
    assert (got["pulled"] + got["already_present"]) == [a]
    assert_pulled_whole(w, a)


def test_a_cache_is_reached_through_the_proxy_the_environment_names(pushed, tmp_path, servers):
    """The one proxy rule (docs/operations.md, "HTTP: one stack ..."): http_proxy leads a cache's
    every request through the proxy, no_proxy naming the cache's host leads them past it."""
    from tests.support.proxy import ForwardProxy

    name = pushed["names"][0]
    srv = servers(tmp_path / "cache")
    through = {"http_proxy": "", "HTTP_PROXY": "", "no_proxy": "", "NO_PROXY": "", "all_proxy": "", "ALL_PROXY": ""}
    with ForwardProxy() as proxy:
        got, _ = pull(pushed, name, srv.url, env={**through, "http_proxy": proxy.url})
        assert got["pulled"] == [name]
        assert proxy.seen and all(u.startswith(f"{srv.url}/") for u in proxy.seen), proxy.seen
        assert f"{srv.url}/{name[:32]}.json" in proxy.seen
        carried = len(proxy.seen)
        past = run_cli(tmp_path / "node-2", "--json", "pull", name, "--from", srv.url, "--trusted-key",
                       str(pushed["keys"] / "builder-1.public"),
                       env={**FAST, **through, "http_proxy": proxy.url, "no_proxy": "127.0.0.1"})
        assert past.returncode == 0, past.stderr
        assert len(proxy.seen) == carried  # asked directly
    assert_pulled_whole(pushed, name)


def test_an_upload_that_moves_is_not_abandoned_however_long_it_takes(tmp_path, servers):
    """A PUT longer than the stall time, whose every block is taken in time, is a transfer that
    moves: its answer is waited for a stall time after the last block, not after the request's
    start. The cache reads 48 MiB at 8 MiB/s through a small receive buffer (about 6 s) against a
    3 s stall, with one attempt."""
    from llmgw_store.cache.backends.http import HttpBackend
    from llmgw_store.cache.backends.retry import RetryPolicy

    srv = servers(tmp_path / "cache", read_pace_s=0.125)
    backend = HttpBackend(srv.url, RetryPolicy(stall=3, attempts=1))
    data = os.urandom(48 << 20)
    name = "blobs/" + "ab" * 32
    backend.put(name, data)
    assert (tmp_path / "cache" / name).read_bytes() == data
