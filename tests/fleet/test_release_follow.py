"""A node converges on its releases without an operator (issue 35): `systemd-units --follow` writes
a follow service and timer that run `activate PROFILE` for each profile of the config file's
`releases` table, then push-roots; a held profile (`hold`) stays where it is until `unhold`.

Real parts: the builder and node stores of tests/support/delta.py, a file:// cache, the units'
ExecStart lines run as systemd would run them (each argv, in order), the index unreachable."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.conftest import cli_cmd, run_cli, run_in_env
from tests.support.barrier import Barrier
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)
from tests.support.follow import clean_env as _env
from tests.support.follow import exec_argvs, fleet_states, run_unit
from tests.support.follow import node_config as support_config

ANALYZE = shutil.which("systemd-analyze")


def node_config(w, cache: str, releases: str = 'svc = "prod"', node: bool = True) -> Path:
    return support_config(w["tmp"] / "node.toml", w["keys"], cache, releases, "node-1" if node else None)


def fleet(w, cache: str, prom: Path | None = None) -> dict[tuple[str, str], str]:
    return fleet_states(w["root"], w["keys"], cache, ["node-1"], prom)


def _push_set(w, name, cache, release="prod"):
    secret = str(w["keys"] / "builder-1.secret")
    run_cli(w["root"], "push", name, "--to", cache, "--secret-key", secret, check=True)
    return json.loads(run_cli(w["root"], "--json", "release", "set", release, name, "--to", cache, "--secret-key",
                              secret, check=True).stdout)


def _current(node: Path) -> str:
    gens = json.loads(run_cli(node, "--json", "generations", "svc", env=_env(), check=True).stdout)
    return next(g["name"] for g in gens["generations"] if g["current"])


def fleet(w, cache: str, prom: Path | None = None) -> dict[tuple[str, str], str]:
    """(node, profile) -> in_sync | out_of_date, as `fleet` shows it (and the textfile, when asked, agrees)."""
    args = ["fleet", "--from", cache, "--keep-from", str(w["keys"] / "node-1.public"), "--trusted-key",
            str(w["keys"] / "builder-1.public"), *(["--prometheus", str(prom)] if prom else [])]
    doc = json.loads(run_cli(w["root"], "--json", *args, env=_env(), check=True).stdout)
    states = {(n["node"], p): s for n in doc["nodes"] for p, s in n["state"].items()}
    if prom is not None:
        samples = {ln for ln in prom.read_text().splitlines() if ln.startswith("llmgw_store_fleet_node_out_of_date{")}
        assert samples == {f'llmgw_store_fleet_node_out_of_date{{node="{n}",profile="{p}",release="prod"}} '
                           f'{0 if s == "in_sync" else 1}' for (n, p), s in states.items()}, samples
    text = run_cli(w["root"], *args, env=_env(), check=True).stdout
    for (_, p), s in states.items():
        assert f"follows prod: {s}" in next(ln for ln in text.splitlines() if ln.startswith(f"  {p} -> ")), text
    return states


def test_the_follow_units_follow_the_config_files_releases(world, tmp_path):
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    run_cli(w["root"], "keygen", "node-1", "--out", str(w["keys"]), check=True)
    conf = node_config(w, cache, 'svc = "prod", web = "prod"')
    out = tmp_path / "units"
    doc = json.loads(run_cli(w["node"], "--config", str(conf), "--json", "systemd-units", "--out", str(out),
                             "--follow", "--follow-every", "2m", env=_env(), check=True).stdout)
    base = [cli_cmd(w["node"])[0], "--root", str(w["node"]), "--config", str(conf)]
    service, timer = out / "llmgw-store-follow.service", out / "llmgw-store-follow.timer"
    assert exec_argvs(service) == [[*base, "activate", "svc"], [*base, "activate", "web"], [*base, "push-roots"]]
    assert "OnUnitActiveSec=120s\n" in timer.read_text() and "OnBootSec=120s\n" in timer.read_text()
    assert (doc["follow_service"], doc["follow_every"], len(doc["follow"])) == (str(service), "120s", 3)
    # The gc units are written as before, beside them.
    assert exec_argvs(out / "llmgw-store-gc.service")[0] == [*base, "gc"]
    if ANALYZE:
        check = subprocess.run([ANALYZE, "verify", str(service), str(timer)], capture_output=True, text=True,
                               check=False)
        assert check.returncode == 0 and not check.stderr.strip(), check.stderr

    # The first run: both profiles at prod's key, the node's roots published.
    _push_set(w, a, cache)
    run_unit(service)
    assert _current(w["node"]) == a and run_in_env(w["node"] / "profiles" / "web", "tinyengine") == \
        "tinyengine 1.0 tinydep 1.0"
    published = json.loads((tmp_path / "cache" / "roots" / "node-1.json").read_text())
    assert published["profiles"] == {"svc": a[:32], "web": a[:32]}
    assert published["releases"] == {"svc": "prod", "web": "prod"}
    prom = tmp_path / "metrics" / "fleet.prom"
    prom.parent.mkdir()
    assert fleet(w, cache, prom) == {("node-1", "svc"): "in_sync", ("node-1", "web"): "in_sync"}
    # The builder moves prod: out of date until the next run follows it; a run with nothing moved switches nothing.
    _push_set(w, b, cache)
    assert fleet(w, cache, prom) == {("node-1", "svc"): "out_of_date", ("node-1", "web"): "out_of_date"}
    first = run_unit(service)[0]
    assert _current(w["node"]) == b and "generation 2" in first.stdout, first.stdout
    assert fleet(w, cache, prom) == {("node-1", "svc"): "in_sync", ("node-1", "web"): "in_sync"}
    again = run_unit(service)[0]
    assert "already at generation 2" in again.stdout, again.stdout


def test_follow_without_releases_is_exit_2_and_nothing_is_written(world, tmp_path):
    w = world
    cache = f"file://{tmp_path / 'cache'}"
    out = tmp_path / "units"
    for args in ((), ("--config", str(node_config(w, cache, releases="", node=False)))):
        proc = run_cli(w["node"], *args, "systemd-units", "--out", str(out), "--follow", env=_env())
        assert proc.returncode == 2 and "`releases` table" in proc.stderr, proc.stderr
        assert not out.exists()
    conf = node_config(w, cache, node=False)
    for every in ("0s", "soon", "30d"):
        proc = run_cli(w["node"], "--config", str(conf), "systemd-units", "--out", str(out), "--follow",
                       "--follow-every", every, env=_env())
        assert proc.returncode == 2 and "--follow-every" in proc.stderr, proc.stderr
        assert not out.exists()
    # Without [node], the follow runs no push-roots.
    run_cli(w["node"], "--config", str(conf), "systemd-units", "--out", str(out), "--follow", env=_env(), check=True)
    assert [argv[5:] for argv in exec_argvs(out / "llmgw-store-follow.service")] == [["activate", "svc"]]


def test_a_held_profile_ignores_its_release_until_released(world, tmp_path):
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    conf = node_config(w, cache, node=False)
    node = ("--config", str(conf))
    _push_set(w, a, cache)
    run_cli(w["node"], *node, "activate", "svc", env=_env(), check=True)
    assert _current(w["node"]) == a

    held = json.loads(run_cli(w["node"], "--json", "hold", "svc", env=_env(), check=True).stdout)
    assert (held["profile"], held["name"], held["key"], held["changed"]) == ("svc", a, a[:32], False)
    gens = json.loads(run_cli(w["node"], "--json", "generations", "svc", env=_env(), check=True).stdout)
    assert (gens["held"]["name"], gens["held"]["key"]) == (a, a[:32])
    text = run_cli(w["node"], "generations", "svc", env=_env(), check=True).stdout
    assert f"held at {a} since " in text, text

    # The builder moves prod; the held node says so in one line, exit 0, nothing read or switched.
    _push_set(w, b, cache)
    for args in (("activate", "svc"), ("activate", "svc", "--release", "prod")):
        proc = run_cli(w["node"], *node, *args, env=_env())
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines() == [proc.stdout.strip()] and \
            proc.stdout.startswith(f"svc: held at {a} since "), proc.stdout
    doc = json.loads(run_cli(w["node"], *node, "--json", "activate", "svc", env=_env(), check=True).stdout)
    assert (doc["held"], doc["changed"], doc["release"], doc["name"]) == (True, False, "prod", a)
    assert _current(w["node"]) == a
    # A hand activation still works; the hold keeps its path from gc.
    gc = json.loads(run_cli(w["node"], "--json", "gc", "--print-roots", env=_env(), check=True).stdout)
    assert any(r["kind"] == "hold" and r["profile"] == "svc" and r["paths"] == [a] for r in gc["roots"]), gc

    # Released: the next follow moves it to prod.
    gone = json.loads(run_cli(w["node"], "--json", "unhold", "svc", env=_env(), check=True).stdout)
    assert (gone["removed"], gone["name"]) == (True, a)
    assert "held at" not in run_cli(w["node"], "generations", "svc", env=_env(), check=True).stdout
    run_cli(w["node"], *node, "activate", "svc", env=_env(), check=True)
    assert _current(w["node"]) == b
    # Held at an earlier generation: it is activated, and stays there.
    moved = json.loads(run_cli(w["node"], "--json", "hold", "svc", "svc@1", env=_env(), check=True).stdout)
    assert (moved["name"], moved["changed"]) == (a, True) and _current(w["node"]) == a
    run_cli(w["node"], *node, "activate", "svc", env=_env(), check=True)
    assert _current(w["node"]) == a
    # Not held, not a profile: one line each.
    assert run_cli(w["node"], "hold", "nope", env=_env()).returncode != 0
    proc = run_cli(w["node"], "unhold", "web", env=_env())
    assert proc.returncode != 0 and "web is not held" in proc.stderr, proc.stderr


def test_a_hold_made_while_a_follow_runs_wins(world, tmp_path):
    """A follow checked for a hold (none), read the pointer and has the path; then, before it switches,
    the operator holds the profile. The follow must not switch it: the hold is checked again under
    the profile's lock, which `hold` takes too."""
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    conf = node_config(w, cache, node=False)
    _push_set(w, a, cache)
    run_cli(w["node"], "--config", str(conf), "activate", "svc", env=_env(), check=True)
    _push_set(w, b, cache)
    gate = Barrier(tmp_path)
    follow = subprocess.Popen(cli_cmd(w["node"], "--config", str(conf), "activate", "svc"),
                              env=_env(gate.env("RELEASE_BEFORE_SWITCH")), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    gate.reached("RELEASE_BEFORE_SWITCH", follow)
    run_cli(w["node"], "hold", "svc", env=_env(), check=True)
    gate.go("RELEASE_BEFORE_SWITCH")
    out, err = follow.communicate(timeout=300)
    assert follow.returncode == 0, err
    assert out.startswith(f"svc: held at {a} since "), (out, err)
    assert _current(w["node"]) == a


def test_fleet_shows_a_held_profile_as_held_not_out_of_date(world, tmp_path):
    """A hold is the operator's choice, not a lag: push-roots signs which profiles are held, and
    `fleet` says `held` (its textfile: out_of_date 0, held 1), then in_sync once unheld and followed."""
    w, (a, b) = world, world["names"]
    cache = f"file://{tmp_path / 'cache'}"
    run_cli(w["root"], "keygen", "node-1", "--out", str(w["keys"]), check=True)
    conf = ("--config", str(node_config(w, cache)))
    prom = tmp_path / "metrics" / "fleet.prom"
    prom.parent.mkdir(mode=0o755)
    _push_set(w, a, cache)
    run_cli(w["node"], *conf, "activate", "svc", env=_env(), check=True)
    run_cli(w["node"], "hold", "svc", env=_env(), check=True)
    _push_set(w, b, cache)
    run_cli(w["node"], *conf, "activate", "svc", env=_env(), check=True)  # held: stays at a
    run_cli(w["node"], *conf, "push-roots", env=_env(), check=True)
    assert fleet_states(w["root"], w["keys"], cache, ["node-1"], prom) == {("node-1", "svc"): "held"}
    assert 'llmgw_store_fleet_node_held{node="node-1",profile="svc",release="prod"} 1' in prom.read_text()

    run_cli(w["node"], "unhold", "svc", env=_env(), check=True)
    run_cli(w["node"], *conf, "push-roots", env=_env(), check=True)
    assert fleet_states(w["root"], w["keys"], cache, ["node-1"], prom) == {("node-1", "svc"): "out_of_date"}
    run_cli(w["node"], *conf, "activate", "svc", env=_env(), check=True)
    run_cli(w["node"], *conf, "push-roots", env=_env(), check=True)
    assert fleet_states(w["root"], w["keys"], cache, ["node-1"], prom) == {("node-1", "svc"): "in_sync"}
    assert 'llmgw_store_fleet_node_held{node="node-1",profile="svc",release="prod"} 0' in prom.read_text()
