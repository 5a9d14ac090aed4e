"""Issue 35, done when: on loopback, a builder publishes `prod` to the documented nginx; two nodes
configured only by their config files follow it with the index unreachable (the units
`systemd-units --follow` writes, each ExecStart run as systemd runs it); the builder moves the
release forward and back; a canary node follows `canary`; a replayed pointer is refused; and
`fleet` shows each node's state (in_sync / out_of_date) before and after the nodes follow.

Real parts: docs/fleet.md's nginx (tests/support/nginx.py), the builder's store of
tests/support/delta.py (the tiny engine with tinydep 1.0 and 2.0), three node stores, the CLI in
subprocesses; each node pushes its roots with its own credential."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import run_cli, run_in_env
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)
from tests.support.follow import clean_env, exec_argvs, fleet_states, follow_units, node_config, run_unit
from tests.support.nginx import AUTH, NGINX, NODES, start_nginx  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")

FOLLOWS = {"node-1": "prod", "node-2": "prod", "node-3": "canary"}


def test_a_fleet_follows_its_releases_through_the_documented_nginx(world, start_nginx, tmp_path):
    w, (a, b) = world, world["names"]
    ngx = start_nginx()
    keys, secret = w["keys"], str(w["keys"] / "builder-1.secret")

    def builder(*args: str):
        return run_cli(w["root"], *args, env=clean_env(AUTH), check=True)

    builder("push", a, b, "--to", ngx.url, "--secret-key", secret)
    builder("push", a, "--to", ngx.url, "--secret-key", secret, "--release", "prod")
    builder("release", "set", "canary", a, "--to", ngx.url, "--secret-key", secret)

    units = {}
    for node, release in FOLLOWS.items():
        run_cli(w["root"], "keygen", node, "--out", str(keys), check=True)
        root = tmp_path / node
        conf = node_config(tmp_path / f"{node}.toml", keys, ngx.url, f'svc = "{release}"', node)
        units[node] = (root, follow_units(root, conf, tmp_path / f"units-{node}"))

    def follow(*nodes: str) -> None:
        """One run of each node's follow service, with its own credential (its units' Environment=)."""
        for node in nodes:
            run_unit(units[node][1], {"LLMGW_STORE_CACHE_AUTH": f"{node}:{NODES[node]}"})

    def runs(node: str) -> str:
        return run_in_env(units[node][0] / "profiles" / "svc", "tinyengine")

    prom = tmp_path / "metrics" / "fleet.prom"
    prom.parent.mkdir()

    def fleet() -> dict[str, str]:
        return {n: s for (n, _), s in fleet_states(w["root"], keys, ngx.url, list(FOLLOWS), prom).items()}

    one, two = "tinyengine 1.0 tinydep 1.0", "tinyengine 1.0 tinydep 2.0"
    assert fleet() == {}  # no node has published yet
    follow(*FOLLOWS)
    assert [runs(n) for n in FOLLOWS] == [one, one, one]
    assert fleet() == dict.fromkeys(FOLLOWS, "in_sync")

    # The canary moves first: only the canary node is out of date, until it follows.
    builder("release", "set", "canary", b, "--to", ngx.url, "--secret-key", secret)
    assert fleet() == {"node-1": "in_sync", "node-2": "in_sync", "node-3": "out_of_date"}
    follow("node-3")
    assert runs("node-3") == two and fleet() == dict.fromkeys(FOLLOWS, "in_sync")

    # Forward: canary promoted to prod; both prod nodes out of date, then in sync.
    builder("release", "promote", "canary", "prod", "--to", ngx.url, "--secret-key", secret)
    forward = (ngx.files / "releases" / "prod.json").read_bytes()
    assert fleet() == {"node-1": "out_of_date", "node-2": "out_of_date", "node-3": "in_sync"}
    follow("node-1")
    assert fleet() == {"node-1": "in_sync", "node-2": "out_of_date", "node-3": "in_sync"}
    follow("node-2")
    assert [runs(n) for n in FOLLOWS] == [two, two, two] and fleet() == dict.fromkeys(FOLLOWS, "in_sync")

    # Back: prod set to a again (a newer pointer to an older key), followed from the nodes' own stores.
    builder("release", "set", "prod", a, "--to", ngx.url, "--secret-key", secret)
    assert fleet() == {"node-1": "out_of_date", "node-2": "out_of_date", "node-3": "in_sync"}
    follow("node-1", "node-2")
    assert [runs(n) for n in FOLLOWS] == [one, one, two] and fleet() == dict.fromkeys(FOLLOWS, "in_sync")

    # A replay: the forward pointer's genuine bytes put back. The node refuses it and stays; the
    # builder's fleet view shows the pointer refused (it wrote a newer one), so its nodes' state unknown.
    (ngx.files / "releases" / "prod.json").write_bytes(forward)
    first = exec_argvs(units["node-1"][1])[0]
    proc = subprocess.run(first, capture_output=True, text=True, check=False, env=clean_env(), timeout=300)
    assert proc.returncode == 65 and "replayed" in proc.stderr and "refusing it" in proc.stderr, proc.stderr
    assert runs("node-1") == one
    assert fleet() == {"node-1": "unknown", "node-2": "unknown", "node-3": "in_sync"}
    doc = json.loads(builder("--json", "fleet", "--from", ngx.url, "--keep-from", str(keys),
                             "--trusted-key", str(keys / "builder-1.public")).stdout)
    prod = next(r for r in doc["releases"] if r["release"] == "prod")
    assert "older than" in prod["refused"], prod
    assert 'release="prod"} 1' in prom.read_text()
