"""Metrics an alert can use: `stats --prometheus` holds when gc, verify, build and pull last
succeeded, how often they failed (a verify that finds damage counts), and each profile's current
generation with what it runs; outcomes counted by real processes finishing at once all count."""

from __future__ import annotations

import json
import multiprocessing
import re
import time
from pathlib import Path

import pytest

from llmgw_store.core import oplog
from tests.conftest import build_store, copy_store, run_cli, write_recipe
from tests.support.fleet import fleet  # noqa: F401  (fixture)

SAMPLE = re.compile(r'([a-z_]+)\{((?:[a-z_]+="(?:[^"\\\n]|\\.)*",?)*)\} (-?[0-9]+(?:\.[0-9]+)?)')


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """The samples of a textfile, every line checked against the exposition format."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            continue
        m = SAMPLE.fullmatch(line)
        assert m, f"not a Prometheus sample: {line!r}"
        labels = frozenset(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def sample(samples, name: str, **labels) -> float:
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("metrics"), wheels, "2024-02-02")
    run_cli(t["root"], "activate", "p", t["paths"][0], check=True)
    yield t
    t["index"].stop()


def test_last_success_failures_and_profiles_in_the_textfile(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    started = time.time()
    run_cli(root, "gc", check=True)
    run_cli(root, "verify", check=True)
    # a failed pull (the cache holds nothing) and a failed build (an index that cannot be reached)
    assert run_cli(root, "pull", template["names"][0], "--from", f"file://{tmp_path / 'empty'}",
                   "--trusted-key", "k:" + "A" * 43 + "=").returncode in (1, 2)
    bad = write_recipe(tmp_path, 'version = "1.1"', name="bad.toml")
    assert run_cli(root, "build", str(bad), "--index-url", "http://127.0.0.1:9/simple", "--as-of",
                   "2024-08-01").returncode == 1
    # damage: a file of the environment changed -> verify exit 1, a failure, the count of damaged paths
    env = root / "store" / template["names"][0]
    victim = next(p for p in (env / "lib").rglob("*.py"))
    victim.chmod(0o644)
    victim.write_text(victim.read_text() + "# changed\n")
    assert run_cli(root, "verify").returncode == 1
    prom = tmp_path / "llmgw.prom"
    doc = json.loads(run_cli(root, "--json", "stats", "--prometheus", str(prom), check=True).stdout)
    s = parse(prom.read_text())
    now = time.time()
    assert started <= sample(s, "llmgw_store_last_success_timestamp_seconds", op="gc") <= now
    assert sample(s, "llmgw_store_failures_total", op="gc") == 0
    assert sample(s, "llmgw_store_successes_total", op="verify") == 1
    assert sample(s, "llmgw_store_failures_total", op="verify") == 1
    assert sample(s, "llmgw_store_last_failure_timestamp_seconds", op="verify") >= started
    assert sample(s, "llmgw_store_verify_damaged_paths") == 1
    assert sample(s, "llmgw_store_failures_total", op="build") == 1
    assert sample(s, "llmgw_store_last_success_timestamp_seconds", op="pull") == 0  # never
    assert sample(s, "llmgw_store_profile_generation", profile="p") == 1
    assert sample(s, "llmgw_store_profile_info", profile="p", engine="tinyengine", version="1.0", variant="cpu") == 1
    assert doc["operations"]["verify"]["failures"] == 1 and doc["current_generations"][0]["profile"] == "p"


def test_a_dry_run_and_bad_input_are_not_outcomes(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    run_cli(root, "gc", "--dry-run", check=True)
    assert run_cli(root, "gc", "--min-free", "lots").returncode == 2
    ops = json.loads(run_cli(root, "--json", "stats", check=True).stdout)["operations"]
    assert ops["gc"] == {"last_success": 0, "last_failure": 0, "successes": 0, "failures": 0, "damaged": 0}


def _note(root: str, barrier) -> None:
    barrier.wait(timeout=30)
    oplog.note(root, "pull", ok=True)


def test_outcomes_finishing_at_once_all_count(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    ctx = multiprocessing.get_context("spawn")
    n = 8
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_note, args=(str(root), barrier)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert oplog.read_all(oplog.Layout.at(root))["pull"]["successes"] == n


def test_a_record_cut_short_starts_the_counters_again(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    ops = Path(root) / "var" / "ops"
    ops.mkdir(mode=0o700, exist_ok=True)
    (ops / "gc.json").write_text('{"successes": 4, "last_suc')
    run_cli(root, "gc", check=True)
    assert oplog.read_all(oplog.Layout.at(root))["gc"]["successes"] == 1


def test_a_pull_only_node_reports_its_pulls_their_causes_and_its_cache(fleet, tmp_path):
    """A substitute-only node (test_node's fleet: a builder pushed to a file:// cache): what it
    activates counts as op="pull", never op="build"; a failure counts under its cause; the last
    time a cache answered and the bytes fetched are there too."""
    node, env = fleet["node"], fleet["env"]
    a, _, c = fleet["recipes"]
    started = time.time()
    run_cli(node, "activate", "svc", str(a), env=env, check=True)
    assert run_cli(node, "build", str(c), env=env).returncode == 66  # a miss
    run_cli(tmp_path / "k", "keygen", "other", "--out", str(tmp_path / "k2"), check=True)
    untrusting = {**env, "LLMGW_STORE_TRUSTED_KEYS": str(tmp_path / "k2" / "other.public")}
    run_cli(node, "gc", "--keep-dead-for", "0s", check=True)
    assert run_cli(node, "build", str(fleet["recipes"][1]), env=untrusting).returncode == 77
    prom = tmp_path / "node.prom"
    run_cli(node, "stats", "--prometheus", str(prom), check=True)
    s = parse(prom.read_text())
    assert sample(s, "llmgw_store_successes_total", op="pull") == 1
    assert sample(s, "llmgw_store_successes_total", op="build") == 0
    assert started <= sample(s, "llmgw_store_last_success_timestamp_seconds", op="pull") <= time.time()
    assert sample(s, "llmgw_store_failures_total", op="pull") == 2
    assert sample(s, "llmgw_store_failures_by_cause_total", op="pull", cause="miss") == 1
    assert sample(s, "llmgw_store_failures_by_cause_total", op="pull", cause="untrusted") == 1
    assert sample(s, "llmgw_store_failures_total", op="build") == 0
    assert started <= sample(s, "llmgw_store_cache_last_contact_timestamp_seconds") <= time.time()
    assert sample(s, "llmgw_store_cache_fetched_bytes_total") > 0
