"""A real web server as the binary cache: docs/fleet.md's nginx configuration, started as written
(only its paths and port replaced), and a fleet that pushes, pulls, delta-pulls and collects through
it; writes with the builder's credential, a node's own roots document with that node's, reads
open. Skipped where nginx is not installed (`.ci/run` installs Debian's)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import run_cli, run_in_env
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)
from tests.support.nginx import AUTH, NODES, PASSWORD, needs_nginx, start_nginx  # noqa: F401  (fixture)

pytestmark = needs_nginx


def push(w, name, url, env=None, check=True):
    proc = run_cli(w["root"], "--json", "push", name, "--to", url, "--secret-key", str(w["keys"] / "builder-1.secret"),
                   env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    return proc


def pull(w, name, url, node=None):
    proc = run_cli(node or w["node"], "--json", "pull", name, "--from", url, "--trusted-key",
                   str(w["keys"] / "builder-1.public"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_fleet_pushes_pulls_and_collects_through_the_documented_nginx(world, start_nginx):
    w, (a, b) = world, world["names"]
    ngx = start_nginx()
    first = push(w, a, ngx.url, env=AUTH)
    assert first["pushed"] == [a] and first["blobs_uploaded"] > 0
    assert max(p.stat().st_size for p in (ngx.files / "blobs").iterdir()) > 1 << 20  # past nginx's default 1m
    push(w, b, ngx.url, env=AUTH)
    got = pull(w, a, ngx.url)  # no credential: reads are open
    assert got["pulled"] == [a]
    assert run_in_env(w["node"] / "store" / a, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    delta = pull(w, b, ngx.url)
    assert delta["pulled"] == [b] and delta["bytes_reused"] >= 1 << 20
    assert delta["bytes_fetched"] < 0.25 * json.loads((ngx.files / f"{b[:32]}.json").read_text())["blobs_csize"]
    assert run_cli(w["node"], "verify").returncode == 0

    # A push of an object already there renews it: nginx rewrites the file.
    meta = ngx.files / f"{a[:32]}.json"
    old = time.time() - 3 * 86400
    os.utime(meta, (old, old))
    assert push(w, a, ngx.url, env=AUTH)["already_there"] == [a] and meta.stat().st_mtime > old + 86400

    # cache gc through nginx: the builder's roots hold a; b goes (listing, DELETE), a stays.
    run_cli(w["root"], "keygen", "node-1", "--out", str(w["keys"]), check=True)
    run_cli(w["root"], "activate", "app", a, check=True)
    run_cli(w["root"], "push-roots", "--to", ngx.url, "--secret-key", str(w["keys"] / "node-1.secret"), env=AUTH,
            check=True)
    gc = run_cli(w["root"], "--json", "cache", "gc", ngx.url, "--keep-from", str(w["keys"] / "node-1.public"),
                 "--grace", "0s", env=AUTH)
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["deleted_objects"] == [f"{b[:32]}.json"]
    assert not (ngx.files / f"{b[:32]}.json").exists() and meta.exists()
    again = pull(w, a, ngx.url, node=w["tmp"] / "node2")
    assert again["pulled"] == [a]


def test_writes_need_the_builders_credential_and_reads_do_not(world, start_nginx, tmp_path):
    w, a = world, world["names"][0]
    ngx = start_nginx()
    anonymous = push(w, a, ngx.url, check=False)
    assert anonymous.returncode == 1 and "HTTP 401 (the cache wants credentials for writes" in anonymous.stderr
    wrong = push(w, a, ngx.url, env={"LLMGW_STORE_CACHE_AUTH": "builder-1:guess"}, check=False)
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr and "guess" not in wrong.stderr
    assert not any((ngx.files).iterdir())  # nothing was written
    # a netrc entry for the host works too; one others can read is refused
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine {ngx.host} login builder-1 password {PASSWORD}\n")
    netrc.chmod(0o644)
    loose = push(w, a, ngx.url, env={"NETRC": str(netrc)}, check=False)
    assert loose.returncode == 2 and "must be owned by this user and private to it (chmod 600)" in loose.stderr
    netrc.chmod(0o600)
    assert push(w, a, ngx.url, env={"NETRC": str(netrc)})["pushed"] == [a]
    assert pull(w, a, ngx.url)["pulled"] == [a]
    gc = run_cli(w["root"], "cache", "gc", ngx.url, "--keep-from", str(w["keys"] / "builder-1.public"),
                 "--allow-no-roots")
    assert gc.returncode == 1 and "HTTP 401" in gc.stderr  # a gc writes its marker first: refused, nothing deleted
    assert (ngx.files / f"{a[:32]}.json").exists()


@pytest.mark.parametrize("line, answer", [
    ("client_max_body_size 0;", "HTTP 413 (the server refuses a body this large: nginx needs client_max_body_size 0)"),
    ("create_full_put_path on;", "HTTP 500 (nginx answers this to a write without create_full_put_path on)"),
])
def test_the_documented_settings_are_the_ones_a_push_needs(world, start_nginx, line, answer):
    """Without either line the documented server refuses pushes (the old docs lacked both)."""
    w, a = world, world["names"][0]
    ngx = start_nginx(edit=lambda conf: conf.replace(line, ""))
    proc = push(w, a, ngx.url, env={**AUTH, "LLMGW_STORE_CACHE_ATTEMPTS": "2"}, check=False)
    assert proc.returncode == 1 and answer in proc.stderr.splitlines()[-1], proc.stderr
    ok = start_nginx()
    assert push(w, a, ok.url, env=AUTH)["pushed"] == [a]


def _http(ngx, method: str, name: str, user: str | None = None, password: str | None = None,
          body: bytes = b"{}") -> int:
    """The status the documented nginx answers `method` on the cache object `name` with, as `user`."""
    import base64
    import http.client

    host, port = ngx.url.split("//")[1].split("/")[0].split(":")
    headers = {"Content-Length": str(len(body))} if method == "PUT" else {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, f"/llmgw/{name}", body=body if method == "PUT" else None, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_a_node_writes_its_own_roots_and_nothing_else(world, start_nginx):
    """docs/fleet.md's nginx as a fleet runs it: each node's push-roots works with its own
    credential, which can write no other node's roots, no object or blob, and delete nothing; the
    builder's can do all of it. A normal miss (404) writes no [error] line to nginx's log."""
    w, a = world, world["names"][0]
    ngx = start_nginx()
    push(w, a, ngx.url, env=AUTH)
    for node in NODES:
        run_cli(w["root"], "keygen", node, "--out", str(w["keys"]), check=True)
    run_cli(w["root"], "activate", "app", a, check=True)

    def push_roots(node: str, user: str, password: str):
        return run_cli(w["root"], "push-roots", "--to", ngx.url, "--secret-key", str(w["keys"] / f"{node}.secret"),
                       env={"LLMGW_STORE_CACHE_AUTH": f"{user}:{password}", "LLMGW_STORE_CACHE_ATTEMPTS": "1"})

    own = push_roots("node-1", "node-1", NODES["node-1"])
    assert own.returncode == 0, own.stderr
    assert json.loads((ngx.files / "roots" / "node-1.json").read_text())["node"] == "node-1"
    other = push_roots("node-2", "node-1", NODES["node-1"])  # node-1's credential, node-2's document
    assert other.returncode == 1 and "HTTP 403" in other.stderr, other.stderr
    assert not (ngx.files / "roots" / "node-2.json").exists()
    assert push_roots("node-2", "node-2", NODES["node-2"]).returncode == 0

    node = ("node-1", NODES["node-1"])
    meta = f"{a[:32]}.json"
    blob = next((ngx.files / "blobs").iterdir()).name
    before = {p: p.read_bytes() for p in ngx.files.rglob("*") if p.is_file()}
    assert _http(ngx, "PUT", "roots/node-2.json", *node) == 403
    assert _http(ngx, "PUT", f"blobs/{blob}", *node) == 403
    assert _http(ngx, "PUT", meta, *node) == 403
    assert _http(ngx, "PUT", f"gc/{'0' * 16}.json", *node) == 403
    for name in ("roots/node-1.json", "roots/node-2.json", meta, f"blobs/{blob}"):
        assert _http(ngx, "DELETE", name, *node) == 403
    assert _http(ngx, "PUT", "roots/node-1.json", "node-1", "guess") == 401  # the claim is checked
    assert _http(ngx, "PUT", "roots/node-1.json") == 401
    assert _http(ngx, "PUT", "roots/builder-1.json", "builder-1", NODES["node-1"]) == 401
    assert {p: p.read_bytes() for p in ngx.files.rglob("*") if p.is_file()} == before  # nothing written

    builder = ("builder-1", PASSWORD)
    assert _http(ngx, "PUT", "roots/node-2.json", *builder) in (201, 204)
    assert _http(ngx, "DELETE", "roots/node-2.json", *builder) == 204
    assert not (ngx.files / "roots" / "node-2.json").exists()
    logged = ngx.error_log.read_text()
    assert "password mismatch" in logged  # the log is written (the 401s above)
    assert _http(ngx, "GET", "absent.json") == 404 and _http(ngx, "HEAD", f"blobs/{'f' * 64}") == 404
    assert _http(ngx, "GET", f"{'a' * 32}.tar.zst") == 404
    assert ngx.error_log.read_text() == logged


def test_a_pull_outlasts_a_restart_of_nginx_with_the_defaults(world, start_nginx, tmp_path):
    """The real nginx stopped once the pull has its metadata and before its first blob, and started
    again only after a request has waited 10 s for it: the pull, with no setting of its own,
    completes (it used to give up after five attempts within at most 7.5 s)."""
    from tests.conftest import cli_cmd
    from tests.support.barrier import Barrier
    from tests.support.retrylog import waits_until

    w, a = world, world["names"][0]
    ngx = start_nginx()
    push(w, a, ngx.url, env=AUTH)
    gate = Barrier(tmp_path)
    proc = subprocess.Popen(cli_cmd(w["node"], "--json", "pull", a, "--from", ngx.url, "--trusted-key",
                                    str(w["keys"] / "builder-1.public")),
                            env={**os.environ, **gate.env("PULL_PAUSE")}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PULL_PAUSE", proc)
        ngx.stop()
        gate.go("PULL_PAUSE")
        seen = waits_until(proc, 10.0, ngx.url)
        ngx.restart()
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(seen) + err
    assert json.loads(out)["pulled"] == [a]
    assert any("Connection refused" in ln for ln in seen), seen
    assert run_in_env(w["node"] / "store" / a, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
