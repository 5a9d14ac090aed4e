"""Issue 35's figures: a follow of a release that has not moved against a cache hit, and the
follow that switches with the push-roots after it (docs/fleet.md, "A node that follows by itself").
Not a test and not one of the harness's benches: a pytest module, because its stores, its cache
and the documented nginx (tests/support/nginx.py: docs/fleet.md's configuration, with its
password file) are the tests' fixtures. Run from the checkout, with a regular install of the
command to measure (the hot path's figures are an interpreter's start: an editable install slows it):

    python3 -m venv /tmp/reg && /tmp/reg/bin/pip install -q .
    MEASURE_EXES=after=/tmp/reg/bin/llmgw-store MEASURE_ROUNDS=21 MEASURE_OUT=/tmp/follow.json \
        .venv/bin/python -m pytest bench/follow_figures.py -q -s -p no:cacheprovider

MEASURE_QUICK=1 is its quick mode (2 rounds, 2 switching follows, ROUNDS unless MEASURE_ROUNDS says
otherwise): tests/repo/test_bench.py runs it with the other benches' quick modes, so it keeps
working; a quick run's figures are not the record.

MEASURE_EXES: tag=path of each install to compare, comma-separated (`before=…,after=…`: two
checkouts, each side run on the same node store); the cache hit and the switching follow are run
with `after`'s. Each round runs every side once, in a fresh process, the order rotating; the
figures are medians of wall and CPU seconds (wait4's, the command and its waited children).
  hit                     `build RECIPE` of a recipe already built (the build memo's answer)
  follow-file-TAG         `activate svc` on a node whose config file follows `prod`, not moved, a file:// cache
  follow-nginx-TAG        the same from the documented nginx (one GET of releases/prod.json)
  switching-follow-nginx  a fresh copy of the node at A, prod moved to B: the follow that pulls B and switches
  push-roots-nginx        the push-roots after it (signed, PUT to nginx)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import real_uv, run_cli
from tests.support.delta import delta_wheels, template, world  # noqa: F401
from tests.support.follow import clean_env, node_config
from tests.support.nginx import AUTH, NODES, start_nginx  # noqa: F401

EXES = dict(x.split("=", 1) for x in os.environ.get(
    "MEASURE_EXES", f"after={Path(sys.executable).with_name('llmgw-store')}").split(","))
QUICK = os.environ.get("MEASURE_QUICK") == "1"
ROUNDS = int(os.environ.get("MEASURE_ROUNDS", "2" if QUICK else "15"))
SWITCH_ROUNDS = max(2 if QUICK else 5, ROUNDS // 2)
OUT = Path(os.environ.get("MEASURE_OUT", "follow-figures.json"))


def run_wait4(argv, env):
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        fd = os.open("/dev/null", os.O_WRONLY)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execve(argv[0], argv, env)
    _, status, ru = os.wait4(pid, 0)
    wall = time.monotonic() - t0
    return os.waitstatus_to_exitcode(status), wall, ru.ru_utime + ru.ru_stime


def summary(v):
    return {"wall_median": round(statistics.median(x[0] for x in v), 4),
            "cpu_median": round(statistics.median(x[1] for x in v), 4),
            "wall_min": round(min(x[0] for x in v), 4), "wall_max": round(max(x[0] for x in v), 4), "n": len(v)}


def test_follow_figures(world, template, start_nginx, tmp_path):  # noqa: F811  (fixtures)
    w, (a, b) = world, world["names"]
    after = EXES["after"]
    ngx = start_nginx()
    fcache = f"file://{tmp_path / 'cache'}"
    secret = str(w["keys"] / "builder-1.secret")
    run_cli(w["root"], "keygen", "node-1", "--out", str(w["keys"]), check=True)
    for cache, env in ((fcache, {}), (ngx.url, AUTH)):
        for name in (a, b):
            run_cli(w["root"], "push", name, "--to", cache, "--secret-key", secret, env=env, check=True)
        run_cli(w["root"], "release", "set", "prod", a, "--to", cache, "--secret-key", secret, env=env, check=True)
    nodes = {}
    xdg = str(tmp_path / "xdg")
    for label, cache, extra in (("file", fcache, {}),
                                ("nginx", ngx.url, {"LLMGW_STORE_CACHE_AUTH": f"node-1:{NODES['node-1']}"})):
        node = tmp_path / f"node-{label}"
        conf = node_config(tmp_path / f"node-{label}.toml", w["keys"], cache)
        env = clean_env(extra) | {"XDG_CACHE_HOME": xdg}
        args = ["--root", str(node), "--config", str(conf)]
        for exe in EXES.values():
            p = subprocess.run([exe, *args, "activate", "svc"], env=env, capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
        p = subprocess.run([after, *args, "activate", "svc"], env=env, capture_output=True, text=True)
        assert "already at" in p.stdout, (p.stdout, p.stderr)
        nodes[label] = (args, env, node, conf)
    hit_env = clean_env() | {"XDG_CACHE_HOME": xdg}
    hit = [after, "--root", str(w["root"]), "build", str(template["recipe"]), "--as-of", "2024-02-02",
           "--index-url", template["index"].url, "--uv", str(real_uv())]
    for _ in range(2):
        p = subprocess.run(hit, env=hit_env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip().endswith(a), (p.stdout, p.stderr)
    sides = {"hit": (hit, hit_env)}
    for label in ("file", "nginx"):
        args, env = nodes[label][:2]
        for tag, exe in EXES.items():
            sides[f"follow-{label}-{tag}"] = ([exe, *args, "activate", "svc"], env)
    imports = {}
    for label, (argv, env) in sides.items():
        py = str(Path(argv[0]).with_name("python"))
        p = subprocess.run([py, "-X", "importtime", *argv], env=env, capture_output=True, text=True)
        OUT.with_name(f"{OUT.stem}-importtime-{label}.txt").write_text(p.stderr)
        imports[label] = sum(1 for ln in p.stderr.splitlines() if ln.startswith("import time:"))
    for side in sides.values():  # warm-up
        run_wait4(*side)
    runs = {k: [] for k in sides}
    order = list(sides)
    for r in range(ROUNDS):
        rot = order[r % len(order):] + order[:r % len(order)]
        for k in rot:
            code, wall, cpu = run_wait4(*sides[k])
            assert code == 0, k
            runs[k].append((wall, cpu))
    res = {k: summary(v) for k, v in runs.items()}
    # The follow that switches, on nginx: a fresh copy of the node at `a` each round, prod moved to `b`
    # (untimed), then the follow (pull of b, switch) and push-roots, timed.
    args, env, node, conf = nodes["nginx"]
    template_node = tmp_path / "node-template"
    shutil.copytree(node, template_node, symlinks=True)
    switch_runs, push_runs = [], []
    for _ in range(SWITCH_ROUNDS):
        run_cli(w["root"], "release", "set", "prod", a, "--to", ngx.url, "--secret-key", secret, env=AUTH, check=True)
        shutil.rmtree(node)
        shutil.copytree(template_node, node, symlinks=True)
        p = subprocess.run([after, *args, "activate", "svc"], env=env, capture_output=True, text=True)
        assert "already at" in p.stdout, (p.stdout, p.stderr)
        run_cli(w["root"], "release", "set", "prod", b, "--to", ngx.url, "--secret-key", secret, env=AUTH, check=True)
        code, wall, cpu = run_wait4([after, *args, "activate", "svc"], env)
        assert code == 0
        switch_runs.append((wall, cpu))
        code, wall, cpu = run_wait4([after, *args, "push-roots"], env)
        assert code == 0
        push_runs.append((wall, cpu))
        p = subprocess.run([after, *args, "--json", "generations", "svc"], env=env, capture_output=True, text=True)
        gens = json.loads(p.stdout)["generations"]
        assert next(g["name"] for g in gens if g["current"]) == b
    res["switching-follow-nginx"] = summary(switch_runs)
    res["push-roots-nginx"] = summary(push_runs)
    OUT.write_text(json.dumps({"results": res, "imports": imports, "load": os.getloadavg(),
                               "exes": EXES, "rounds": ROUNDS, "switch_rounds": SWITCH_ROUNDS,
                               "quick": QUICK}, indent=1))
    print(json.dumps(res, indent=1))
